"""The scheduler's operations for tests/test_schema_change.py, run in a subprocess against the
scratch database, with whichever code ``PYTHONPATH`` puts first (the repository's, or the
test's copy with edited models). ``python -m tests.procs.schema_steps seed|new|old`` prints
one line ``RESULT <json>``: what the test asserts on."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from typing import Any

import django

BASE_MS = 1_700_000_000_000
AUTHORITY = {
    "schemaVersion": 1,
    "principal": {"type": "user", "id": "alice"},
    "requestedCapabilities": ["reports.send"],
}
OCC_TABLE = "durable_scheduler_occurrences"
TABLES = ("durable_scheduler_jobs", OCC_TABLE, "durable_scheduler_events")


def schema() -> dict:
    """Columns of the three tables, the size of jobs.kind, the names of occurrences' indexes."""
    from django.db import connection

    with connection.cursor() as cursor:
        intro = connection.introspection
        columns = {t: sorted(c.name for c in intro.get_table_description(cursor, t)) for t in TABLES}
        kind = next(c for c in intro.get_table_description(cursor, TABLES[0]) if c.name == "kind")
        indexes = sorted(n for n, c in intro.get_constraints(cursor, OCC_TABLE).items() if c["index"])
    return {"columns": columns, "kind_size": kind.internal_size or kind.display_size, "indexes": indexes}


def statuses(ids) -> dict[str, str]:
    from django_durable_scheduler.models import Occurrence

    return dict(Occurrence.objects.filter(pk__in=list(ids)).values_list("pk", "status"))


def seed() -> dict:
    import django_durable_scheduler as scheduler

    scheduler.set_policy(
        "user", "alice", capabilities=["reports.send"], window=3600, max_runs=1000, max_units=1000
    )
    scheduler.create_job("job-a", "reports.send", authority=AUTHORITY, payload={"n": 1})
    for i in range(6):
        scheduler.enqueue("job-a", scheduled_for=BASE_MS + i, trigger_key=f"t{i}")
    done, dead, held = scheduler.claim_batch(owner="w-seed", lease=3600, limit=3)
    scheduler.settle(done.pk, owner="w-seed", fence=done.fence, outcome="succeeded", result={"phase": "seed"})
    scheduler.settle(
        dead.pk, owner="w-seed", fence=dead.fence, outcome="failed", error="boom", retryable=False
    )
    now = statuses([done.pk, dead.pk, held.pk])
    return {"statuses": [now[done.pk], now[dead.pk], now[held.pk]], "schema": schema()}


def exercise(tag: str) -> dict:
    """enqueue (a job read, then the remembered job's path: a new row and a duplicate),
    enqueue_many (49 new and one duplicate of a row from before the migration), a new job,
    claim_batch, claim, settle (succeeded, failed for good, failed to retry), and the rows
    leased before the migration settled."""
    import django_durable_scheduler as scheduler
    from django_durable_scheduler.models import Event, Job, Occurrence

    facts: dict = {"module": scheduler.__file__, "schema": schema()}
    facts["before"] = {"occurrences": Occurrence.objects.count(), "events": Event.objects.count()}
    first_event = Event.objects.order_by("-event_id").values_list("event_id", flat=True).first() or 0
    inserted = enqueue_steps(tag, facts)
    enqueued = list(
        Event.objects.filter(event_id__gt=first_event, event_type="occurrence_enqueued").values_list(
            "occurrence_id", flat=True
        )
    )
    facts["enqueued_events"] = {"count": len(enqueued), "for_inserted_rows": set(enqueued) == inserted}
    claim_and_settle_steps(f"w-{tag}", tag, facts)
    facts["after"] = {
        "occurrences": Occurrence.objects.count(),
        "statuses": dict(Counter(Occurrence.objects.values_list("status", flat=True))),
        "events": Event.objects.count(),
        "jobs": Job.objects.count(),
    }
    facts.update(edited_columns(tag, inserted, first_event))
    return facts


