"""Cancelling a running occurrence: the request (fenced, recorded with who asked), how the
attempt then ends (cancelled, never retried, its reservation settled), what the handler sees
(``ctx.cancel_requested``, ``ctx.raise_if_cancelled()``, an async handler cancelled at its next
await), and real ``runscheduler`` processes stopping handlers, including after a SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.exceptions import (
    InvalidArgument,
    InvalidState,
    NotFound,
    OccurrenceCancelled,
    SchedulerError,
)
from django_durable_scheduler.models import AuthorityReservation, Event, Occurrence, OccurrenceStatus
from django_durable_scheduler.worker.context import ExecutionContext

from ..conftest import CLOCK_START, snapshot
from ..procs.runner import Workers, granted, wait_for

OWNER = "w1"
LEASE = 30


def _running(clock, key: str = "t") -> Occurrence:
    kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key=key)
    (row,) = kernel.claim_batch(owner=OWNER, lease=LEASE, sweep_expired=False)
    return row


def _events(pk: str, event_type: str) -> list[Event]:
    return list(Event.objects.filter(occurrence_id=pk, event_type=event_type).order_by("event_id"))


# --------------------------------------------------------------------------- the kernel


def test_a_request_is_recorded_and_a_failure_after_it_ends_cancelled(job, clock):
    row = _running(clock)
    asked = kernel.cancel(row.pk, reason="wrong customer", requested_by="alice")
    assert asked.status == OccurrenceStatus.RUNNING and asked.cancel_requested_at == clock()
    assert asked.cancel_requested_fence == row.fence and asked.max_attempts == row.attempt == 1
    (event,) = _events(row.pk, "occurrence_cancel_requested")
    assert event.data == {"reason": "wrong customer", "requestedBy": "alice", "attempt": 1, "maxAttempts": 3}
    assert (event.owner_id, event.fence) == (OWNER, row.fence)
    # The renewal the heartbeat makes reads the request back.
    renewed = kernel.renew(row.pk, owner=OWNER, fence=row.fence, lease=LEASE)
    assert renewed.cancel_requested_fence == renewed.fence
    # A retryable failure is not retried: the attempt ends cancelled.
    clock.advance(1)
    ended = kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome="failed", error="stopped")
    assert ended.status == OccurrenceStatus.CANCELLED and ended.settled_at == clock()
    assert ended.last_error == {
        "code": "SCHEDULER_CANCELLED",
        "message": "cancel requested while running",
        "error": {"message": "stopped"},
    }
    stored = Occurrence.objects.get(pk=row.pk)
    assert (stored.lease_owner, stored.lease_expires_at, stored.attempt) == (None, None, 1)
    (cancelled,) = _events(row.pk, "occurrence_cancelled")
    assert cancelled.data["reason"] == "cancel_requested" and cancelled.fence == row.fence


def test_a_success_after_the_request_is_kept(job, clock):
    row = _running(clock)
    kernel.cancel(row.pk, reason="too late")
    done = kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome="succeeded", result={"sent": 1})
    assert done.status == OccurrenceStatus.SUCCEEDED and done.result == {"sent": 1}
    (event,) = _events(row.pk, "occurrence_succeeded")
    assert event.data["cancelRequested"] is True


def test_asking_twice_writes_once_and_waiting_ones_are_cancelled_as_before(job, clock):
    row = _running(clock)
    kernel.cancel(row.pk, requested_by="alice")
    before = snapshot()
    again = kernel.cancel(row.pk, requested_by="bob")
    assert again.cancel_requested_fence == row.fence and snapshot() == before
    waiting, _ = kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key="w")
    cancelled = kernel.cancel(waiting.pk, reason="not needed", requested_by="carol")
    assert cancelled.status == OccurrenceStatus.CANCELLED
    (event,) = _events(waiting.pk, "occurrence_cancelled")
    assert event.data == {"reason": "not needed", "previousStatus": "queued", "requestedBy": "carol"}


def test_release_of_an_attempt_asked_to_stop_cancels_it(job, clock):
    row = _running(clock)
    kernel.cancel(row.pk)
    released = kernel.release(row.pk, owner=OWNER, fence=row.fence)
    assert released.status == OccurrenceStatus.CANCELLED and released.attempt == 1


def test_the_request_is_fenced_to_its_attempt(job, clock):
    """A request names its attempt: one for attempt 1 is refused once attempt 2 holds the
    lease, and attempt 2 never sees a request. And an attempt asked to stop is not reclaimed
    after its lease expires: the expiry sweep ends it cancelled."""
    first = _running(clock)
    clock.advance(LEASE + 1)
    (second,) = kernel.claim_batch(owner="w2", lease=LEASE, sweep_expired=False)
    assert (second.pk, second.fence, second.attempt) == (first.pk, 2, 2)
    before = snapshot()
    with pytest.raises(InvalidState, match="not 1"):
        kernel.cancel(first.pk, fence=first.fence, requested_by="alice")
    assert snapshot() == before
    renewed = kernel.renew(second.pk, owner="w2", fence=second.fence, lease=LEASE)
    assert renewed.cancel_requested_fence is None
    # Now for attempt 2; then its lease runs out: no attempt 3.
    kernel.cancel(second.pk, fence=second.fence)
    clock.advance(LEASE + 1)
    assert kernel.claim_batch(owner="w3", lease=LEASE, sweep_expired=False) == []
    assert kernel.dead_letter_expired() == 1
    ended = Occurrence.objects.get(pk=first.pk)
    assert (ended.status, ended.attempt, ended.fence) == (OccurrenceStatus.CANCELLED, 2, 2)
    assert ended.last_error["error"]["code"] == "SCHEDULER_LEASE_EXPIRED"
    (event,) = _events(first.pk, "occurrence_cancelled")
    assert (event.owner_id, event.fence) == ("w2", 2)


def test_bad_input_is_refused_and_writes_nothing(job, clock):
    row = _running(clock)
    done, _ = kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key="done")
    kernel.cancel(done.pk)
    before = snapshot()
    with pytest.raises(NotFound, match="occ-missing"):
        kernel.cancel("occ-missing", requested_by="alice")
    with pytest.raises(InvalidState, match="is cancelled"):
        kernel.cancel(done.pk)
    for field, kwargs in (
        ("requested_by", {"requested_by": 7}),
        ("requested_by", {"requested_by": " "}),
        ("requested_by", {"requested_by": "x" * 300}),
        ("fence", {"fence": 0}),
        ("fence", {"fence": "one"}),
        ("reason", {"reason": 3}),
    ):
        with pytest.raises(InvalidArgument) as caught:
            kernel.cancel(row.pk, **kwargs)
        assert caught.value.field == field
    with pytest.raises(InvalidState, match="only running"):
        kernel.cancel(done.pk, fence=1)  # naming an attempt: only a running one
    assert snapshot() == before


# --------------------------------------------------------------------------- the context


def _context() -> ExecutionContext:
    return ExecutionContext(
        occurrence_id="occ-1",
        job_id="job-a",
        kind="k",
        attempt=1,
        max_attempts=3,
        fence=1,
        scheduled_for=CLOCK_START,
        payload=None,
        authority={},
    )


def test_raise_if_cancelled():
    ctx = _context()
    ctx.raise_if_cancelled()  # nothing asked: nothing raised
    assert not ctx.cancel_requested
    ctx.mark_cancel_requested()
    assert ctx.cancel_requested
    with pytest.raises(OccurrenceCancelled) as caught:
        ctx.raise_if_cancelled()
    assert isinstance(caught.value, SchedulerError) and caught.value.code == "SCHEDULER_CANCELLED"
    assert scheduler.OccurrenceCancelled is OccurrenceCancelled


def test_an_async_handler_is_cancelled_at_its_next_await():
    ctx = _context()
    reached: list[str] = []

    async def handler() -> str:
        reached.append("before")
        try:
            await asyncio.sleep(60)
        finally:
            reached.append("cancelled at the await")
        return "finished"

    threading.Timer(0.2, ctx.mark_cancel_requested).start()  # from another thread, as the heartbeat
    with pytest.raises(OccurrenceCancelled):
        ctx.run_coroutine(handler())
    assert reached == ["before", "cancelled at the await"]
    # Asked before it starts: it never runs.
    with pytest.raises(OccurrenceCancelled):
        ctx.run_coroutine(handler())
    assert reached == ["before", "cancelled at the await"]

    async def quick() -> int:
        await asyncio.sleep(0)
        return 7

    assert _context().run_coroutine(quick()) == 7


# --------------------------------------------------------------------------- real workers


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def _make(kind: str, *, payload=None) -> str:
    scheduler.create_job(kind, kind, authority=granted("cancel"), payload=payload, max_attempts=3)
    with transaction.atomic():
        return scheduler.enqueue(kind, scheduled_for=1_700_000_000_000, trigger_key="t")[0].pk


def _started(pk: str) -> bool:
    return Occurrence.objects.filter(pk=pk, metadata={"started": 1}).exists()


def _claims(pk: str) -> int:
    return Event.objects.filter(
        occurrence_id=pk, event_type__in=["occurrence_claimed", "occurrence_reclaimed"]
    ).count()


@pytest.mark.django_db(transaction=True)
def test_a_worker_stops_polling_ignoring_and_async_handlers(workers):
    """One worker runs three handlers: one polls ``ctx.cancel_requested``, one ignores it until
    its timeout, one is async. Each is asked to stop and ends cancelled, not retried, its
    reservation settled, the request's event naming who asked."""
    ids = {kind: _make(kind) for kind in ("test.cancel-poll", "test.cancel-ignore", "test.cancel-async")}
    worker = workers.start("--worker-id", "A", "--lease", "2", "--concurrency", "4")
    assert wait_for(lambda: all(_started(pk) for pk in ids.values()), 60), worker.output()
    for kind, pk in ids.items():
        kernel.cancel(pk, reason=f"stop {kind}", requested_by="ops@example.com")

    def ended() -> bool:
        return Occurrence.objects.filter(pk__in=ids.values(), status="cancelled").count() == len(ids)

    assert wait_for(ended, 60), worker.output()
    handler_errors = {"test.cancel-poll": "OccurrenceCancelled", "test.cancel-ignore": "HandlerTimeout"}
    handler_errors["test.cancel-async"] = "OccurrenceCancelled"
    for kind, pk in ids.items():
        occ = Occurrence.objects.get(pk=pk)
        assert (occ.attempt, occ.fence, occ.lease_owner) == (1, 1, None), kind
        assert occ.last_error["code"] == "SCHEDULER_CANCELLED"
        assert occ.last_error["error"]["type"] == handler_errors[kind], occ.last_error
        (asked,) = _events(pk, "occurrence_cancel_requested")
        assert asked.data["requestedBy"] == "ops@example.com" and asked.data["reason"] == f"stop {kind}"
        (ended_event,) = _events(pk, "occurrence_cancelled")
        assert (ended_event.owner_id, ended_event.fence) == ("A", 1)
        reservation = AuthorityReservation.objects.get(occurrence_id=pk)
        assert reservation.status == "failed" and reservation.outcome["status"] == "cancelled"
        assert _claims(pk) == 1
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert all(_claims(pk) == 1 for pk in ids.values())  # nothing ran again


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_after_the_request_leaves_it_to_end_cancelled(workers):
    pk = _make("test.cancel-ignore", payload={"seconds": 120})
    a = workers.start("--worker-id", "A", "--lease", "2")
    assert wait_for(lambda: _started(pk), 60), a.output()
    kernel.cancel(pk, reason="stop", requested_by="ops")
    os.kill(a.pid, signal.SIGKILL)
    assert a.wait(30) == -signal.SIGKILL
    lease_end = Occurrence.objects.get(pk=pk).lease_expires_at
    b = workers.start("--worker-id", "B", "--lease", "2")
    assert wait_for(lambda: Occurrence.objects.filter(pk=pk, status="cancelled").exists(), 60), b.output()
    occ = Occurrence.objects.get(pk=pk)
    assert (occ.attempt, occ.fence, occ.lease_owner) == (1, 1, None)
    assert occ.settled_at is not None and lease_end is not None and occ.settled_at >= lease_end
    assert _claims(pk) == 1  # never reclaimed
    (ended,) = _events(pk, "occurrence_cancelled")
    assert (ended.owner_id, ended.fence, ended.data["reason"]) == ("A", 1, "lease_expired")
    assert AuthorityReservation.objects.get(occurrence_id=pk).status == "failed"
    b.proc.send_signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.output()
