"""The enqueue fast path: a job this process has enqueued before is not read again; the
insert is guarded by the values the occurrence copies from the job row, so a job changed or
replaced behind the process's back still gets exactly what reading it first would give."""

from __future__ import annotations

import json
import weakref
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils.translation import gettext_lazy

import django_durable_scheduler as scheduler
from django_durable_scheduler import dialect, kernel
from django_durable_scheduler.authority import principal_key
from django_durable_scheduler.models import Event, Job, Occurrence

from .conftest import authority_for

pytestmark = pytest.mark.django_db

CLOCK_LATER = datetime(2026, 1, 5, 13, 0, 0, tzinfo=UTC)

FAST = connection.vendor in ("postgresql", "sqlite")


def _writes(ctx: CaptureQueriesContext) -> list[str]:
    """The statements of a capture, without transaction control (SAVEPOINT, RELEASE ...)."""
    control = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT", "BEGIN", "COMMIT")
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].upper().startswith(control)]


def _make(job_id="job-f", principal="carol", **kw):
    return scheduler.create_job(
        job_id, "reports.send", authority=authority_for(principal, "reports.send"), **kw
    )


def test_second_enqueue_of_a_job_does_not_read_the_job(clock):
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    with CaptureQueriesContext(connection) as ctx:
        occ, dedup = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    assert not dedup and occ.status == "queued"
    statements = _writes(ctx)
    assert not any('FROM "durable_scheduler_jobs" WHERE' in sql and "INSERT" not in sql for sql in statements)
    if FAST:
        # PostgreSQL: occurrence, event and NOTIFY in one call of the function; SQLite: the
        # occurrence and its event in one insert into the view (the wake-up is a datagram).
        assert len(statements) == 1
        assert dialect.ENQUEUE_FUNCTION in statements[0]
    stored = Occurrence.objects.get(pk=occ.pk)
    assert (stored.job_revision, stored.max_attempts, stored.payload) == (1, 3, None)
    assert Event.objects.filter(occurrence_id=occ.pk, event_type="occurrence_enqueued").count() == 1


def test_remembered_job_changed_by_update_job_gives_the_new_revision(clock):
    job = _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    scheduler.update_job("job-f", expected_revision=job.revision, max_attempts=7, payload={"v": 2})
    occ, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    assert (occ.job_revision, occ.max_attempts, occ.payload) == (2, 7, {"v": 2})
    stored = Occurrence.objects.get(pk=occ.pk)
    assert (stored.job_revision, stored.max_attempts, stored.payload) == (2, 7, {"v": 2})


def test_remembered_job_disabled_since_is_refused_and_nothing_is_written(clock):
    job = _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    scheduler.update_job("job-f", expected_revision=job.revision, enabled=False)
    before = (Occurrence.objects.count(), Event.objects.count())
    with pytest.raises(scheduler.JobDisabled):
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    assert (Occurrence.objects.count(), Event.objects.count()) == before


def test_job_row_changed_without_a_new_revision_is_not_missed(clock):
    """Nothing in the package edits a job without a new revision, but the guard does not
    trust that: every copied value is compared, not only the revision."""
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    Job.objects.filter(pk="job-f").update(max_attempts=5, payload={"behind": "back"})
    occ, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    stored = Occurrence.objects.get(pk=occ.pk)
    assert (stored.max_attempts, stored.payload) == (5, {"behind": "back"})
    Job.objects.filter(pk="job-f").update(enabled=False)
    with pytest.raises(scheduler.JobDisabled):
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="c")


def test_job_deleted_and_created_again_at_the_same_revision_gets_its_new_authority(clock):
    _make(principal="first")
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    Event.objects.all().delete()
    Occurrence.objects.all().delete()
    Job.objects.filter(pk="job-f").delete()
    _make(principal="second")
    occ, dedup = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    assert not dedup
    stored = Occurrence.objects.get(pk=occ.pk)
    assert stored.authority["principal"]["id"] == "second"
    assert stored.principal_key == principal_key(stored.authority)
    assert occ.authority["principal"]["id"] == "second"


def test_job_deleted_since_is_not_found(clock):
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    Event.objects.all().delete()
    Occurrence.objects.all().delete()
    Job.objects.filter(pk="job-f").delete()
    with pytest.raises(scheduler.NotFound):
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    assert not Occurrence.objects.exists() and not Event.objects.exists()


