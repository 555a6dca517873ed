"""The events table's day partitions (PostgreSQL): migration 0005 converting a filled table in
place, partitions made ahead (rows the default partition caught moved into them), whole days
dropped with the rows to keep copied out and the rows that go archived first; and on the other
databases, every function a no-op on the plain table.

Tests that change the partitions put the layout the migration makes back afterwards (the
table converted to a plain one and partitioned again by the migration's own code), so every
test starts from what ``migrate`` leaves."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps as global_apps
from django.contrib.admin.utils import quote
from django.db import OperationalError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

import django_durable_scheduler as scheduler
from django_durable_scheduler.db import dialect
from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.housekeeping import partitions
from django_durable_scheduler.housekeeping.retention.thread import RetentionThread, last_run, run_once
from django_durable_scheduler.migrations import _events_partitions
from django_durable_scheduler.models import Event, Occurrence

from ..conftest import AUTHORITY

APP = "durable_scheduler"
PARTITIONED = (APP, "0005_events_partitioned")

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="events are partitioned on PostgreSQL only"
)
# Far after the migration's partitions (made around the real date), so ensure_ahead makes new ones.
FUTURE = datetime(2031, 3, 10, 12, tzinfo=UTC)


def where(event_id: int) -> str:
    """The partition that holds an event."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {Event._meta.db_table} WHERE event_id = %s", [event_id]
        )
        return cursor.fetchone()[0]


@pytest.fixture
def layout():
    """After the test, the events table as migration 0005 makes it on an empty table, whatever
    the test did to it (rows far ahead would move the migration's boundary after them)."""
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Event._meta.db_table}")
    with connection.schema_editor(atomic=False) as editor:
        _events_partitions.backward(global_apps, editor)
        _events_partitions.forward(global_apps, editor)


@pytest.fixture
def occurrences(clock):
    """A job with two occurrences (one to keep, one to drop), each with an event on FUTURE's day,
    and an event of the job alone that day."""
    scheduler.set_policy(
        "user", "alice", capabilities=["reports.send"], window=3600, max_runs=100, max_units=100
    )
    scheduler.create_job("job-p", "reports.send", authority=AUTHORITY)
    keep, _ = scheduler.enqueue("job-p", scheduled_for=1, trigger_key="keep")
    drop, _ = scheduler.enqueue("job-p", scheduled_for=2, trigger_key="drop")
    at = FUTURE - timedelta(hours=6)
    events = {
        name: Event.objects.create(job_id="job-p", occurrence_id=occ, event_type="test", occurred_at=at).pk
        for name, occ in (("keep", keep.pk), ("drop", drop.pk), ("job", None))
    }
    return keep, drop, events


