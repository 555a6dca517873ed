"""The Worker loop, in process (threads run handlers, the database is real)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import registry
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.worker import HOLD_AHEAD, Worker, claim_ahead

from .conftest import AUTHORITY

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def handlers():
    registry.autodiscover()


def make(kind, n=1, **job):
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job(kind, kind, authority=AUTHORITY, **job)
    return [
        scheduler.enqueue(kind, scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")[0] for i in range(n)
    ]


def burst(**kw):
    kw.setdefault("concurrency", 3)
    kw.setdefault("poll_interval", 0.05)
    return Worker(worker_id="w-test", burst=True, **kw).run()


def test_burst_runs_everything_and_exits_zero():
    make("test.ok", 7)
    assert burst() == 0
    rows = Occurrence.objects.all()
    assert {r.status for r in rows} == {"succeeded"}
    assert rows[0].result["attempt"] == 1


def test_retry_then_success():
    (occ,) = make("test.flaky", retry_base_delay=0.001, retry_max_delay=0.001)
    burst()
    occ.refresh_from_db()
    assert (occ.status, occ.attempt, occ.result) == ("succeeded", 2, "recovered")
    events = [e.event_type for e in scheduler.history(occurrence_id=occ.pk)]
    assert "occurrence_retry_scheduled" in events


def test_failure_stores_message_and_traceback():
    (occ,) = make("test.flaky", max_attempts=1)
    burst()
    occ.refresh_from_db()
    assert occ.status == "dead_letter"
    assert occ.last_error["message"] == "first attempt fails"
    assert "RuntimeError" in occ.last_error["traceback"]


def test_permanent_failure_dead_letters_without_retry():
    (occ,) = make("test.permanent")
    burst()
    occ.refresh_from_db()
    assert (occ.status, occ.attempt, occ.last_error["code"]) == ("dead_letter", 1, "E_BAD")


def test_retry_with_delay_sets_time(clock):
    (occ,) = make("test.retry-later")
    Worker(worker_id="w", once=True).run()
    occ.refresh_from_db()
    assert occ.status == "retry_wait"
    assert occ.available_at == clock() + timedelta(seconds=120)


def test_bad_result_is_a_durable_failure():
    (occ,) = make("test.bad-result")
    burst()
    occ.refresh_from_db()
    assert occ.status == "dead_letter"
    assert occ.last_error["type"] == "InvalidResult"


def test_unregistered_kind_is_never_claimed():
    (occ,) = make("nobody.handles.this")
    burst()
    occ.refresh_from_db()
    assert (occ.status, occ.attempt) == ("queued", 0)


def test_max_occurrences():
    make("test.ok", 5)
    Worker(worker_id="w", max_occurrences=2, concurrency=1, poll_interval=0.05).run()
    assert Occurrence.objects.filter(status="succeeded").count() == 2


def test_metadata_and_receipt_are_persisted():
    (occ,) = make("test.receipt")
    burst()
    occ.refresh_from_db()
    assert occ.status == "succeeded"
    assert occ.metadata == {"step": "charging"}
    assert occ.receipt == {"charge_id": f"ch_{occ.pk[-6:]}"}


def test_worker_heartbeat_row():
    from django_durable_scheduler.models import WorkerHeartbeat

    make("test.ok", 1)
    burst()
    row = WorkerHeartbeat.objects.get(pk="w-test")
    assert row.stopped_at is not None and row.concurrency == 3 and "test.ok" in row.kinds


def test_claim_ahead_follows_the_handlers_speed_from_the_first_runs():
    worker = Worker(worker_id="w", concurrency=4)
    assert worker._capacity() == 4  # nothing run yet: no claim-ahead
    worker._learn(0.001)
    # 1 ms handlers: HOLD_AHEAD (50 ms) of work per thread (the average is 1 ms give or
    # take a float's last digit, hence the range).
    assert 4 * 49 <= worker._capacity() <= 4 * 50
    for _ in range(40):
        worker._learn(0.5)  # the handlers became slow: no claim-ahead
    assert worker._capacity() == 4
    for _ in range(3):
        worker._learn(0.0)
    assert worker._capacity() == 4  # a few fast runs move a long average only part of the way
    for _ in range(200):
        worker._learn(0.0099)
    assert worker._capacity() == 4 * 5  # 50 ms / 9.9 ms, rounded down


def test_claim_ahead_is_sized_by_the_work_not_by_the_thread_count():
    def ahead(concurrency=1, handler=0.001, turn=0.0, lease=30.0, max_batch=500):
        sizes = {"handler_seconds": handler, "turn_seconds": turn, "lease": lease, "max_batch": max_batch}
        return claim_ahead(concurrency=concurrency, **sizes)

    assert ahead(concurrency=3, handler=0.05) == 3, "slow handlers: no claim-ahead"
    assert ahead(concurrency=3, handler=2.0, turn=5.0) == 3
    # One thread and near-instant handlers: as large a batch as MAX_CLAIM_BATCH allows.
    assert ahead(handler=0.00002) == 500
    assert ahead(handler=0.00002, max_batch=64) == 64
    assert ahead(handler=0.0, max_batch=64) == 64
    # HOLD_AHEAD of work per thread, or TURNS_AHEAD turns of it when turns take longer.
    assert ahead(handler=0.001) == round(HOLD_AHEAD / 0.001)
    assert ahead(handler=0.001, turn=0.1) == 200
    assert ahead(concurrency=4, handler=0.001, turn=0.1) == 500
    # Never more than a quarter of the lease of queued work per thread.
    assert ahead(handler=0.001, turn=10.0, lease=0.4) == 100
    assert ahead(handler=0.001, turn=10.0, lease=0.4, concurrency=2) == 200
    # Never fewer than one per thread.
    assert ahead(concurrency=6, handler=0.049, lease=0.01) == 6


def test_a_wake_up_is_kept_until_a_claim_can_take_it():
    """The listener's wake-up is latched: one that comes while no slot is free still ends the
    sleep of the first turn that has a slot, and only a claim clears it."""
    import threading

    worker = Worker(worker_id="w", concurrency=1)
    worker._kinds = ["test.ok"]

    def sleeper() -> threading.Thread:
        thread = threading.Thread(target=worker._sleep, args=(300,), daemon=True)
        thread.start()
        return thread

    worker._running["busy"] = object()  # type: ignore[assignment]  # the one slot is taken
    worker._announced()
    assert not worker._turn_due(), "no free slot: the turn waits for one"
    thread = sleeper()
    thread.join(0.2)
    assert thread.is_alive(), "a full worker sleeps on"
    del worker._running["busy"]
    worker._wake.set()  # the handler finished (its outcome settled)
    thread.join(30)
    assert not thread.is_alive()
    assert worker._new_work.is_set() and worker._turn_due(), "the wake-up outlived the full turn"
    thread = sleeper()
    thread.join(30)
    assert not thread.is_alive(), "a latched wake-up and a free slot: no sleep"
    worker._new_work.clear()  # what a claim does first
    thread = sleeper()
    thread.join(0.2)
    assert thread.is_alive()
    worker._announced()  # a wake-up in the middle of the sleep ends it
    thread.join(30)
    assert not thread.is_alive()