def test_fast_path_dedupes_and_refuses_another_payload_without_writing(clock):
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="warm")
    first, dedup = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="k", payload={"a": 1})
    assert not dedup
    again, dedup = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="k", payload={"a": 1})
    assert dedup and again.pk == first.pk
    before = Event.objects.count()
    with pytest.raises(scheduler.IdempotencyPayloadMismatch):
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="k", payload={"a": 2})
    assert Event.objects.count() == before
    assert Event.objects.filter(occurrence_id=first.pk).count() == 1


def test_fast_path_inside_a_caller_transaction_rolls_back_with_it(clock):
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="warm")

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        occ, _ = scheduler.enqueue("job-f", scheduled_for=clock() + timedelta(seconds=1), trigger_key="x")
        assert Occurrence.objects.filter(pk=occ.pk).exists()
        raise Undo
    assert not Occurrence.objects.filter(trigger_key="x").exists()
    assert not Event.objects.filter(data__triggerKey="x").exists()
    # The caller's transaction stays usable after a refused fast-path enqueue.
    with transaction.atomic():
        with pytest.raises(scheduler.IdempotencyPayloadMismatch):
            scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="warm", payload={"other": 1})
        assert Occurrence.objects.filter(trigger_key="warm").count() == 1


def test_returned_occurrence_does_not_carry_a_remembered_job_row(clock):
    job = _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    Job.objects.filter(pk="job-f").update(next_fire_at=clock() + timedelta(days=1))
    occ, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    assert occ.job.next_fire_at == clock() + timedelta(days=1)
    assert occ.job.revision == job.revision


@pytest.mark.skipif(not FAST, reason="the remembered-job path is PostgreSQL and SQLite only")
def test_remembered_jobs_are_bounded(clock, monkeypatch):
    monkeypatch.setattr(kernel, "_KNOWN_JOBS_MAX", 3)
    for i in range(5):
        _make(job_id=f"job-{i}")
        scheduler.enqueue(f"job-{i}", scheduled_for=clock(), trigger_key="a")
        assert len(kernel._KNOWN_JOBS) <= 3


# --------------------------------------------------------------------------- bulk


def _row_state(occ):
    return (
        occ.pk,
        occ.idempotency_key,
        occ.job_id,
        occ.job_revision,
        occ.trigger_key,
        occ.scheduled_for,
        occ.available_at,
        occ.status,
        occ.attempt,
        occ.max_attempts,
        occ.fence,
        occ.authority,
        occ.payload,
        occ.principal_key,
        occ.created_at,
        occ.updated_at,
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the enqueue function is PostgreSQL's")
def test_enqueue_function_parameters_travel_apart_from_the_statement(clock):
    """The function call binds its parameters server-side (psycopg's Cursor, not Django's
    ClientCursor), through Django's cursor wrapper: query capture and execute wrappers see
    it, and values that would need quoting as literals arrive intact."""
    import psycopg

    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="first")  # remembers the job
    payload = {"q": 'it\'s 100% $1 %s \\ "x" ü 😀', "n": [None, -1.5e-300]}
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql, context["cursor"].cursor))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper), CaptureQueriesContext(connection) as ctx:
        occ, dedup = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="it's %s", payload=payload)
    assert not dedup
    ((sql, raw),) = seen
    assert dialect.ENQUEUE_FUNCTION in sql and dialect.ENQUEUE_FUNCTION in ctx.captured_queries[-1]["sql"]
    assert isinstance(raw, psycopg.Cursor) and not isinstance(raw, psycopg.ClientCursor)
    stored = Occurrence.objects.get(pk=occ.pk)
    assert (stored.payload, stored.trigger_key) == (payload, "it's %s")
    assert Event.objects.get(occurrence=stored).data["triggerKey"] == "it's %s"