class Sink:
    """An archive that keeps what it is given (or refuses it)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.written: list[tuple[type, tuple[datetime, datetime], list[int]]] = []

    def write(self, model, period, rows):
        ids = [row.pk for row in rows]
        if self.fail:
            raise OSError("the archive's storage is full")
        self.written.append((model, period, ids))


@pytest.mark.skipif(connection.vendor == "postgresql", reason="the plain table: SQLite and MySQL/MariaDB")
def test_everything_is_a_no_op_on_a_plain_table(clock):
    scheduler.create_job("job-p", "reports.send", authority=AUTHORITY)
    events = Event.objects.count()
    assert partitions.is_partitioned("default") is False
    assert partitions.partitions("default") == []
    assert partitions.ensure_ahead("default", FUTURE) == []
    assert partitions.ensure_days("default", FUTURE - timedelta(days=30), FUTURE) == []
    dropped = partitions.drop_before(
        "default", FUTURE, kept=Occurrence.objects.none(), keep_job_events=False, archive=Sink(fail=True)
    )
    assert dropped == partitions.Dropped()
    assert Event.objects.count() == events


def test_times_must_be_aware(clock):
    """On every database: a naive time is refused, naming the argument, before anything runs."""
    naive = datetime(2031, 3, 10)
    with pytest.raises(InvalidArgument, match=r"^now: must be an aware datetime"):
        partitions.ensure_ahead("default", naive)
    with pytest.raises(InvalidArgument, match=r"^cutoff: must be an aware datetime"):
        partitions.drop_before(
            "default", naive, kept=Occurrence.objects.none(), keep_job_events=True, archive=None
        )
    with pytest.raises(InvalidArgument, match=r"^start: must be an aware datetime"):
        partitions.ensure_days("default", naive, FUTURE)
    with pytest.raises(InvalidArgument, match=r"^end: must be after start"):
        partitions.ensure_days("default", FUTURE, FUTURE)
    with pytest.raises(InvalidArgument, match=r"^cutoff: "):
        partitions.drop_before(
            "default", "2031-03-10", kept=Occurrence.objects.none(), keep_job_events=True, archive=None
        )


@postgresql_only
def test_migrate_leaves_day_partitions_and_a_default_one():
    assert partitions.is_partitioned("default")
    found = partitions.partitions("default")
    assert found[0].start is None and found[0].name.endswith("_pinitial")
    assert found[-1].default and found[-1].name == partitions.default_name()
    days = found[1:-1]
    assert len(days) == _events_partitions.AHEAD_DAYS
    for before, after in zip(found[:-2], days, strict=True):
        assert before.end == after.start and after.end - after.start == partitions.PERIOD
        assert after.name == partitions.partition_name(after.start)


@postgresql_only
def test_ensure_ahead_moves_what_the_default_partition_caught_and_runs_once(layout, occurrences):
    _, _, events = occurrences
    late = Event.objects.create(job_id="job-p", event_type="test", occurred_at=FUTURE + timedelta(days=30)).pk
    assert {where(pk) for pk in events.values()} == {partitions.default_name()}

    made = partitions.ensure_ahead("default", FUTURE)
    assert made == [partitions.partition_name(datetime(2031, 3, d, tzinfo=UTC)) for d in (10, 11, 12, 13)]
    # The day's rows moved out of the default partition; a later day's stayed there.
    assert {where(pk) for pk in events.values()} == {
        partitions.partition_name(datetime(2031, 3, 10, tzinfo=UTC))
    }
    assert where(late) == partitions.default_name()
    assert partitions.ensure_ahead("default", FUTURE) == []
    assert partitions.ensure_ahead("default", FUTURE + timedelta(days=1)) == [
        partitions.partition_name(datetime(2031, 3, 14, tzinfo=UTC))
    ]
    # Read back through the parent, and a new row goes to its day.
    assert set(Event.objects.filter(pk__in=events.values()).values_list("event_type", flat=True)) == {"test"}
    new = Event.objects.create(job_id="job-p", event_type="test", occurred_at=FUTURE + timedelta(days=2)).pk
    assert where(new) == partitions.partition_name(datetime(2031, 3, 12, tzinfo=UTC))
    assert new > max(events.values())


@postgresql_only
def test_ensure_days_makes_past_days_and_refuses_the_partition_from_before(layout, occurrences):
    """History written before its days had partitions gets them (what the default partition
    caught moves in); days that have one are left alone; days inside the partition of
    everything before the conversion are refused, with nothing made."""
    _, _, events = occurrences
    march = [partitions.partition_name(datetime(2031, 3, d, tzinfo=UTC)) for d in range(8, 14)]
    assert (
        partitions.ensure_days("default", FUTURE - timedelta(days=2), FUTURE - timedelta(hours=1))
        == (march[:3])
    )
    assert {where(pk) for pk in events.values()} == {march[2]}
    assert partitions.ensure_days("default", datetime(2031, 3, 9, tzinfo=UTC), FUTURE) == []
    assert partitions.ensure_ahead("default", FUTURE) == march[3:]
    before = partitions.partitions("default")
    with pytest.raises(InvalidArgument, match=r"^start: .*overlaps partition .*_pinitial, which holds more"):
        partitions.ensure_days("default", datetime(2020, 1, 1, tzinfo=UTC), FUTURE)
    assert partitions.partitions("default") == before


@postgresql_only
def test_drop_before_keeps_the_kept_archives_the_rest(layout, occurrences, admin_client):
    keep, drop, events = occurrences
    partitions.ensure_ahead("default", FUTURE)
    day = partitions.partition_name(datetime(2031, 3, 10, tzinfo=UTC))
    everything = Event.objects.count()
    # The enqueue events were written at the test clock's time, in the partition from before
    # the conversion: that one goes too, with the kept occurrence's enqueue event rescued.
    sink = Sink()
    dropped = partitions.drop_before(
        "default",
        FUTURE + timedelta(days=1) - timedelta(hours=12),
        kept=Occurrence.objects.filter(pk=keep.pk),
        keep_job_events=True,
        archive=sink,
    )
    assert day in dropped.partitions and dropped.partitions[0].endswith("_pinitial")
    names = {p.name for p in partitions.partitions("default")}
    assert day not in names and not names & set(dropped.partitions)
    assert dropped.rescued + dropped.rows == everything
    assert dropped.lock_seconds > 0
    survivors = set(Event.objects.values_list("pk", flat=True))
    assert events["keep"] in survivors and events["job"] in survivors and events["drop"] not in survivors
    assert not Event.objects.filter(occurrence=drop).exists()
    assert Event.objects.filter(occurrence=keep).count() == 2  # enqueued, and the test's
    assert Event.objects.count() == dropped.rescued
    assert where(events["keep"]) == partitions.default_name()
    # The archive got what went, each partition with its period, before the drop.
    archived = {pk for _, _, ids in sink.written for pk in ids}
    assert events["drop"] in archived and not archived & survivors
    assert len(archived) == dropped.rows
    assert (Event, (datetime(2031, 3, 10, tzinfo=UTC), datetime(2031, 3, 11, tzinfo=UTC))) in {
        (model, period) for model, period, _ in sink.written
    }
    # The admin still opens a rescued event, and the occurrence's page lists its events.
    page = admin_client.get(reverse(f"admin:{APP}_event_change", args=[events["keep"]]))
    assert page.status_code == 200
    assert (
        admin_client.get(reverse(f"admin:{APP}_occurrence_change", args=[quote(keep.pk)])).status_code == 200
    )
    assert admin_client.get(reverse(f"admin:{APP}_event_changelist")).status_code == 200


@postgresql_only
@pytest.mark.usefixtures("occurrences")
def test_an_archive_that_fails_leaves_the_partition_whole(layout):
    partitions.ensure_ahead("default", FUTURE)
    before = partitions.partitions("default")
    count = Event.objects.count()
    with pytest.raises(OSError, match="storage is full"):
        partitions.drop_before(
            "default", FUTURE, kept=Occurrence.objects.none(), keep_job_events=False, archive=Sink(fail=True)
        )
    assert partitions.partitions("default") == before
    assert Event.objects.count() == count


@postgresql_only
def test_prune_deletes_events_across_partitions(layout, occurrences):
    """``ops.prune``'s row deletes (by occurrence, by event id) work on the partitioned table."""
    keep, drop, events = occurrences
    partitions.ensure_ahead("default", FUTURE)
    assert dialect.delete_rows("default", Event, "occurrence", [drop.pk, keep.pk]) == 4
    assert dialect.delete_rows("default", Event, "event_id", [events["job"]]) == 1
    assert not Event.objects.filter(pk__in=events.values()).exists()


