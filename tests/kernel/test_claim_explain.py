"""Every claim statement reads through its index, never by scanning the occurrences table,
over a table shaped like a busy one: 100,000 settled occurrences and 1,000 due ones, spread
over a few principals, with statistics gathered as a real database would have them.

The statements come from ``claim_sql.statements`` by name (with sample arguments) and are
explained as each database plans them: ``EXPLAIN (FORMAT JSON)`` on PostgreSQL, ``EXPLAIN
QUERY PLAN`` on SQLite, ``EXPLAIN`` on MySQL/MariaDB. No planner setting is changed.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

import django_durable_scheduler as scheduler
from django_durable_scheduler import conf
from django_durable_scheduler.db.dialect import in_params, insert
from django_durable_scheduler.kernel import claim_sql
from django_durable_scheduler.models import Event, Job, Occurrence, OccurrenceStatus
from django_durable_scheduler.rules.authority import Principal

from ..conftest import authority_for

SETTLED = 100_000
DUE = 1_000
PRINCIPALS = 10
TABLE = Occurrence._meta.db_table

FAIR = claim_sql.FAIR_INDEX
PRIORITY = claim_sql.PRIORITY_INDEX
CLAIM = claim_sql.CLAIM_INDEX
PRIMARY_KEY = "primary key"

# The index each statement must read the occurrences through. MySQL/MariaDB have the same
# indexes, whole (no partial indexes), and no statements for the priority index.
EXPECTED: dict[str, str] = {
    "principals": FAIR,
    "priority_probe": PRIORITY,
    "queued": FAIR,
    "retry_wait": FAIR,
    "queued_priority_0": FAIR,
    "retry_wait_priority_0": FAIR,
    "prioritized": PRIORITY,
    "reclaims": CLAIM,
    "due": CLAIM,
    "cursor": PRIMARY_KEY,
    "lock": PRIMARY_KEY,
}
ONLY_WITH_PARTIAL_INDEXES = {"priority_probe", "queued_priority_0", "retry_wait_priority_0", "prioritized"}


def _occurrences(job: Job, count: int, prefix: str, **values: Any) -> list[Occurrence]:
    now = values.pop("at")
    rows = []
    for i in range(count):
        at = now - timedelta(seconds=i)
        rows.append(
            Occurrence(
                occurrence_id=f"{prefix}{i}",
                job=job,
                job_revision=1,
                idempotency_key=f"{prefix}{i}",
                trigger_key=f"{prefix}{i}",
                scheduled_for=at,
                available_at=at,
                max_attempts=3,
                authority=job.authority,
                payload={},
                principal_key=Principal.of(job.authority).key,
                created_at=at,
                updated_at=at,
                **values,
            )
        )
    return rows


def _copy(template: Occurrence) -> None:
    """10,000 copies of ``template`` in one statement (a row from each combination of four
    digits), each with its own id, key and trigger: Python-built rows would take a minute."""
    quote = connection.ops.quote_name
    digits = "(" + " UNION ALL ".join(f"SELECT {d} AS d" for d in range(10)) + ")"
    numbered = ("t.{}", "'-'", "a.d", "b.d", "c.d", "e.d")
    columns, values = [], []
    for field in Occurrence._meta.concrete_fields:
        column = quote(field.column)
        columns.append(column)
        if field.name in ("occurrence_id", "idempotency_key", "trigger_key"):
            parts = [part.format(column) for part in numbered]
            values.append(
                " || ".join(parts) if connection.vendor == "sqlite" else f"CONCAT({', '.join(parts)})"
            )
        else:
            values.append(f"t.{column}")
    sql = (
        f"INSERT INTO {quote(TABLE)} ({', '.join(columns)}) SELECT {', '.join(values)}"
        f" FROM {quote(TABLE)} t CROSS JOIN {digits} a CROSS JOIN {digits} b"
        f" CROSS JOIN {digits} c CROSS JOIN {digits} e WHERE t.{quote('occurrence_id')} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [template.pk])
    template.delete()


@pytest.fixture
def busy_table(clock):
    """SETTLED succeeded occurrences from an hour ago and DUE queued ones, over PRINCIPALS
    principals (one job each), then the statistics gathered."""
    now = clock()
    for n in range(PRINCIPALS):
        job = scheduler.create_job(f"job-{n}", "k", authority=authority_for(f"p{n}", "x.run"))
        (template,) = _occurrences(
            job,
            1,
            f"s{n}-",
            at=now - timedelta(hours=1),
            status=OccurrenceStatus.SUCCEEDED,
            attempt=1,
            fence=1,
            settled_at=now - timedelta(hours=1),
        )
        template.save()
        _copy(template)
        insert(
            "default", _occurrences(job, DUE // PRINCIPALS, f"d{n}-", at=now, status=OccurrenceStatus.QUEUED)
        )
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            tables = ", ".join(connection.ops.quote_name(m._meta.db_table) for m in (Occurrence, Job, Event))
            cursor.execute(f"ANALYZE TABLE {tables}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")
    assert Occurrence.objects.count() == SETTLED + DUE


def _explain_postgresql(sql: str, params: Any) -> tuple[list[str], list[str]]:
    """(index names read on the occurrences table, scans of it) of the plan."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        (raw,) = cursor.fetchone()
    plan = raw if isinstance(raw, list) else json.loads(raw)
    indexes, scans = [], []
    nodes = [plan[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node.get("Relation Name") != TABLE:
            continue
        if node["Node Type"] == "Seq Scan":
            scans.append(node["Node Type"])
        elif "Index Name" in node:
            name = node["Index Name"]
            indexes.append(PRIMARY_KEY if name.endswith(("_pkey", "_like")) else name)
    return indexes, scans


def _explain_sqlite(sql: str, params: Any) -> tuple[list[str], list[str]]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        details = [str(row[-1]) for row in cursor.fetchall()]
    indexes, scans = [], []
    for detail in details:
        if not re.match(rf"(SEARCH|SCAN) {TABLE}\b", detail):
            continue
        found = re.search(r"USING (?:COVERING )?INDEX (\w+)", detail)
        if found:
            indexes.append(found.group(1))
        elif "PRIMARY KEY" in detail:
            indexes.append(PRIMARY_KEY)
        # A scan of a partial index reads only the waiting rows it holds, never the table;
        # a scan of anything else reads the whole table.
        if detail.startswith("SCAN") and not (found and found.group(1) in (FAIR, PRIORITY)):
            scans.append(detail)
    indexes = [PRIMARY_KEY if name.startswith("sqlite_autoindex") else name for name in indexes]
    return indexes, scans


def _explain_mysql(sql: str, params: Any) -> tuple[list[str], list[str]]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    indexes, scans = [], []
    for row in rows:
        if row["table"] != TABLE:
            continue
        if row["type"] == "ALL" or row["key"] is None:
            scans.append(f"type {row['type']}, key {row['key']}")
        else:
            indexes.append(PRIMARY_KEY if row["key"] == "PRIMARY" else row["key"])
    return indexes, scans


# ANALYZE TABLE commits on MySQL/MariaDB: the test cannot run inside a rolled-back transaction.
@pytest.mark.django_db(transaction=True)
def test_every_claim_statement_reads_through_its_index(busy_table):
    explain = {"postgresql": _explain_postgresql, "sqlite": _explain_sqlite, "mysql": _explain_mysql}
    expected = dict(EXPECTED)
    if connection.vendor == "mysql":
        expected = {name: index for name, index in EXPECTED.items() if name not in ONLY_WITH_PARTIAL_INDEXES}
        expected["principals"] = CLAIM  # grouped through the claim index: there is no loose scan
    statements = claim_sql.statements()
    assert sorted(statements) == sorted(expected)
    problems = []
    for name, (sql, params) in statements.items():
        indexes, scans = explain[connection.vendor](sql, params)
        if scans or expected[name] not in indexes:
            problems.append(
                f"[{name}] reads {TABLE} by {indexes}, scans {scans}, not {expected[name]}:\n{sql}"
            )
    assert not problems, "\n\n".join(problems)

    # The statements explained are the ones that claim: a fair batch of the due rows.
    rows = scheduler.claim_batch(owner="explain", lease=30, limit=PRINCIPALS, sweep_expired=False)
    assert len({row.principal_key for row in rows}) == PRINCIPALS
    assert all(row.status == OccurrenceStatus.RUNNING and row.pk.startswith("d") for row in rows)


LOCKED_BATCH = 250  # ids locked at once: a worker's claim of a large batch


@pytest.fixture
def stale_statistics(clock):
    """SETTLED succeeded occurrences, analyzed while nothing waits; then DUE queued ones that
    the statistics never see, as before autovacuum analyzes a table that filled up."""
    now = clock()
    job = scheduler.create_job("job-stale", "k", authority=authority_for("p-stale", "x.run"))
    (template,) = _occurrences(
        job,
        1,
        "s-",
        at=now - timedelta(hours=1),
        status=OccurrenceStatus.SUCCEEDED,
        attempt=1,
        fence=1,
        settled_at=now - timedelta(hours=1),
    )
    template.save()
    _copy(template)
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {connection.ops.quote_name(TABLE)}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")
    due = _occurrences(job, DUE, "d-", at=now, status=OccurrenceStatus.QUEUED)
    insert("default", due)
    return [row.pk for row in due[:LOCKED_BATCH]]


@pytest.mark.django_db(transaction=True)
def test_the_lock_reads_the_primary_key_whatever_the_statistics(stale_statistics):
    """The locking statement of a large batch reads through the primary key alone, also when
    the statistics say that nothing waits. At 2 million rows (bench/history.py) PostgreSQL then
    read the fair and claim indexes in a bitmap while the status terms stood beside the key; at
    this size it reads the key either way, so the statement's form is checked too: the key is
    its only condition outside the CASE that re-checks the due state."""
    explain = {"postgresql": _explain_postgresql, "sqlite": _explain_sqlite, "mysql": _explain_mysql}
    sql = claim_sql.lock_statement("default", connection.vendor, LOCKED_BATCH)
    now = connection.ops.adapt_datetimefield_value(conf.now())
    params = [*in_params(connection, stale_statistics), now, now]
    indexes, scans = explain[connection.vendor](sql, params)
    assert indexes == [PRIMARY_KEY] and not scans, (indexes, scans, sql)
    key = re.escape(connection.ops.quote_name("occurrence_id"))
    ids = r"= ANY\(%s\)" if connection.vendor == "postgresql" else r"IN \([^)]*\)"
    assert re.search(rf"WHERE \S*{key} {ids}\s+AND CASE WHEN .* END\s*(FOR UPDATE|$)", sql, re.S), sql
    rows = list(Occurrence.objects.raw(sql, params))
    assert sorted(row.pk for row in rows) == sorted(stale_statistics)