@pytest.mark.skipif(not FAST, reason="the enqueue function is PostgreSQL's, the view SQLite's")
def test_without_the_enqueue_function_the_plain_statement_writes_the_same(clock, monkeypatch):
    """A database built without migration 0015 (PostgreSQL) or 0016 (SQLite), or not
    migrated yet, enqueues through the plain statements: same rows, same events, same
    guard."""
    _make(payload={"d": 1})
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a", payload={"p": "ü"})
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    with_function = _stored("a", "b")
    Event.objects.all().delete()
    Occurrence.objects.all().delete()
    with connection.cursor() as cursor:  # undone with the test's transaction
        kind = "FUNCTION" if connection.vendor == "postgresql" else "VIEW"
        cursor.execute(f"DROP {kind} {dialect.ENQUEUE_FUNCTION}")
    monkeypatch.setattr(dialect, "_HAS_ENQUEUE_FUNCTION", weakref.WeakKeyDictionary())
    with CaptureQueriesContext(connection) as ctx:
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a", payload={"p": "ü"})
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    calls = (f"{dialect.ENQUEUE_FUNCTION}(", f"INTO {dialect.ENQUEUE_FUNCTION} ")
    assert not any(call in q["sql"] for q in ctx.captured_queries for call in calls)
    assert _stored("a", "b") == with_function
    Job.objects.filter(pk="job-f").update(max_attempts=9)  # behind the remembered row's back
    occ, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="c")
    assert occ.max_attempts == 9


def _stored(*keys):
    """Every column of the occurrences with these trigger keys, and of their events."""
    fields = Occurrence._meta.concrete_fields
    rows = {
        o.trigger_key: [getattr(o, f.attname) for f in fields]
        for o in Occurrence.objects.filter(trigger_key__in=keys)
    }
    events = sorted(
        (e.job_id, e.occurrence_id, e.event_type, e.occurred_at, e.owner_id, e.fence, e.data)
        for e in Event.objects.filter(occurrence__trigger_key__in=keys)
    )
    return rows, events


def test_bulk_rows_are_what_one_by_one_enqueues_write(clock):
    """Every column of a bulk-inserted row (and of its event) equals what enqueue writes for
    the same item: payloads of every JSON shape, millisecond times, the job's default."""
    _make(payload={"default": [1, 2.5, None, "ü"]})
    payloads = [{"a": None}, [1, "two", {"3": 3.25}], "text", 7, None, {"deep": {"er": ["😀", True]}}]
    items = [
        {
            "scheduled_for": clock() + timedelta(milliseconds=17 * i),
            "trigger_key": f"bulk-{i}",
            "available_at": clock() + timedelta(seconds=i, milliseconds=3),
            "payload": payload,
        }
        for i, payload in enumerate(payloads)
    ]
    items.append({"scheduled_for": clock(), "trigger_key": "bulk-default"})
    results = scheduler.enqueue_many("job-f", items)
    assert [dedup for _, dedup in results] == [False] * len(items)
    bulk = {occ.trigger_key: _row_state(Occurrence.objects.get(pk=occ.pk)) for occ, _ in results}
    assert {occ.trigger_key: _row_state(occ) for occ, _ in results} == bulk
    bulk_events = {
        e.data["triggerKey"]: (e.job_id, e.occurrence_id, e.occurred_at, e.owner_id, e.fence, e.data)
        for e in Event.objects.filter(event_type="occurrence_enqueued")
    }
    Event.objects.all().delete()
    Occurrence.objects.all().delete()
    for item in items:
        scheduler.enqueue("job-f", **item)
    single = {occ.trigger_key: _row_state(occ) for occ in Occurrence.objects.all()}
    assert single == bulk
    single_events = {
        e.data["triggerKey"]: (e.job_id, e.occurrence_id, e.occurred_at, e.owner_id, e.fence, e.data)
        for e in Event.objects.filter(event_type="occurrence_enqueued")
    }
    assert single_events == bulk_events
    assert bulk["bulk-default"][12] == {"default": [1, 2.5, None, "ü"]}
    assert bulk["bulk-4"][12] is None