def enqueue_steps(tag: str, facts: dict[str, Any]) -> set[str]:
    """enqueue, enqueue_many and a new job's first enqueue; the ids of the rows they inserted."""
    import django_durable_scheduler as scheduler
    from django_durable_scheduler.db import guarded
    from django_durable_scheduler.kernel import enqueuing
    from django_durable_scheduler.models import Occurrence

    one, d1 = scheduler.enqueue("job-a", scheduled_for=BASE_MS + 1000, trigger_key=f"{tag}-1")
    remembered = ("default", "job-a") in enqueuing._REMEMBERED
    two, d2 = scheduler.enqueue("job-a", scheduled_for=BASE_MS + 1001, trigger_key=f"{tag}-2")
    again, d3 = scheduler.enqueue("job-a", scheduled_for=BASE_MS + 1000, trigger_key=f"{tag}-1")
    facts["enqueue"] = {
        "deduplicated": [d1, d2, d3],
        "same_row": again.pk == one.pk,
        "remembered": remembered,
        "guarded_insert": guarded.supports_guarded_insert("default"),
    }
    items = [{"scheduled_for": BASE_MS + 2000 + i, "trigger_key": f"{tag}-m{i}"} for i in range(49)]
    items.insert(17, {"scheduled_for": BASE_MS, "trigger_key": "t0"})  # seeded before the migration
    many = scheduler.enqueue_many("job-a", items)
    seeded_t0 = Occurrence.objects.get(job_id="job-a", trigger_key="t0").pk
    facts["enqueue_many"] = {
        "deduplicated": [i for i, (_, dedup) in enumerate(many) if dedup],
        "duplicate_is_seeded_row": many[17][0].pk == seeded_t0,
        "distinct": len({occ.pk for occ, _ in many}),
    }
    scheduler.create_job(f"job-{tag}", "reports.send", authority=AUTHORITY)
    other, d4 = scheduler.enqueue(f"job-{tag}", scheduled_for=BASE_MS + 3000, trigger_key="x")
    facts["other_job_deduplicated"] = d4
    inserted = {one.pk, two.pk, other.pk} | {occ.pk for occ, dedup in many if not dedup}
    facts["inserted"] = len(inserted)
    return inserted


def claim_and_settle_steps(owner: str, tag: str, facts: dict[str, Any]) -> None:
    """claim_batch and claim; settle three of the batch and the single one three ways; then
    settle the rows leased before the migration, by their owners."""
    import django_durable_scheduler as scheduler
    from django_durable_scheduler.models import Occurrence

    leased_before = list(
        Occurrence.objects.filter(status="running").values_list("pk", "lease_owner", "fence")
    )
    batch = scheduler.claim_batch(owner=owner, lease=3600, limit=10)
    single = scheduler.claim(owner=owner, lease=3600)
    claimed = [*batch, single]
    facts["claimed"] = {
        "batch": len(batch),
        "single": single is not None,
        "distinct": len({o.pk for o in claimed}),
    }
    facts["claimed_running"] = Counter(statuses(o.pk for o in claimed).values()) == {"running": len(claimed)}
    ok, dead, retry = batch[:3]
    later = int(time.time() * 1000) + 86_400_000  # not due again while the test runs
    scheduler.settle(ok.pk, owner=owner, fence=ok.fence, outcome="succeeded", result={"phase": tag})
    scheduler.settle(dead.pk, owner=owner, fence=dead.fence, outcome="failed", error="boom", retryable=False)
    scheduler.settle(
        retry.pk, owner=owner, fence=retry.fence, outcome="failed", error="again", retry_at=later
    )
    scheduler.settle(single.pk, owner=owner, fence=single.fence, outcome="succeeded", result={"phase": tag})
    settled = statuses([ok.pk, dead.pk, retry.pk, single.pk])
    facts["settled"] = [settled[ok.pk], settled[dead.pk], settled[retry.pk], settled[single.pk]]
    facts["result"] = Occurrence.objects.get(pk=ok.pk).result
    for pk, lease_owner, fence in leased_before:
        scheduler.settle(pk, owner=lease_owner, fence=fence, outcome="succeeded", result={"by": lease_owner})
    facts["leased_before"] = {
        "owners": sorted({lease_owner for _, lease_owner, _ in leased_before}),
        "statuses": sorted(set(statuses(pk for pk, _, _ in leased_before).values())),
        "count": len(leased_before),
    }


