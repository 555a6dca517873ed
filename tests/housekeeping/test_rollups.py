"""Outcome counts per hour (rollups.py): the same figures as an aggregate over the occurrences,
for any range, with hours that are over counted once and read back, the hour in progress and
the last minutes of the hour before (a late clock may still settle there) counted live."""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.housekeeping import partitions, rollups
from django_durable_scheduler.housekeeping.retention import thread as retention_thread
from django_durable_scheduler.housekeeping.retention.thread import RetentionThread
from django_durable_scheduler.models import TERMINAL_STATUSES, Event, Occurrence, OutcomeCount

from .test_partitions import FUTURE, layout  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def settle_some(clock, rng: random.Random, hours: int) -> None:
    """Occurrences of two kinds settled at random moments over the last ``hours``: succeeded,
    dead-lettered or cancelled."""
    scheduler.create_job("mail", "mail.send")
    scheduler.create_job("sync", "crm.sync")
    end = clock()
    clock.advance(hours=-hours)
    n = 0
    while clock() < end:
        clock.advance(minutes=rng.uniform(1, 50))
        n += 1
        job_id = rng.choice(["mail", "sync"])
        occurrence, _ = kernel.enqueue(job_id, scheduled_for=clock(), trigger_key=f"t{n}")
        if rng.random() < 0.15:
            kernel.cancel(occurrence.pk, reason="test")
            continue
        held = kernel.claim(owner="w", lease=60)
        assert held is not None and held.pk == occurrence.pk
        policy = scheduler.get_policy("app", "durable_scheduler")
        scheduler.reserve_authority(held.pk, policy_revision=policy.revision)
        if rng.random() < 0.8:
            kernel.settle(held.pk, owner="w", fence=held.fence, outcome="succeeded")
        else:
            kernel.settle(held.pk, owner="w", fence=held.fence, outcome="failed", retryable=False)
    clock.set(end)


def direct(start, end) -> Counter:
    rows = (
        Occurrence.objects.filter(status__in=TERMINAL_STATUSES, settled_at__gte=start, settled_at__lt=end)
        .values_list("job__kind", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return Counter({(kind, status): n for kind, status, n in rows})


def test_the_counts_are_the_aggregate_of_any_range(clock):
    rng = random.Random(7)
    settle_some(clock, rng, hours=30)
    now = clock()
    ranges = [(now - timedelta(days=1), now), (now - timedelta(hours=1), now)]
    for _ in range(12):
        start = now - timedelta(minutes=rng.uniform(0, 30 * 60))
        end = start + timedelta(minutes=rng.uniform(0, 20 * 60))
        ranges.append((start, min(end, now)))
    for start, end in ranges:
        assert rollups.outcomes(start, end, alias="default") == direct(start, end), (start, end)
    assert direct(now - timedelta(days=1), now), "the test settles nothing in the last day"


def test_hours_that_are_over_are_counted_once(clock):
    settle_some(clock, random.Random(11), hours=26)
    now = clock()  # 12:00
    first = rollups.outcomes(now - timedelta(days=1), now, alias="default")
    marks = set(OutcomeCount.objects.filter(kind="").values_list("hour", flat=True))
    # 24 hours from 12:00 yesterday; 11:00-12:00 ended less than SETTLE_MARGIN ago: still live.
    assert len(marks) == 23 and max(marks) == now - timedelta(hours=2)
    with CaptureQueriesContext(connection) as queries:
        again = rollups.outcomes(now - timedelta(days=1), now, alias="default")
    assert again == first
    # The marks, the counted hours, the hour still open and its jobs' kinds: nothing is counted again.
    assert len(queries) == 4, [q["sql"] for q in queries]
    clock.advance(minutes=rollups.SETTLE_MARGIN.total_seconds() / 60)
    rollups.outcomes(now - timedelta(days=1), now, alias="default")
    marks = set(OutcomeCount.objects.filter(kind="").values_list("hour", flat=True))
    assert max(marks) == now - timedelta(hours=1)


def test_an_hour_without_runs_is_marked_counted(clock):
    scheduler.create_job("mail", "mail.send")
    now = clock()
    assert rollups.outcomes(now - timedelta(hours=6), now, alias="default") == Counter()
    assert OutcomeCount.objects.filter(kind="").count() == 5
    assert not OutcomeCount.objects.exclude(kind="").exists()


def settled_statement(start, end) -> str:
    """The SQL of the statement that counts the rows settled in [start, end) by the minute."""
    with CaptureQueriesContext(connection) as queries:
        rollups.grouped(start, end, "minute", "default")
    (sql,) = [q["sql"] for q in queries if "settled_at" in q["sql"] and "events" in q["sql"]]
    return sql


def test_each_settled_row_reads_its_last_claim_once_for_the_bucket_and_once_for_the_lag(clock):
    """The lag bucket is worked out inside the subquery: a CASE over the subquery repeated it
    once per bound of the histogram (16 reads of the events per settled row)."""
    settle_some(clock, random.Random(3), hours=2)
    sql = settled_statement(clock() - timedelta(hours=2), clock())
    events = connection.ops.quote_name(Event._meta.db_table)
    assert sql.count(f"FROM {events}") == 2, sql


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layout")
@pytest.mark.skipif(connection.vendor != "postgresql", reason="events are partitioned on PostgreSQL only")
def test_a_last_claim_is_planned_and_read_from_the_partitions_of_its_days_only(clock):
    """With a week of day partitions, counting the last hours plans and probes the partition
    of their claims' day and no other, however many days of history the table holds: a plan
    over every partition (pruned only as it ran) cost its planning, and JIT compiled it whole
    (seconds, at a month of history)."""
    partitions.ensure_days("default", FUTURE - timedelta(days=8), FUTURE + timedelta(days=2))
    clock.set(FUTURE)
    settle_some(clock, random.Random(5), hours=7 * 24)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        sql = settled_statement(FUTURE - timedelta(hours=3), FUTURE)
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql)
        plan = [row[0] for row in cursor.fetchall()]
    table = Event._meta.db_table
    planned = {found.group(1) for line in plan if (found := re.search(rf"Scan.* on ({table}_p\w+)", line))}
    assert planned == {partitions.partition_name(partitions.day_start(FUTURE))}, "\n".join(plan)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="JIT is PostgreSQL's")