def test_bulk_events_are_in_key_order_with_exact_times(clock):
    """A bulk enqueue writes its new occurrences' events in occurrence id order, whatever
    the items' order, each with its slot's exact epoch milliseconds (the database builds
    them on PostgreSQL), and none for a present or repeated identity."""
    _make()
    present, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="present")
    slots = [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC),
        datetime(2038, 1, 19, 3, 14, 8, 999000, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        clock(),
    ]
    items = [{"scheduled_for": slot, "trigger_key": f"t{i}"} for i, slot in enumerate(slots)]
    items += [{"scheduled_for": clock(), "trigger_key": "present"}, dict(items[2])]
    results = scheduler.enqueue_many("job-f", items)
    assert [dedup for _, dedup in results] == [False] * len(slots) + [True, True]
    events = list(
        Event.objects.filter(event_type="occurrence_enqueued").exclude(occurrence=present).order_by("pk")
    )
    new = {occ.pk: occ for occ, dedup in results if not dedup}
    assert [event.occurrence_id for event in events] == sorted(new)
    for event in events:
        occ = new[event.occurrence_id]
        assert event.data == {
            "jobRevision": occ.job_revision,
            "scheduledFor": kernel.to_ms(occ.scheduled_for, "scheduled_for"),
            "triggerKey": occ.trigger_key,
        }
        assert (event.job_id, event.owner_id, event.fence) == ("job-f", None, None)
    assert {event.data["scheduledFor"] for event in events} >= {0, 1, 2_147_483_648_999, 253_402_300_799_999}


def test_bulk_larger_than_one_statement_skips_present_rows(clock):
    _make()
    present = [
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key=f"k{i}")[0] for i in range(0, 2400, 400)
    ]
    items = [{"scheduled_for": clock(), "trigger_key": f"k{i}"} for i in range(2400)]
    items += [
        {"scheduled_for": clock(), "trigger_key": "k5"},
        {"scheduled_for": clock(), "trigger_key": "k400"},
    ]
    with CaptureQueriesContext(connection) as ctx:
        results = scheduler.enqueue_many("job-f", items)
    flags = [dedup for _, dedup in results]
    assert sum(flags) == len(present) + 2
    assert all(flags[i] for i in range(0, 2400, 400)) and flags[-2:] == [True, True]
    assert results[-2][0].pk == results[5][0].pk and results[-1][0].pk == present[1].pk
    assert Occurrence.objects.count() == 2400
    assert Event.objects.filter(event_type="occurrence_enqueued").count() == 2400
    if FAST:
        assert len(_writes(ctx)) < 20  # a few multi-row statements, not one per row


def test_bulk_payload_mismatch_with_a_present_row_writes_nothing(clock):
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="k7", payload={"v": 1})
    before = (Occurrence.objects.count(), Event.objects.count())
    items = [{"scheduled_for": clock(), "trigger_key": f"k{i}", "payload": {"v": 1}} for i in range(20)]
    items[7]["payload"] = {"v": 2}
    with pytest.raises(scheduler.IdempotencyPayloadMismatch) as info:
        scheduler.enqueue_many("job-f", items)
    assert info.value.details["trigger_key"] == "k7"
    assert (Occurrence.objects.count(), Event.objects.count()) == before


def test_bulk_of_a_disabled_or_missing_job_writes_nothing(clock):
    job = _make()
    scheduler.update_job("job-f", expected_revision=job.revision, enabled=False)
    with pytest.raises(scheduler.JobDisabled):
        scheduler.enqueue_many("job-f", [{"scheduled_for": clock(), "trigger_key": "a"}])
    with pytest.raises(scheduler.NotFound):
        scheduler.enqueue_many("nope", [{"scheduled_for": clock(), "trigger_key": "a"}])
    assert not Occurrence.objects.exists()
    assert not Event.objects.filter(event_type="occurrence_enqueued").exists()
    _make(job_id="job-g")
    assert scheduler.enqueue_many("job-g", []) == []


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=2))),  # not UTC: the full chain
        datetime(2026, 3, 29, 1, 30, tzinfo=ZoneInfo("Europe/Paris")),
        None,
    ],
)
def test_insert_preparation_of_datetimes_is_djangos(value):
    """The insert paths prepare each value as the field's own chain would (SQLite writes the
    kernel's UTC datetimes as text directly)."""
    for name, prep, _ in dialect._preparers("default", Occurrence):
        if name == "scheduled_for":
            field = Occurrence._meta.get_field(name)
            assert prep(value, connection) == field.get_db_prep_save(value, connection)
            return
    raise AssertionError("no scheduled_for column")


def test_insert_preparation_of_a_time_shared_by_rows_is_each_rows_own():
    """SQLite remembers the text of the last UTC datetime it prepared: another datetime
    (equal or not) gets its own text."""
    prep = next(p for name, p, _ in dialect._preparers("default", Occurrence) if name == "available_at")
    field = Occurrence._meta.get_field("available_at")
    first = datetime(2026, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)
    for value in (first, first, datetime(2026, 1, 1, tzinfo=UTC), first, first + timedelta(days=1)):
        assert prep(value, connection) == field.get_db_prep_save(value, connection)


