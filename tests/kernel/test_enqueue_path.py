"""The enqueue fast path: a job this process has enqueued before is not read again; the
insert is guarded by the values the occurrence copies from the job row, so a job changed or
replaced behind the process's back still gets exactly what reading it first would give."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler.kernel import enqueuing
from django_durable_scheduler.models import Event, Job, Occurrence
from django_durable_scheduler.rules.authority import Principal
from django_durable_scheduler.rules.validation import to_ms

from ..conftest import authority_for

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
    if connection.vendor == "postgresql":
        # The occurrence, its event and the NOTIFY in one statement.
        assert len(statements) == 1
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
    assert stored.principal_key == Principal.of(stored.authority).key
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
    monkeypatch.setattr(enqueuing, "_REMEMBERED_MAX", 3)
    for i in range(5):
        _make(job_id=f"job-{i}")
        scheduler.enqueue(f"job-{i}", scheduled_for=clock(), trigger_key="a")
        assert len(enqueuing._REMEMBERED) <= 3


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
            "scheduledFor": to_ms(occ.scheduled_for, "scheduled_for"),
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
        # A few multi-row statements, not one per row (the events' bulk_create binds at most
        # 999 parameters a statement on SQLite before Django 6: 20 of them here).
        assert len(_writes(ctx)) < 40


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


# --------------------------------------------------------------------------- inserts from _meta


def test_inserted_objects_are_marked_as_save_marks_them(clock):
    """The inserts set the documented Model._state flags as save() and a read do, so a
    returned occurrence behaves as one read from the database (a Django change here fails)."""
    _make()
    ((occ, dedup),) = scheduler.enqueue_many("job-f", [{"scheduled_for": clock(), "trigger_key": "m"}])
    one, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="o")
    read = Occurrence.objects.get(pk=occ.pk)
    assert not dedup
    for obj in (occ, one, read):
        assert (obj._state.adding, obj._state.db) == (False, "default")
    occ.status = "queued"
    occ.save(update_fields=["status"])  # an UPDATE, as for a row read back: no second insert
    assert Occurrence.objects.filter(pk=occ.pk).count() == 1


def test_insert_columns_come_from_the_model():
    """Every concrete column but the auto-increment key, in the model's order."""
    from django_durable_scheduler.db.guarded import insert_fields

    assert [f.attname for f in insert_fields(Occurrence)] == [
        f.attname for f in Occurrence._meta.get_fields() if f.concrete
    ]
    assert [f.attname for f in insert_fields(Event)] == [
        f.attname for f in Event._meta.get_fields() if f.concrete and f.attname != "event_id"
    ]


def test_bulk_keeps_payloads_that_python_equality_confuses(clock):
    """1 and True (and containers of them) are equal to Python, not in JSON: in a bulk whose
    payloads are all "equal" that way, each row still keeps its own payload."""
    _make()
    pairs = [({"v": 1}, {"v": True}), ([1], [True]), (1, True), ({"v": 0}, {"v": False})]
    for n, pair in enumerate(pairs):
        items = [
            {"scheduled_for": clock(), "trigger_key": f"p{n}-{i}", "payload": p} for i, p in enumerate(pair)
        ]
        results = scheduler.enqueue_many("job-f", items)
        stored = [Occurrence.objects.get(pk=occ.pk).payload for occ, _ in results]
        assert [json.dumps(p) for p in stored] == [json.dumps(p) for p in pair]
    # Rows alike in every column but the first still each get a row.
    same = [{"scheduled_for": clock(), "trigger_key": f"s{i}", "payload": {"v": 1}} for i in range(3)]
    assert [dedup for _, dedup in scheduler.enqueue_many("job-f", same)] == [False] * 3


def test_a_returned_payload_changed_by_the_caller_changes_no_later_enqueue(clock):
    # The occurrences that take their job's payload each get one of their own.
    _make(payload={"to": ["a"]})
    first, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="a")
    second, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="b")
    first.payload["to"].append("x")
    second.payload["cc"] = 1
    third, _ = scheduler.enqueue("job-f", scheduled_for=clock(), trigger_key="c")
    assert third.payload == {"to": ["a"]}
    assert Occurrence.objects.get(pk=third.pk).payload == {"to": ["a"]}
    assert Job.objects.get(pk="job-f").payload == {"to": ["a"]}
    rows = scheduler.enqueue_many("job-f", [{"scheduled_for": clock(), "trigger_key": k} for k in "de"])
    rows[0][0].payload["to"].clear()
    assert rows[1][0].payload == {"to": ["a"]}