def before_partitioning():
    """The migration 0005 follows: the schema of today but for the partitioned events."""
    graph = MigrationExecutor(connection).loader.graph
    (parent,) = (node.key for node in graph.node_map[PARTITIONED].parents if node.key[0] == APP)
    return parent


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


@postgresql_only
def test_migration_converts_a_filled_table_in_place(clock, admin_client):
    """Back to the migration before 0005 (a plain table), events filled by SQL and through the
    API, forward again: every row is read back the same through the ORM from the partition of
    everything before the conversion, whose indexes are the old table's (none built under the
    lock), and new event ids go on from the old sequence."""
    latest = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == APP]
    # Made through the API with today's schema: the models are today's, not the past one's.
    scheduler.create_job("job-m", "reports.send", authority=AUTHORITY)
    occ, _ = scheduler.enqueue("job-m", scheduled_for=1, trigger_key="m")
    migrate(before_partitioning())
    try:
        assert not partitions.is_partitioned("default")
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {Event._meta.db_table} (job_id, occurrence_id, event_type, occurred_at, data)"
                " SELECT 'job-m', %s, 'filled', now() - g * interval '1 minute', '{}'"
                " FROM generate_series(1, 5000) g",
                [occ.pk],
            )
        before = list(Event.objects.order_by("pk").values())
        MigrationExecutor(connection).migrate(latest)
    finally:
        migrate(latest[0])
    assert partitions.is_partitioned("default")
    assert list(Event.objects.order_by("pk").values()) == before
    initial = partitions.partitions("default")[0].name
    assert {where(row["event_id"]) for row in before[:: len(before) // 20]} == {initial}
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", [initial])
        assert {name for (name,) in cursor.fetchall()} == {
            f"{initial}_pkey",
            "dsch_events_job_pinitial",
            "dsch_events_occurrence_pinitial",
        }
    new = Event.objects.create(job_id="job-m", event_type="after", occurred_at=clock())
    assert new.pk == before[-1]["event_id"] + 1
    for pk in (before[0]["event_id"], before[-1]["event_id"], new.pk):
        assert admin_client.get(reverse(f"admin:{APP}_event_change", args=[pk])).status_code == 200


def hold_occurrence(pk: str, seconds: float, started: threading.Event) -> None:
    """Another worker's transaction: an occurrence row written and held for ``seconds``."""
    from django.db import connection as own  # this thread's connection

    try:
        with transaction.atomic():
            Occurrence.objects.filter(pk=pk).update(priority=1)
            started.set()
            time.sleep(seconds)
    finally:
        own.close()


@postgresql_only
def test_partition_maintenance_waits_out_a_writer_or_gives_up_whole(layout, occurrences, monkeypatch):
    """Making a partition locks the occurrences table for an instant (its foreign key), after
    the writes under way: a short wait a try, tried again until a writer's transaction is over;
    a writer that outlasts every try makes it fail with nothing made."""
    keep, _, _ = occurrences
    for seconds, attempts in ((0.6, partitions.LOCK_ATTEMPTS), (1.5, 2)):
        monkeypatch.setattr(partitions, "LOCK_ATTEMPTS", attempts)
        before = partitions.partitions("default")
        started = threading.Event()
        writer = threading.Thread(target=hold_occurrence, args=(keep.pk, seconds, started))
        writer.start()
        started.wait(10)
        try:
            if attempts == 2:
                with pytest.raises(OperationalError, match="lock timeout"):
                    partitions.ensure_ahead("default", FUTURE + timedelta(days=10))
                assert partitions.partitions("default") == before
            else:
                assert len(partitions.ensure_ahead("default", FUTURE)) == 4
        finally:
            writer.join()
    assert Occurrence.objects.get(pk=keep.pk).priority == 1


def hold_events_table(seconds: float, started: threading.Event) -> None:
    """A long transaction that reads the events table: what the conversion's lock waits for."""
    from django.db import connection as own

    try:
        with transaction.atomic(), own.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Event._meta.db_table} IN ACCESS SHARE MODE")
            started.set()
            time.sleep(seconds)
    finally:
        own.close()


@postgresql_only
def test_a_conversion_that_cannot_lock_the_table_leaves_it_as_it_was(monkeypatch):
    """The conversion waits a bounded time for its lock; when a long transaction holds the
    table past that, the migration fails and takes back what it prepared (the check that every
    row is before the boundary would otherwise refuse every insert once that day came)."""
    latest = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == APP]
    migrate(before_partitioning())
    try:
        monkeypatch.setattr(_events_partitions, "LOCK_TIMEOUT", "100ms")
        started = threading.Event()
        reader = threading.Thread(target=hold_events_table, args=(1.0, started))
        reader.start()
        started.wait(10)
        try:
            with pytest.raises(OperationalError, match="lock timeout"):
                MigrationExecutor(connection).migrate(latest)
        finally:
            reader.join()
        assert not partitions.is_partitioned("default")
        with connection.cursor() as cursor:
            constraints = connection.introspection.get_constraints(cursor, Event._meta.db_table)
        assert _events_partitions.CHECK not in constraints
        assert not [name for name in constraints if "pinitial" in name]
    finally:
        monkeypatch.undo()
        migrate(latest[0])
    assert partitions.is_partitioned("default")


