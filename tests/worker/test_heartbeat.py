"""The heartbeat renews the leases of what a worker holds, on its own thread, and keeps the
worker's row fresh; a lease it finds lost is marked on the handler's context."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, OperationalError

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Occurrence, WorkerHeartbeat
from django_durable_scheduler.worker.heartbeat import Heartbeat
from django_durable_scheduler.worker.runs import Held, Run

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db(transaction=True)


def held_runs(owner: str, n: int, lease: float) -> Held:
    """``n`` occurrences claimed by ``owner`` for ``lease`` seconds, held as a worker holds them."""
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("beat", "test.ok", authority=AUTHORITY)
    for i in range(n):
        scheduler.enqueue("beat", scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")
    held = Held(lambda: None)
    claimed = kernel.claim_batch(owner=owner, lease=lease, limit=n)
    held.add([Run.of(row, owner=owner, using=None, default_timeout=None) for row in claimed])
    return held


def expiry(run: Run):
    return Occurrence.objects.get(pk=run.occurrence.pk).lease_expires_at


def test_renew_all_extends_every_lease_held(clock):
    held = held_runs("w-beat", 2, lease=30)
    heartbeat = Heartbeat(worker_id="w-beat", held=held, lease=30, concurrency=2)
    assert [expiry(run) for run in held.runs()] == [clock() + timedelta(seconds=30)] * 2
    clock.advance(20)
    heartbeat.renew_all()
    assert [expiry(run) for run in held.runs()] == [clock() + timedelta(seconds=30)] * 2
    assert not any(run.context.lease_lost for run in held.runs())


def test_a_lease_found_lost_is_marked_on_the_handlers_context(clock):
    held = held_runs("w-beat", 1, lease=10)
    (run,) = held.runs()
    clock.advance(11)  # expired: another worker takes it
    assert kernel.claim(owner="other", lease=10) is not None
    Heartbeat(worker_id="w-beat", held=held, lease=10, concurrency=1).renew_all()
    assert run.context.lease_lost
    assert Occurrence.objects.get(pk=run.occurrence.pk).lease_owner == "other"


def test_only_the_lost_run_is_marked_and_a_cancel_request_only_on_its_run(clock):
    held = held_runs("w-beat", 3, lease=10)
    lost, asked, fine = held.runs()
    Occurrence.objects.filter(pk=lost.occurrence.pk).update(lease_owner="other")
    kernel.cancel(asked.occurrence.pk)
    clock.advance(5)
    Heartbeat(worker_id="w-beat", held=held, lease=10, concurrency=3).renew_all()
    assert [run.context.lease_lost for run in (lost, asked, fine)] == [True, False, False]
    assert [run.context.cancel_requested for run in (lost, asked, fine)] == [False, True, False]
    assert expiry(asked) == expiry(fine) == clock() + timedelta(seconds=10)
    assert expiry(lost) == clock() + timedelta(seconds=5)


def test_of_two_attempts_held_the_new_one_is_renewed_and_the_old_one_marked(clock):
    held = held_runs("w-beat", 1, lease=10)
    (old,) = held.runs()
    clock.advance(11)  # expired, and taken again by the same worker: both attempts are held
    (again,) = kernel.claim_batch(owner="w-beat", lease=10, limit=1)
    held.add([Run.of(again, owner="w-beat", using=None, default_timeout=None)])
    assert len(held) == 2
    clock.advance(5)
    Heartbeat(worker_id="w-beat", held=held, lease=10, concurrency=1).renew_all()
    new = next(run for run in held.runs() if run is not old)
    assert new.occurrence.fence == old.occurrence.fence + 1
    assert not new.context.lease_lost and old.context.lease_lost
    assert expiry(new) == clock() + timedelta(seconds=10)
    # Settling (forgetting) the old attempt leaves the new one held, and renewed.
    held.forget(old)
    assert held.runs() == [new]
    clock.advance(5)
    Heartbeat(worker_id="w-beat", held=held, lease=10, concurrency=1).renew_all()
    assert expiry(new) == clock() + timedelta(seconds=10) and not new.context.lease_lost


def test_a_database_error_is_one_warning_and_the_next_tick_renews(clock, monkeypatch, caplog):
    held = held_runs("w-beat", 2, lease=10)
    heartbeat = Heartbeat(worker_id="w-beat", held=held, lease=10, concurrency=2)
    renew_many = kernel.renew_many

    def failing(*args, **kwargs):
        raise DatabaseError("connection lost")

    monkeypatch.setattr(kernel, "renew_many", failing)
    clock.advance(5)
    heartbeat.renew_all()
    assert [r.getMessage() for r in caplog.records] == ["heartbeat could not renew 2 leases; will retry"]
    assert not any(run.context.lease_lost for run in held.runs())
    monkeypatch.setattr(kernel, "renew_many", renew_many)
    heartbeat.renew_all()
    assert [expiry(run) for run in held.runs()] == [clock() + timedelta(seconds=10)] * 2


def test_a_run_settled_meanwhile_is_not_marked(clock):
    held = held_runs("w-beat", 1, lease=10)
    (run,) = held.runs()
    kernel.settle(run.occurrence.pk, owner="w-beat", fence=run.occurrence.fence, outcome="succeeded")
    held.forget(run)  # what the reporter does after the settle
    Heartbeat(worker_id="w-beat", held=held, lease=10, concurrency=1).renew_all()
    assert not run.context.lease_lost


def test_the_thread_renews_every_third_of_the_lease_and_beats_the_worker_row(clock):
    held = held_runs("w-beat", 1, lease=0.3)
    (run,) = held.runs()
    heartbeat = Heartbeat(worker_id="w-beat", held=held, lease=0.3, concurrency=4)
    heartbeat.start(["test.ok"])
    try:
        row = WorkerHeartbeat.objects.get(pk="w-beat")
        assert (row.concurrency, row.kinds, row.stopped_at) == (4, ["test.ok"], None)
        clock.advance(0.2)  # within the lease, which the thread then extends
        wanted = clock() + timedelta(seconds=0.3)
        deadline = time.monotonic() + 30
        while expiry(run) != wanted:
            assert time.monotonic() < deadline, "the heartbeat did not renew the lease"
            time.sleep(0.05)
        while WorkerHeartbeat.objects.get(pk="w-beat").last_seen_at != clock():
            assert time.monotonic() < deadline, "the heartbeat did not beat the worker row"
            time.sleep(0.05)
    finally:
        heartbeat.stop()
    assert WorkerHeartbeat.objects.get(pk="w-beat").stopped_at == clock()


def test_a_look_renews_only_the_leases_a_quarter_old_or_more(clock):
    held = held_runs("w-beat", 2, lease=12)
    first, second = held.runs()
    heartbeat = Heartbeat(worker_id="w-beat", held=held, lease=12, concurrency=2)
    claimed = expiry(first)
    heartbeat.renew_due()
    assert [expiry(first), expiry(second)] == [claimed, claimed], "just claimed: left alone"
    clock.advance(3)  # a quarter of the lease: renewed before the next look (a twelfth)
    heartbeat.renew_due()
    assert [expiry(first), expiry(second)] == [clock() + timedelta(seconds=12)] * 2
    clock.advance(1)
    heartbeat.renew_due()
    assert expiry(first) == clock() + timedelta(seconds=11), "just renewed: left alone"


def test_on_sqlite_the_thread_tries_for_the_write_lock_again_until_its_leases_expire():
    heartbeat = Heartbeat(worker_id="w-beat", held=Held(lambda: None), lease=1, concurrency=1)
    heartbeat._tries = True  # what _try_for_the_lock sets on the thread's SQLite connection
    answers = [OperationalError("database is locked")] * 3 + ["renewed"]

    def write():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert heartbeat._in_turn(write, time.monotonic() + 5) == "renewed"
    answers[:] = [OperationalError("database is locked")] * 3
    with pytest.raises(OperationalError):
        heartbeat._in_turn(write, time.monotonic())  # past the first expiry: given up
    answers[:] = [OperationalError("no such table: x"), "renewed"]
    with pytest.raises(OperationalError):
        heartbeat._in_turn(write, time.monotonic() + 5)  # not a busy database: not tried again


def test_a_worker_row_whose_first_write_failed_is_written_by_the_next_beat(clock, caplog):
    """The start's write fails (SQLite under load: "could not record the worker heartbeat");
    the next beat writes the whole row, so the status command and the admin list the worker."""
    from django.db import connection

    def refuse(execute, sql, params, many, context):
        if WorkerHeartbeat._meta.db_table in sql:
            raise OperationalError("database is locked")
        return execute(sql, params, many, context)

    heartbeat = Heartbeat(worker_id="w-first", held=Held(lambda: None), lease=10, concurrency=3)
    heartbeat.kinds = ["test.ok"]
    with connection.execute_wrapper(refuse):
        heartbeat.beat(started=True)
        heartbeat.beat()  # still failing: nothing written, one warning each
    assert not WorkerHeartbeat.objects.filter(pk="w-first").exists()
    assert caplog.text.count("could not record the worker heartbeat of w-first") == 2
    started = clock()
    clock.advance(2)
    heartbeat.beat()
    row = WorkerHeartbeat.objects.get(pk="w-first")
    assert (row.concurrency, row.kinds, row.stopped_at) == (3, ["test.ok"], None)
    assert (row.started_at, row.last_seen_at) == (started, clock())
    clock.advance(1)
    heartbeat.beat()  # written now: a plain beat updates it
    assert WorkerHeartbeat.objects.get(pk="w-first").last_seen_at == clock()
