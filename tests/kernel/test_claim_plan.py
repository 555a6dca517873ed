"""The claim reads occurrences through its index, never by scanning the table.

A few thousand terminal occurrences (what a busy table is mostly made of), a few hundred waiting
for a later time (future enqueues, retries in back-off) and a few due ones,
then ``ANALYZE`` so that the planner knows the proportions: with real statistics the cheapest plan
for the claim's queries is the claim index (``status`` first), not a scan. No planner settings are
changed (no ``enable_seqscan = off``): the test checks the plan the database really chooses.

Every statement that ``kernel.claim_batch`` sends to the occurrences table is captured with
``CaptureQueriesContext`` and explained (``EXPLAIN`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on
SQLite). None may scan the occurrences table, and each must use the index made for it:

- the list of principals with work: a loose index scan over ``dsch_occurrences_fair`` (a
  recursive query jumping from one principal to the next), and the principals of expired
  leases through an index on ``status``;
- the expired leases (reclaims) and the dead-letter sweep: an index that starts with
  ``status``: ``dsch_occurrences_claim`` or ``dsch_occurrences_settled`` (status, settled_at),
  which PostgreSQL 15 prefers for some arms (a BitmapOr of ``status`` conditions, filtering
  ``available_at`` afterwards);
- the fair pool (each principal's first due rows): ``dsch_occurrences_fair`` (principal,
  status, due time), one index range per arm, in due order;
- the locking query and the update: the claim index or the primary key.

MariaDB/MySQL are skipped: their optimizer picks scans for small tables whatever the
statistics say.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Occurrence, OccurrenceStatus
from django_durable_scheduler.rules.authority import Principal
from django_durable_scheduler.rules.identity import derive_occurrence_identity
from django_durable_scheduler.rules.validation import to_ms

pytestmark = pytest.mark.django_db

TABLE = "durable_scheduler_occurrences"
CLAIM_INDEX = "dsch_occurrences_claim"
STATUS_INDEX = "dsch_occurrences_settled"  # (status, settled_at)
FAIR_INDEX = "dsch_occurrences_fair"  # (principal_key, status, available_at, ...)
PRIORITY_INDEX = "dsch_occurrences_priority"  # waiting rows whose priority is not 0
TERMINAL = 4000
QUEUED = 40  # due now
WAITING = 400  # queued or retry_wait, due later (future enqueues, retry back-off)


def _terminal_rows(job, now):
    """TERMINAL settled occurrences over the past days: 90 % succeeded, 5 % dead, 5 % cancelled."""
    rows = []
    for i in range(TERMINAL):
        at = now - timedelta(hours=1, seconds=30 * i)
        status = (
            OccurrenceStatus.DEAD_LETTER
            if i % 20 == 0
            else OccurrenceStatus.CANCELLED
            if i % 20 == 1
            else OccurrenceStatus.SUCCEEDED
        )
        identity = derive_occurrence_identity(job.job_id, 1, to_ms(at, "at"), f"old:{i}")
        attempt = 0 if status == OccurrenceStatus.CANCELLED else 1
        rows.append(
            Occurrence(
                occurrence_id=identity.occurrence_id,
                job=job,
                job_revision=1,
                idempotency_key=identity.idempotency_key,
                trigger_key=f"old:{i}",
                scheduled_for=at,
                available_at=at,
                status=status,
                attempt=attempt,
                max_attempts=3,
                fence=attempt,
                authority=job.authority,
                payload={"n": i},
                result={"sent": i} if status == OccurrenceStatus.SUCCEEDED else None,
                last_error=None if status == OccurrenceStatus.SUCCEEDED else {"message": "boom"},
                principal_key=Principal.of(job.authority).key,
                created_at=at,
                updated_at=at + timedelta(seconds=1),
                settled_at=at + timedelta(seconds=1),
            )
        )
    return rows


def _explain(sql: str) -> str:
    prefix = "EXPLAIN " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
    with connection.cursor() as cursor:
        cursor.execute(prefix + sql)
        rows = cursor.fetchall()
    if connection.vendor == "postgresql":
        return "\n".join(row[0] for row in rows)
    return "\n".join(str(row[-1]) for row in rows)


def _scans_occurrences(plan: str) -> bool:
    if connection.vendor == "postgresql":
        return re.search(rf"Seq Scan on {TABLE}\b", plan) is not None
    # SQLite: "SCAN <table>" reads every row; "SEARCH <table> USING INDEX ..." does not. A full
    # pass over an index ("SCAN <table> USING INDEX") is a scan too.
    return re.search(rf"\bSCAN {TABLE}\b", plan) is not None


def _pk_index(plan: str) -> bool:
    if connection.vendor == "postgresql":
        # The primary key, or the varchar_pattern_ops twin Django adds for a CharField key.
        return re.search(rf"{TABLE}_(pkey|occurrence_id_\w+_like)\b", plan) is not None
    return re.search(rf"sqlite_autoindex_{TABLE}_\d+|USING (INTEGER )?PRIMARY KEY", plan) is not None


def _claim_statements(captured):
    """(kind, sql) of each statement on the occurrences table: principals, pool, reclaims,
    sweep, lock or update."""
    out = []
    for query in captured:
        sql = query["sql"]
        head = sql.lstrip().upper()
        if f'"{TABLE}"' not in sql and f" {TABLE} " not in sql:
            continue
        upper = sql.upper()
        if head.startswith("UPDATE") or (head.startswith("WITH") and " AS (UPDATE " in upper):
            out.append(("update", sql))  # on PostgreSQL, sent with the events' insert
        elif head.startswith("SELECT 1 FROM") and "PRIORITY" in upper:
            out.append(("prioritized", sql))  # candidates.has_prioritized
        elif not head.startswith(("SELECT", "WITH", "(")):
            continue
        elif "DISTINCT" in upper or "RECURSIVE" in upper or "GROUP BY" in upper:
            out.append(("principals", sql))
        elif '"OCCURRENCE_ID" IN (' in upper:
            out.append(("lock", sql))
        elif '"PRINCIPAL_KEY" =' in upper:
            out.append(("pool", sql))
        elif "MAX_ATTEMPTS" in upper and ">=" in sql:
            out.append(("sweep", sql))
        elif "'RUNNING'" in upper and "LIMIT" in upper:
            out.append(("reclaims", sql))
        else:
            out.append(("lock", sql))
    return out


def test_claim_uses_the_claim_index(job, clock):
    if connection.vendor not in ("postgresql", "sqlite"):
        pytest.skip(f"plan assertions are for PostgreSQL and SQLite, not {connection.vendor}")
    now = clock()
    Occurrence.objects.bulk_create(_terminal_rows(job, now), batch_size=500)
    scheduler.enqueue_many(
        job.job_id,
        [{"scheduled_for": now - timedelta(seconds=i), "trigger_key": f"due:{i}"} for i in range(QUEUED)]
        + [
            {"scheduled_for": now + timedelta(minutes=1 + i), "trigger_key": f"later:{i}"}
            for i in range(WAITING)
        ],
    )
    # Half of the waiting ones are retries: retry_wait with a back-off time, attempt 1.
    later = Occurrence.objects.filter(trigger_key__startswith="later:").order_by("pk")[: WAITING // 2]
    Occurrence.objects.filter(pk__in=[o.pk for o in later]).update(
        status=OccurrenceStatus.RETRY_WAIT, attempt=1
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")

    with CaptureQueriesContext(connection) as ctx:
        claimed = scheduler.claim_batch(owner="plan", lease=30, limit=4)
    assert len(claimed) == 4

    statements = _claim_statements(ctx.captured_queries)
    kinds = [kind for kind, _ in statements]
    assert {"principals", "pool", "lock", "update"} <= set(kinds), f"claim queries on {TABLE}: {kinds}"
    report = []
    for kind, sql in statements:
        plan = _explain(sql)
        report.append(f"[{kind}] {sql}\n{plan}")
        if kind == "prioritized":
            # Whether any waiting row has a priority: the first entry of the partial index
            # that holds only those rows (a scan of it stops at its first row).
            assert PRIORITY_INDEX in plan, f"the priority probe does not use {PRIORITY_INDEX}:\n{sql}\n{plan}"
            continue
        scanned = plan
        if kind == "principals" and PRIORITY_INDEX in sql:
            # The priority probe read with the principals (PostgreSQL, SQLite): the first entry
            # of the partial index that holds only prioritized rows, as on its own above.
            assert PRIORITY_INDEX in plan, f"the priority probe does not use {PRIORITY_INDEX}:\n{sql}\n{plan}"
            scanned = "\n".join(line for line in plan.splitlines() if PRIORITY_INDEX not in line)
        assert not _scans_occurrences(scanned), f"{kind} query scans {TABLE}:\n{sql}\n{plan}"
        if kind == "principals" and "RECURSIVE" in sql.upper():
            assert FAIR_INDEX in plan, f"the loose index scan does not use {FAIR_INDEX}:\n{sql}\n{plan}"
        elif kind == "principals":
            assert CLAIM_INDEX in plan or STATUS_INDEX in plan, (
                f"principals query uses no index on status:\n{sql}\n{plan}"
            )
        elif kind in ("reclaims", "sweep"):
            # Either index that starts with status serves (see the module docstring).
            assert CLAIM_INDEX in plan or STATUS_INDEX in plan, (
                f"{kind} query uses no index on status:\n{sql}\n{plan}"
            )
        elif kind == "pool":
            assert FAIR_INDEX in plan, f"pool query does not use {FAIR_INDEX}:\n{sql}\n{plan}"
        else:
            assert CLAIM_INDEX in plan or _pk_index(plan), (
                f"{kind} query uses neither {CLAIM_INDEX} nor the primary key:\n{sql}\n{plan}"
            )
    print("\n\n".join(report))  # shown with pytest -s


def test_claim_uses_the_fair_index_for_a_backlog_without_statistics(job, clock):
    """A deep backlog of one principal and no ANALYZE (SQLite never runs it by itself): the
    list of principals and each principal's first rows must still come from the fair index,
    one probe each, not from an index on ``status`` alone, which walks the whole backlog.
    (SQLite without statistics used to choose exactly that: the cost of every claim grew
    with the backlog.)"""
    if connection.vendor not in ("postgresql", "sqlite"):
        pytest.skip(f"plan assertions are for PostgreSQL and SQLite, not {connection.vendor}")
    now = clock()
    scheduler.enqueue_many(
        job.job_id,
        [{"scheduled_for": now - timedelta(seconds=i), "trigger_key": f"b:{i}"} for i in range(1500)],
    )
    with CaptureQueriesContext(connection) as ctx:
        claimed = scheduler.claim_batch(owner="plan", lease=30, limit=8, sweep_expired=False)
    assert len(claimed) == 8
    statements = _claim_statements(ctx.captured_queries)
    checked = 0
    for kind, sql in statements:
        plan = _explain(sql)
        if kind == "principals" and "RECURSIVE" in sql.upper():
            # Before the UNION ALL: the loose scan and each principal's first due times.
            waiting_part = plan.split("UNION ALL")[0]
            if connection.vendor == "sqlite":
                searches = [line for line in waiting_part.splitlines() if f"SEARCH {TABLE}" in line]
                assert searches and all(FAIR_INDEX in line for line in searches), plan
            else:
                assert FAIR_INDEX in waiting_part and not _scans_occurrences(waiting_part), plan
            checked += 1
        elif kind == "pool":
            arms = len(re.findall(r'"principal_key" = ', sql))
            assert arms >= 2 and plan.count(FAIR_INDEX) >= arms, f"{arms} arms:\n{sql}\n{plan}"
            assert not _scans_occurrences(plan), plan
            checked += 1
    assert checked == 2, [kind for kind, _ in statements]


def test_claim_reads_prioritized_rows_through_the_priority_index(job, clock):
    """A backlog of priority 0 and a few prioritized rows (django.tasks' priority): the pool
    reads each principal's priority-0 rows through the fair index and its prioritized rows
    through the partial priority index, highest first, without scanning the table."""
    if connection.vendor not in ("postgresql", "sqlite"):
        pytest.skip(f"plan assertions are for PostgreSQL and SQLite, not {connection.vendor}")
    now = clock()
    scheduler.enqueue_many(
        job.job_id,
        [{"scheduled_for": now - timedelta(seconds=i), "trigger_key": f"b:{i}"} for i in range(1500)]
        + [{"scheduled_for": now + timedelta(minutes=5), "trigger_key": "future"}],
    )
    newest = list(Occurrence.objects.order_by("-scheduled_for").values_list("pk", flat=True)[:4])
    future, *prioritized = newest  # the future one would win on priority if it were due
    Occurrence.objects.filter(pk=future).update(priority=100)
    for priority, pk in zip((5, 50, -5), prioritized, strict=True):
        Occurrence.objects.filter(pk=pk).update(priority=priority)
    with CaptureQueriesContext(connection) as ctx:
        claimed = scheduler.claim_batch(owner="plan", lease=30, limit=3, sweep_expired=False)
    assert [o.pk for o in claimed][:2] == [prioritized[1], prioritized[0]]
    assert prioritized[2] not in [o.pk for o in claimed]  # -5: after the priority-0 backlog
    pools = [sql for kind, sql in _claim_statements(ctx.captured_queries) if kind == "pool"]
    assert pools
    for sql in pools:
        plan = _explain(sql)
        assert not _scans_occurrences(plan), f"pool query scans {TABLE}:\n{sql}\n{plan}"
        assert FAIR_INDEX in plan and PRIORITY_INDEX in plan, f"pool query:\n{sql}\n{plan}"