def _bound(value):
    return getattr(value, "obj", value)  # psycopg's Jsonb wrapper: its value


@pytest.mark.parametrize(
    "value",
    [
        None,
        {},
        {"b": 1, "a": [1, 2.5, None, True, False], "z": {"k": "v"}},
        ["x", {"é": "naïve ✓ \U0001f600"}, -0.0, 1e300],
        "a string",
        "",
        0,
        2**63,
        3.25,
        True,
        False,
        gettext_lazy("lazy"),  # not a plain value: the field's chain
    ],
)
@pytest.mark.parametrize("name", ["payload", "authority", "result"])
def test_insert_preparation_of_json_is_djangos(name, value):
    """The insert paths bind each JSON value as the field's own chain would (SQLite, MySQL:
    ``json.dumps`` text directly for plain values)."""
    prep = next(p for column, p, _ in dialect._preparers("default", Occurrence) if column == name)
    field = Occurrence._meta.get_field(name)
    assert _bound(prep(value, connection)) == _bound(field.get_db_prep_save(value, connection))


# --------------------------------------------------------------------------- SQLite


SQLITE = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's enqueue path")
# The view of migration 0016, or the plain statements of a database built without it.
PATHS = pytest.mark.parametrize("path", ["view", "plain"])


def _take(path, monkeypatch):
    if path == "plain":
        monkeypatch.setattr(dialect, "has_enqueue_function", lambda alias: False)


def _statements_of(call):
    """The statements ``call`` sends, as execute wrappers see them."""
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        result = call()
    return result, seen


def _committed(occurrence_id):
    """(occurrences, event types) with this id, as another connection sees them."""
    import sqlite3

    other = sqlite3.connect(connection.settings_dict["NAME"])
    try:
        count = other.execute(
            "SELECT count(*) FROM durable_scheduler_occurrences WHERE occurrence_id = ?", [occurrence_id]
        ).fetchone()[0]
        events = other.execute(
            "SELECT event_type FROM durable_scheduler_events WHERE occurrence_id = ?", [occurrence_id]
        ).fetchall()
    finally:
        other.close()
    return count, [event_type for (event_type,) in events]


@SQLITE
@pytest.mark.django_db(transaction=True)
def test_sqlite_enqueue_outside_a_transaction_is_one_statement(clock):
    """Called in autocommit (as user code does), the remembered job's enqueue is one insert
    into the view: no BEGIN, no COMMIT, no savepoint, and committed when it returns (another
    connection sees the occurrence and its event). A repeat is one statement that writes
    nothing."""
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    (occ, dedup), seen = _statements_of(
        lambda: scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    )
    assert not dedup
    assert len(seen) == 1 and seen[0].startswith(f"INSERT INTO {dialect.ENQUEUE_FUNCTION} "), seen
    assert not connection.in_atomic_block and not connection.connection.in_transaction
    assert _committed(occ.pk) == (1, ["occurrence_enqueued"])
    (again, dedup), seen = _statements_of(
        lambda: scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    )
    assert dedup and again.pk == occ.pk
    # The insert that wrote nothing, the guard's check, the row read back.
    assert seen[0].startswith(f"INSERT INTO {dialect.ENQUEUE_FUNCTION} ") and len(seen) == 3, seen
    assert _committed(occ.pk) == (1, ["occurrence_enqueued"])


@SQLITE
@pytest.mark.django_db(transaction=True)
def test_sqlite_plain_enqueue_outside_a_transaction_commits_one_of_its_own(clock, monkeypatch):
    """Without the view, the remembered job's enqueue in autocommit is BEGIN IMMEDIATE, the
    guarded insert, the event, COMMIT: no savepoint, and committed when it returns."""
    _take("plain", monkeypatch)
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    (occ, dedup), seen = _statements_of(
        lambda: scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    )
    assert not dedup
    assert seen[0] == "BEGIN IMMEDIATE" and seen[-1] == "COMMIT" and len(seen) == 4, seen
    assert seen[1].startswith("INSERT OR IGNORE INTO") and "WHERE EXISTS" in seen[1]
    assert seen[2].startswith('INSERT INTO "durable_scheduler_events"')
    assert not connection.in_atomic_block and not connection.connection.in_transaction
    assert _committed(occ.pk) == (1, ["occurrence_enqueued"])
    # A repeat is found, not written: the transaction is committed with nothing in it.
    (again, dedup), seen = _statements_of(
        lambda: scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    )
    assert dedup and again.pk == occ.pk and seen[0] == "BEGIN IMMEDIATE"
    assert Event.objects.filter(occurrence_id=occ.pk).count() == 1