def test_the_count_runs_without_jit(clock):
    """PostgreSQL's JIT is off for the count (its cost estimate passes the JIT thresholds,
    and compiling took longer than running), in a transaction of its own."""
    settle_some(clock, random.Random(3), hours=2)
    with CaptureQueriesContext(connection) as queries:
        rollups.grouped(clock() - timedelta(hours=2), clock(), "minute", "default")
    statements = [q["sql"] for q in queries]
    count = next(i for i, sql in enumerate(statements) if "settled_at" in sql and "events" in sql)
    assert statements[count - 1] == "SET LOCAL jit = off", statements


def test_a_range_with_nothing_settled_runs_no_count(clock):
    """The earliest due time of the rows settled in the range bounds their claims; with no
    rows there is nothing to count, and no count runs."""
    settle_some(clock, random.Random(3), hours=2)
    with CaptureQueriesContext(connection) as queries:
        rollups.grouped(clock() + timedelta(hours=1), clock() + timedelta(hours=2), "minute", "default")
    assert not [q["sql"] for q in queries if "events" in q["sql"] and "settled_at" in q["sql"]]


@pytest.mark.django_db(transaction=True)
def test_a_workers_housekeeping_thread_counts_the_hours_that_closed(clock, settings, monkeypatch):
    """Retention on or off, a worker counts the hours that closed, so that the dashboard and
    ``scheduler_status`` find them counted and read only the open ends live: their first read
    after a deploy does not count a week of settled rows."""
    settings.DURABLE_SCHEDULER_RETENTION = None
    settle_some(clock, random.Random(7), hours=6)
    closed = rollups._floor(clock() - rollups.SETTLE_MARGIN)
    wanted = {closed - timedelta(hours=h) for h in range(1, 6)}
    marks = OutcomeCount.objects.filter(kind=rollups.MARK, status=rollups.COUNTED)
    monkeypatch.setattr(retention_thread, "CHECK_EVERY", 0.2)  # it counts at its first look
    thread = RetentionThread("worker-a")
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not wanted <= set(marks.values_list("hour", flat=True)):
            assert time.monotonic() < deadline, "the worker did not count the hours that closed"
            time.sleep(0.2)
    finally:
        thread.stop()
    expected = direct(clock() - timedelta(hours=6), clock())
    with CaptureQueriesContext(connection) as queries:
        assert rollups.outcomes(clock() - timedelta(hours=6), clock(), alias="default") == expected
    events = Event._meta.db_table
    assert not [q["sql"] for q in queries if events in q["sql"]]  # no hour counted by the reader