@postgresql_only
def test_the_workers_retention_drops_whole_days_and_keeps_what_it_keeps(layout, occurrences, clock, settings):
    """A worker's retention run drops the days before its youngest cutoff as partitions, with
    the events of the occurrences it keeps copied out, then deletes what is left row by row."""
    keep, drop, events = occurrences
    settings.DURABLE_SCHEDULER_RETENTION = {"cancelled": 86_400, "caller_keys": 86_400, "pause": 0}
    clock.current = FUTURE
    scheduler.cancel(drop.pk, reason="not needed")  # settled at FUTURE; `keep` stays queued
    partitions.ensure_ahead("default", FUTURE)
    day = partitions.partition_name(datetime(2031, 3, 10, tzinfo=UTC))
    clock.current = FUTURE + timedelta(days=3)
    result = run_once("worker-a")
    assert result is not None and day in result.partitions and result.partition_lock_seconds > 0
    assert (
        not Occurrence.objects.filter(pk=drop.pk).exists() and Occurrence.objects.filter(pk=keep.pk).exists()
    )
    survivors = set(Event.objects.values_list("pk", flat=True))
    # The queued occurrence keeps its events; the job event is younger than job events' 30 days.
    assert {events["keep"], events["job"]} <= survivors and events["drop"] not in survivors
    assert where(events["keep"]) == partitions.default_name()
    assert day not in {p.name for p in partitions.partitions("default")}
    assert "dropped whole" in result.summary()
    assert last_run("default", clock.current).result["partitions_dropped"] == result.partitions


@postgresql_only
def test_a_workers_retention_thread_makes_the_coming_days(layout, clock, settings):
    """Retention on or off, a worker makes the coming days' partitions when it starts."""
    settings.DURABLE_SCHEDULER_RETENTION = None
    clock.current = FUTURE
    thread = RetentionThread("worker-a")
    thread.start()
    try:
        deadline = time.monotonic() + 30
        wanted = partitions.partition_name(partitions.day_start(FUTURE + partitions.AHEAD))
        while wanted not in {p.name for p in partitions.partitions("default")}:
            assert time.monotonic() < deadline, "the coming days' partitions were not made"
            time.sleep(0.5)
    finally:
        thread.stop()