@SQLITE
@PATHS
@pytest.mark.django_db(transaction=True)
def test_sqlite_enqueue_that_fails_midway_writes_nothing_and_leaves_no_transaction(clock, monkeypatch, path):
    """An error after the occurrence's insert (here, its event's) rolls the occurrence back:
    nothing of it is written, the connection is out of the transaction, and the next
    enqueue works. Through the view the event's insert fails inside the statement (a
    temporary trigger of this connection refuses it)."""
    from django.db import DatabaseError

    _take(path, monkeypatch)
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")

    def failing(execute, sql, params, many, context):
        if sql.startswith('INSERT INTO "durable_scheduler_events"'):
            raise DatabaseError("disk I/O error (injected)")
        return execute(sql, params, many, context)

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TRIGGER test_refuse_events BEFORE INSERT ON durable_scheduler_events"
            " WHEN NEW.data LIKE '%\"b\"%' BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END"
        )
    try:
        with connection.execute_wrapper(failing), pytest.raises(DatabaseError, match="injected"):
            scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER temp.test_refuse_events")
    assert not connection.connection.in_transaction
    assert not Occurrence.objects.filter(trigger_key="b").exists()
    occ, dedup = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    assert not dedup
    assert Event.objects.filter(occurrence_id=occ.pk, event_type="occurrence_enqueued").count() == 1


@SQLITE
@PATHS
@pytest.mark.django_db(transaction=True)
def test_sqlite_enqueue_inside_a_transaction_is_part_of_it(clock, monkeypatch, path):
    """In a caller's atomic block the enqueue begins nothing of its own (the plain statements
    take a savepoint; the view's one statement needs none), and the caller's rollback takes
    the occurrence and its event with it."""
    _take(path, monkeypatch)
    _make()
    scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        _, seen = _statements_of(lambda: scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b"))
        assert not any(sql in ("BEGIN IMMEDIATE", "COMMIT") for sql in seen), seen
        if path == "view":
            assert len(seen) == 1 and dialect.ENQUEUE_FUNCTION in seen[0], seen
        assert Occurrence.objects.filter(trigger_key="b").exists()
        raise Undo
    assert not Occurrence.objects.filter(trigger_key="b").exists()
    assert not Event.objects.filter(data__triggerKey="b").exists()


@SQLITE
def test_sqlite_view_stores_the_text_the_plain_statements_store(clock, monkeypatch):
    """Column by column, the view writes the text the plain statements write (times as
    Django's text, JSON as ``json.dumps``): SQLite compares and orders that text."""
    later = datetime(2026, 1, 5, 13, 0, 0, 120_000, tzinfo=UTC)
    _make(payload={"d": "ü", "n": [1.5, None]})

    def enqueue_all(prefix):
        scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key=f"{prefix}first")
        scheduler.enqueue("job-f", scheduled_for=later, trigger_key=f"{prefix}same")
        scheduler.enqueue(
            "job-f",
            scheduled_for=datetime(2026, 1, 5, 14, tzinfo=UTC),  # no microseconds
            trigger_key=f"{prefix}other",
            available_at=later + timedelta(seconds=1),
            payload={"own": "😀"},
        )

    def raw(prefix):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT substr(trigger_key, 2), scheduled_for, available_at, status, attempt,"
                " max_attempts, fence, lease_owner, lease_expires_at, authority, payload, last_error,"
                " result, created_at, updated_at, settled_at, principal_key, metadata, receipt, job_id,"
                " job_revision FROM durable_scheduler_occurrences WHERE trigger_key LIKE %s"
                " ORDER BY trigger_key",
                [prefix + "%"],
            )
            occurrences = cursor.fetchall()
            cursor.execute(
                "SELECT e.job_id, e.event_type, e.occurred_at, e.owner_id, e.fence,"
                ' replace(e.data, \'"triggerKey": "\' || %s, \'"triggerKey": "\')'
                " FROM durable_scheduler_events AS e"
                " JOIN durable_scheduler_occurrences AS o USING (occurrence_id)"
                " WHERE o.trigger_key LIKE %s ORDER BY o.trigger_key",
                [prefix, prefix + "%"],
            )
            return occurrences, cursor.fetchall()

    enqueue_all("v")
    kernel._KNOWN_JOBS.clear()
    _take("plain", monkeypatch)
    enqueue_all("p")
    assert raw("v") == raw("p")
    assert len(raw("v")[0]) == 3 and len(raw("v")[1]) == 3


