"""Filling a PostgreSQL database with settled history for the history run (bench/history.py).

Templates first, through the API: a few hundred jobs over many principals, each with one
succeeded, one dead-lettered and one cancelled occurrence, claimed, authorized and settled by
the kernel, so that every column holds what the code writes. Then ``INSERT ... SELECT`` from
``generate_series`` copies them into ``rows`` occurrences with their events and reservations,
settled over the last 30 days: each column comes from the model's ``_meta`` and is copied from
the template row, except the identity and the times, which are shifted; the budget usage is
then rebuilt from the reservations, so that usage equals reservations in every window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bench.harness import say
from bench.systems import AUTHORITY

JOBS = 200  # history jobs: hist-000 ... hist-199
PRINCIPALS = 50  # their principals: user:hist-0 ... user:hist-49
BENCH_JOBS = 20  # hist-000 ... hist-019 run as the bench's own principal (user:bench)
KINDS = 10
DAYS = 30
CHUNK = 200_000
TEMPLATE_TABLE = "bench_history_templates"


def job_id(n: int) -> str:
    return f"hist-{n:03d}"


def _authority(n: int) -> dict[str, Any]:
    if n < BENCH_JOBS:
        return AUTHORITY
    return {
        "principal": {"type": "user", "id": f"hist-{n % PRINCIPALS}"},
        "requestedCapabilities": ["hist.run"],
    }


def make_templates() -> None:
    """The template rows, through the API, and a table naming them: (job number, status,
    occurrence id, settled_at)."""
    from django.db import connection

    from django_durable_scheduler import kernel
    from django_durable_scheduler.kernel.authority import policies
    from django_durable_scheduler.kernel.claiming import claim_authorized

    for n in range(JOBS):
        if n >= BENCH_JOBS and n < BENCH_JOBS + PRINCIPALS:
            policies.ensure_policy(
                _authority(n), window=timedelta(days=1), max_runs=1_000_000, max_units=1_000_000
            )
        kernel.create_job(job_id(n), f"hist.kind{n % KINDS}", authority=_authority(n), max_attempts=1)
        for status in ("s", "d", "c"):
            kernel.enqueue(job_id(n), scheduled_for=kernel_now(), trigger_key=f"template:{status}")
    for occurrence in _occurrences(trigger_key="template:c"):
        kernel.cancel(occurrence, reason="bench template")
    while True:
        claim = claim_authorized(owner="hist-template", lease=300, limit=100, kinds=_kinds())
        if not claim.claimed:
            break
        for occ in claim.runnable:
            if occ.trigger_key == "template:s":
                kernel.settle(
                    occ.pk, owner="hist-template", fence=occ.fence, outcome="succeeded", result={"sent": 1}
                )
            else:
                error = {"type": "RuntimeError", "message": "boom (bench template)"}
                kernel.settle(occ.pk, owner="hist-template", fence=occ.fence, outcome="failed", error=error)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {TEMPLATE_TABLE}")
        cursor.execute(
            f"CREATE TABLE {TEMPLATE_TABLE} AS SELECT CAST(substr(o.job_id, 6) AS int) AS jn, o.status AS st,"
            " o.occurrence_id, o.settled_at FROM durable_scheduler_occurrences o"
            " WHERE o.job_id LIKE 'hist-%%' AND o.trigger_key LIKE 'template:%%'"
        )
        cursor.execute(f"SELECT st, count(*) FROM {TEMPLATE_TABLE} GROUP BY st ORDER BY st")
        say(f"history templates: {cursor.fetchall()}")


def kernel_now() -> Any:
    from django_durable_scheduler import conf

    return conf.now()


def _kinds() -> list[str]:
    return [f"hist.kind{k}" for k in range(KINDS)]


def _occurrences(trigger_key: str) -> list[str]:
    from django_durable_scheduler.models import Occurrence

    rows = Occurrence.objects.filter(job__job_id__startswith="hist-", trigger_key=trigger_key)
    return list(rows.values_list("pk", flat=True))


def _copy(model: Any, overrides: dict[str, str], shift: str) -> tuple[str, str]:
    """The column list and the select list that copy a row of ``model`` (aliased ``t``):
    every concrete column from ``_meta``, the ``overrides`` (field name -> SQL) as given, each
    other date and time moved by ``shift``, an auto primary key left to its default."""
    from django.db import connection, models

    quote = connection.ops.quote_name
    columns, values = [], []
    for field in model._meta.concrete_fields:
        if field.name in overrides:
            value = overrides[field.name]
        elif isinstance(field, models.AutoField):
            continue
        elif isinstance(field, models.DateTimeField):
            value = f"t.{quote(field.column)} + {shift}"
        else:
            value = f"t.{quote(field.column)}"
        columns.append(quote(field.column))
        values.append(value)
    return f"({', '.join(columns)})", ", ".join(values)


def _series(lo: int, hi: int, total: int) -> str:
    """One row per new occurrence g: its id digest, settle time, template job and status."""
    return f"""
        SELECT g, md5(g::text || 'h') || md5(g::text || 'i') AS h,
          now() - interval '1 hour' - (g::float8 / {total}) * interval '{DAYS} days' AS ts,
          g % {JOBS} AS jn,
          CASE WHEN g % 20 = 0 THEN 'dead_letter' WHEN g % 20 = 1 THEN 'cancelled' ELSE 'succeeded' END AS st
        FROM generate_series({lo}, {hi}) AS g"""


def _statements(lo: int, hi: int, total: int) -> list[tuple[str, str]]:
    """The three copies of one chunk: occurrences, their events (oldest first, so event ids
    follow time) and their reservations (in the window of their new time)."""
    from django_durable_scheduler.models import AuthorityReservation, Event, Occurrence

    shift = "(s.ts - tm.settled_at)"
    source = f"({_series(lo, hi, total)}) AS s JOIN {TEMPLATE_TABLE} tm ON tm.jn = s.jn AND tm.st = s.st"
    new_id = "'occ_' || s.h"
    occ_cols, occ_values = _copy(
        Occurrence,
        {
            "occurrence_id": new_id,
            "idempotency_key": "'scheduler:v1:' || s.h",
            "trigger_key": "'hist:' || s.g",
        },
        shift,
    )
    ev_cols, ev_values = _copy(Event, {"occurrence": new_id}, shift)
    window = (
        f"to_timestamp(floor(extract(epoch FROM t.created_at + {shift}) * 1000 / p.window_ms)"
        " * p.window_ms / 1000.0)"
    )
    res_cols, res_values = _copy(
        AuthorityReservation, {"occurrence": new_id, "window_started_at": window}, shift
    )
    return [
        (
            "occurrences",
            f"INSERT INTO durable_scheduler_occurrences {occ_cols} SELECT {occ_values} FROM {source}"
            " JOIN durable_scheduler_occurrences t ON t.occurrence_id = tm.occurrence_id",
        ),
        (
            "events",
            f"INSERT INTO durable_scheduler_events {ev_cols} SELECT {ev_values} FROM {source}"
            " JOIN durable_scheduler_events t ON t.occurrence_id = tm.occurrence_id"
            " ORDER BY s.g DESC, t.event_id",
        ),
        (
            "reservations",
            f"INSERT INTO durable_scheduler_authority_reservations {res_cols}"
            f" SELECT {res_values} FROM {source}"
            " JOIN durable_scheduler_authority_reservations t ON t.occurrence_id = tm.occurrence_id"
            " JOIN durable_scheduler_authority_policies p ON p.principal_type = t.principal_type"
            " AND p.principal_id = t.principal_id",
        ),
    ]


def rebuild_usage(principal_ids: list[str]) -> None:
    """Usage rows of these principals (user:<id>) recomputed from their reservations: one per
    (revision, window), copied from the principal's newest usage row with its counts."""
    from django.db import connection

    from django_durable_scheduler.models import AuthorityUsage

    ids = ", ".join(f"'{p}'" for p in principal_ids)  # our own constants
    keys = "principal_type, principal_id, policy_revision, window_started_at"
    counted = (
        f"SELECT {keys}, COUNT(*) AS runs, SUM(units) AS units FROM durable_scheduler_authority_reservations"
        f" WHERE principal_type = 'user' AND principal_id IN ({ids}) GROUP BY {keys}"
    )
    cols, values = _copy(
        AuthorityUsage,
        {
            "policy_revision": "r.policy_revision",
            "window_started_at": "r.window_started_at",
            "runs": "r.runs",
            "units": "r.units",
            "updated_at": "now()",
        },
        "interval '0'",
    )
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_history_usage")
        cursor.execute(
            "CREATE TEMP TABLE bench_history_usage AS SELECT DISTINCT ON (principal_type, principal_id) *"
            " FROM durable_scheduler_authority_usage"
            f" WHERE principal_type = 'user' AND principal_id IN ({ids})"
            " ORDER BY principal_type, principal_id, window_started_at DESC"
        )
        cursor.execute(
            "DELETE FROM durable_scheduler_authority_usage"
            f" WHERE principal_type = 'user' AND principal_id IN ({ids})"
        )
        cursor.execute(
            f"INSERT INTO durable_scheduler_authority_usage {cols} SELECT {values} FROM ({counted}) r"
            " JOIN bench_history_usage t"
            " ON t.principal_type = r.principal_type AND t.principal_id = r.principal_id"
        )
        cursor.execute("DROP TABLE bench_history_usage")