def edited_columns(tag: str, inserted: set[str], first_event: int) -> dict[str, Any]:
    """The columns of the edited models, where they exist: their values in the rows written in
    this phase and in all rows."""
    from django_durable_scheduler.models import Event, Job, Occurrence

    facts: dict[str, Any] = {}
    for model, field, mine in (
        (Occurrence, "urgency", Occurrence.objects.filter(pk__in=inserted)),
        (Occurrence, "lane", Occurrence.objects.filter(pk__in=inserted)),
        (Job, "team", Job.objects.filter(pk=f"job-{tag}")),
        (Event, "source", Event.objects.filter(event_id__gt=first_event)),
    ):
        if any(f.name == field for f in model._meta.get_fields()):
            facts[field] = {
                "new_rows": sorted(set(mine.values_list(field, flat=True))),
                "new_count": mine.count(),
                "all_rows": sorted(set(model.objects.values_list(field, flat=True))),
            }
    return facts


# Far after the partitions migrate makes, a month apart for each phase: every phase makes its
# own partitions, after the schema change (or its rollback).
PARTITION_DAYS = {"new": (2032, 1, 10), "old": (2032, 2, 10)}


def partition_steps(tag: str) -> dict[str, Any]:
    """PostgreSQL's partitioned events table: a row the default partition catches, partitions
    made after the change (taking that row if it is theirs), a row in one of them; where each
    row is, what it reads back as, and whether each partition has the edited model's index."""
    from datetime import UTC, datetime, timedelta

    from django.db import connection

    from django_durable_scheduler.housekeeping import partitions
    from django_durable_scheduler.models import Event

    if not partitions.is_partitioned("default"):
        return {}
    day = datetime(*PARTITION_DAYS[tag], 12, tzinfo=UTC)
    caught = Event.objects.create(job_id="job-a", event_type="caught", occurred_at=day + timedelta(days=1))
    late = Event.objects.create(job_id="job-a", event_type="late", occurred_at=day + timedelta(days=20))
    made = partitions.ensure_ahead("default", day)
    new = Event.objects.create(job_id="job-a", event_type="new", occurred_at=day + timedelta(hours=1))
    rows = {row.pk: row for row in Event.objects.filter(pk__in=[caught.pk, late.pk, new.pk])}
    table = Event._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT event_id, tableoid::regclass::text FROM {table} WHERE event_id = ANY(%s)", [list(rows)]
        )
        where = dict(cursor.fetchall())
        cursor.execute(
            "SELECT tablename FROM pg_indexes WHERE indexdef LIKE %s AND tablename LIKE %s",
            ["%(event_type, occurred_at)%", f"{table}_p%"],
        )
        indexed = {name for (name,) in cursor.fetchall()}
    names = {"caught": caught.pk, "late": late.pk, "new": new.pk}
    return {
        "made": made,
        "where": {name: where[pk] for name, pk in names.items()},
        "read": {name: rows[pk].event_type for name, pk in names.items()},
        "source": sorted({getattr(row, "source", None) for row in rows.values()}, key=str),
        "indexed": {name: name in indexed for name in (*made, partitions.default_name())},
    }


def main() -> None:
    django.setup()
    step = sys.argv[1]
    facts = seed() if step == "seed" else {**exercise(step), "partitions": partition_steps(step)}
    print("RESULT " + json.dumps(facts, default=str), flush=True)


if __name__ == "__main__":
    main()