# Trigger keys whose JSON text needs escapes: quotes, backslashes, non-ASCII, outside the BMP.
AWKWARD_KEYS = [
    'q"uote',
    "back\\slash",
    "ü-umlaut",
    "emoji-😀",
    "per%cent",
    "  padded-inside  x",
    "tab\u2028sep",
]


def test_enqueued_data_text_is_what_json_dumps_gives():
    for key in AWKWARD_KEYS:
        for revision, ms in ((1, 0), (7, 253_402_300_799_999)):
            data = kernel._enqueued_data(revision, ms, key)
            assert dialect.enqueued_data_text(revision, ms, key) == json.dumps(data)


@SQLITE
@pytest.mark.parametrize("path", ["json_each", "values"])
def test_sqlite_bulk_events_store_the_text_one_by_one_enqueues_store(clock, monkeypatch, path):
    """A bulk enqueue's events (one ``json_each`` parameter a statement, or the ``VALUES``
    list of Event rows where it cannot) hold the text the one-by-one enqueue stores, for
    trigger keys that need escaping, and only the inserted occurrences get one."""
    if path == "values":
        monkeypatch.setattr(dialect, "supports_insert_enqueued_many", lambda alias: False)
    _make()
    slots = [clock(), clock() + timedelta(milliseconds=1), datetime(2026, 1, 5, 14, tzinfo=UTC)]

    def data_text(keys):
        with connection.cursor() as cursor:
            marks = ", ".join(["%s"] * len(keys))
            cursor.execute(
                "SELECT o.trigger_key, e.job_id, e.event_type, e.occurred_at, e.owner_id, e.fence, e.data"
                " FROM durable_scheduler_events AS e JOIN durable_scheduler_occurrences AS o"
                f" USING (occurrence_id) WHERE o.trigger_key IN ({marks}) ORDER BY e.event_id",
                keys,
            )
            return cursor.fetchall()

    one = [f"1{key}" for key in AWKWARD_KEYS]
    bulk = [f"b{key}" for key in AWKWARD_KEYS]
    for i, key in enumerate(one):
        scheduler.enqueue("job-f", scheduled_for=slots[i % 3], trigger_key=key)
    scheduler.enqueue("job-f", scheduled_for=slots[1], trigger_key=bulk[1])  # present: no new event
    items = [{"scheduled_for": slots[i % 3], "trigger_key": key} for i, key in enumerate(bulk)]
    results = scheduler.enqueue_many("job-f", items)
    assert [dedup for _, dedup in results] == [i == 1 for i in range(len(bulk))]
    assert Event.objects.filter(event_type="occurrence_enqueued").count() == 2 * len(AWKWARD_KEYS)

    def by_key(rows):
        # Each row by its key without the prefix, its data with the key's prefix taken out.
        return {
            key[1:]: (*rest, data.replace(f'"triggerKey": "{key[0]}', '"triggerKey": "', 1))
            for key, *rest, data in rows
        }

    assert by_key(data_text(bulk)) == by_key(data_text(one))
    texts = [row[-1] for row in data_text(bulk)]
    assert all(json.loads(text)["triggerKey"].startswith("b") for text in texts)
    # In occurrence id order, whatever the items' order (the present one's event came first).
    new = sorted(occ.pk for occ, dedup in results if not dedup)
    events = Event.objects.filter(occurrence_id__in=new).order_by("pk")
    assert [event.occurrence_id for event in events] == new