def partition_days() -> list[str]:
    """On a fresh database, the events' day partitions for the days the history covers, as a
    running install has them (each day's events in its day, so retention can drop a day whole):
    migration 0005 made one partition of everything before its boundary, which would take every
    back-dated row; empty on a fresh database, it is dropped and the days made in its place."""
    from django.db import connection

    from django_durable_scheduler import conf
    from django_durable_scheduler.housekeeping import partitions

    quote = connection.ops.quote_name
    for part in partitions.partitions(connection.alias):
        if part.start is None and not part.default:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quote(part.name)})")
                if cursor.fetchone()[0]:
                    raise SystemExit(f"{part.name} holds rows: the history needs a fresh database")
                cursor.execute(f"DROP TABLE {quote(part.name)}")
    now = conf.now()
    made = partitions.ensure_days(connection.alias, now - timedelta(days=DAYS + 1), now)
    made += partitions.ensure_ahead(connection.alias, now)
    say(f"history: {len(made)} day partitions made" + (f" ({made[0]} ... {made[-1]})" if made else ""))
    return made


def load(rows: int, progress: Callable[[str], None] = say) -> float:
    """``rows`` settled occurrences with their events and reservations (each day's events in
    their day's partition, after ``partition_days``); the seconds it took."""
    from django.db import connection

    started = time.perf_counter()
    make_templates()
    done = 0
    while done < rows:
        lo, hi = done + 1, min(rows, done + CHUNK)
        for _table, sql in _statements(lo, hi, rows):
            with connection.cursor() as cursor:
                cursor.execute(sql)
        done = hi
        progress(f"  {done:,} of {rows:,} occurrences with their events and reservations")
    rebuild_usage(["bench", *(f"hist-{p}" for p in range(PRINCIPALS))])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return time.perf_counter() - started
