"""The Worker loop, in process (threads run handlers, the database is real)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.worker import Waker, Worker

from ..conftest import AUTHORITY

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


def test_the_worker_counts_what_it_processed_and_stops_on_request():
    make("test.ok", 3)
    worker = Worker(worker_id="w", max_occurrences=3, concurrency=2, poll_interval=0.05)
    assert (worker.processed, worker.stopping) == (0, False)
    assert worker.run() == 0
    assert worker.processed == 3
    stopped = Worker(worker_id="w2", poll_interval=300)
    stopped.stop()
    assert stopped.stopping and stopped.waker.event.is_set()
    assert stopped.run() == 0  # stopped before its first turn: it exits at once


# --------------------------------------------------------------------------- the wake-up latch


def sleeper(waker: Waker, free: list[int], busy: bool = False) -> threading.Thread:
    """The loop's sleep, in a thread: it may claim while ``free[0]`` slots are free."""
    thread = threading.Thread(
        target=waker.sleep,
        args=(300,),
        kwargs={"busy": lambda: busy, "can_claim": lambda: free[0] > 0},
        daemon=True,
    )
    thread.start()
    return thread


def test_a_wake_up_is_kept_until_a_claim_can_take_it():
    """The listener's wake-up is latched: one that comes while no slot is free still ends the
    sleep of the first turn that has a slot, and only a claim clears it."""
    waker = Waker()
    free = [0]  # the one slot is taken
    waker.announce()
    thread = sleeper(waker, free)
    thread.join(0.2)
    assert thread.is_alive(), "a full worker sleeps on"
    free[0] = 1
    waker.ring()  # the handler finished (its outcome settled)
    thread.join(30)
    assert not thread.is_alive()
    assert waker.announced, "the wake-up outlived the full turn"
    thread = sleeper(waker, free)
    thread.join(30)
    assert not thread.is_alive(), "a latched wake-up and a free slot: no sleep"
    waker.claiming()  # what a claim does first
    assert not waker.announced
    thread = sleeper(waker, free)
    thread.join(0.2)
    assert thread.is_alive()
    waker.announce()  # a wake-up in the middle of the sleep ends it
    thread.join(30)
    assert not thread.is_alive()


def test_the_sleep_ends_at_its_limit_and_not_at_all_when_there_is_work():
    waker = Waker()
    started = time.monotonic()
    waker.sleep(300, busy=lambda: False, can_claim=lambda: True, limit=lambda timeout: 0.05)
    assert 0.04 <= time.monotonic() - started < 30, "a run's deadline cuts the sleep"
    thread = sleeper(waker, [0], busy=True)  # outcomes to settle, or stopping
    thread.join(30)
    assert not thread.is_alive()
    waker.event.set()
    waker.sleep(0.01, busy=lambda: False, can_claim=lambda: False)
    assert not waker.event.is_set(), "the sleep clears the event before it looks"


# --------------------------------------------------------------------------- a turn's order


@pytest.mark.parametrize("woken", [True, False])
def test_a_turn_woken_for_new_work_claims_before_it_settles(monkeypatch, woken):
    """New work announced while an outcome waits to be settled is claimed first: its pickup
    does not wait for the settle's transaction. A turn not woken so settles first."""
    from django_durable_scheduler.worker import claims, outcomes

    make("test.ok", 1)
    worker = Worker(worker_id="w-order", concurrency=2, poll_interval=300)
    worker.pool.start()
    try:
        worker.claimed_kinds = worker.kinds()
        assert len(worker.claim(1, worker.claimed_kinds)) == 1
        deadline = time.monotonic() + 30
        while worker.held.counts()[1] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler finishes; its outcome waits for a turn
        scheduler.enqueue("test.ok", scheduled_for=1_700_000_000_999, trigger_key="new")
        order: list[str] = []
        claim, settle = claims.kernel.claim_authorized, outcomes.kernel.settle_many
        monkeypatch.setattr(
            claims.kernel, "claim_authorized", lambda **kw: order.append("claim") or claim(**kw)
        )
        monkeypatch.setattr(
            outcomes.kernel, "settle_many", lambda *a, **kw: order.append("settle") or settle(*a, **kw)
        )
        if woken:
            worker.waker.announce()
        worker.turn()
        assert order == (["claim", "settle"] if woken else ["settle", "claim"])
    finally:
        worker.stop()
        worker.shutdown()