def test_remembered_jobs_occurrences_are_its_first_one_but_the_per_occurrence_columns(clock):
    """An occurrence of a remembered job is a clone of the job's first one: it differs in
    kernel._PER_OCCURRENCE only, and its row (built from the first one's prepared values)
    is what reading the job would have written."""
    _make(payload={"d": "ü"})
    first, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    later = clock() + timedelta(minutes=5, milliseconds=7)
    occ, _ = scheduler.enqueue(
        "job-f", scheduled_for=later, trigger_key="b", available_at=later + timedelta(seconds=1), payload=[1]
    )
    fields = [f.attname for f in Occurrence._meta.concrete_fields]
    differ = {name for name in fields if getattr(occ, name) != getattr(first, name)}
    # The test's clock stands still: the times are the first occurrence's.
    assert differ == set(kernel._PER_OCCURRENCE) - {"created_at", "updated_at"}
    kernel._KNOWN_JOBS.clear()  # read the job again: the plain path
    scheduler.enqueue(
        "job-f", scheduled_for=later, trigger_key="c", available_at=later + timedelta(seconds=1), payload=[1]
    )
    stored = {o.trigger_key: o for o in Occurrence.objects.filter(trigger_key__in=["b", "c"])}
    for name in fields:
        if name not in ("occurrence_id", "idempotency_key", "trigger_key"):
            assert getattr(stored["b"], name) == getattr(stored["c"], name), name
    assert _row_state(occ) == _row_state(stored["b"])


def _function_call(job, trigger_key, at, guard, **changes):
    """One call of the enqueue function with an occurrence of ``job`` (its outcome, as the
    function returns it: 1, 0 or -1)."""
    occ = kernel._new_occurrence(
        job,
        scheduled_ms=kernel.to_ms(at, "at"),
        trigger_key=trigger_key,
        available_ms=kernel.to_ms(at, "at"),
        payload=changes.pop("payload", job.payload),
        now=at,
    )
    for name, value in changes.items():
        setattr(occ, name, value)
    try:
        return (
            1
            if dialect.insert_enqueued(
                "default", occ, event_data={"k": trigger_key}, guard=guard, notify=False
            )
            else 0
        )
    except dialect.GuardFailed:
        return -1


@pytest.mark.skipif(not FAST, reason="the enqueue function is PostgreSQL's, the view SQLite's")
def test_enqueue_function_outcomes(clock):
    """1: inserted with its event; 0: the occurrence was there; -1: the guard failed, and the
    guard's failure wins when the occurrence is there too (the caller reads the job again)."""
    job = _make(payload={"d": 1})
    at = clock()
    assert _function_call(job, "a", at, guard=2) == 1
    assert _function_call(job, "a", at, guard=2) == 0
    assert _function_call(job, "a", at, guard=0) == 0
    assert (Occurrence.objects.count(), Event.objects.filter(event_type="occurrence_enqueued").count()) == (
        1,
        1,
    )
    assert _function_call(job, "b", at, guard=2, payload={"other": 1}) == -1  # not the job's payload
    assert _function_call(job, "b", at, guard=1, payload={"other": 1}) == 1  # a payload of its own
    Job.objects.filter(pk=job.pk).update(max_attempts=7)  # behind the remembered row's back
    assert _function_call(job, "c", at, guard=1) == -1
    assert _function_call(job, "a", at, guard=1) == -1  # there, but the guard fails
    assert _function_call(job, "c", at, guard=0) == 1  # no guard: the caller's values
    Job.objects.filter(pk=job.pk).update(max_attempts=job.max_attempts, enabled=False)
    assert _function_call(job, "d", at, guard=1) == -1
    assert set(Occurrence.objects.values_list("trigger_key", flat=True)) == {"a", "b", "c"}
    assert Event.objects.filter(event_type="occurrence_enqueued").count() == 3


@pytest.mark.skipif(not FAST, reason="the enqueue function is PostgreSQL's, the view SQLite's")
@pytest.mark.parametrize(
    "changes", [{"status": "running"}, {"attempt": 1}, {"fence": 2}, {"updated_at": CLOCK_LATER}]
)
def test_enqueue_function_takes_new_queued_occurrences_only(clock, changes):
    """The function writes a queued occurrence at attempt 0 and fence 0, updated when it was
    created: asked for anything else, it refuses before sending a statement."""
    job = _make()
    with CaptureQueriesContext(connection) as ctx, pytest.raises(ValueError, match="new queued occurrences"):
        _function_call(job, "a", clock(), guard=1, **changes)
    assert not ctx.captured_queries and not Occurrence.objects.exists()
