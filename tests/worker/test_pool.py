"""The handler pool with real threads and fake handlers: outcomes handed to what is held,
deadlines and timeouts, stuck threads and the give-up, late outcomes dropped. No database:
the runs are built in memory."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_durable_scheduler import signals
from django_durable_scheduler.exceptions import HandlerTimeout, PermanentFailure, Retry
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.rules.outcomes import Outcome
from django_durable_scheduler.worker import Worker
from django_durable_scheduler.worker.pool import EXIT_STUCK, HandlerPool, call_handler
from django_durable_scheduler.worker.runs import Held, Run

LOG = "django_durable_scheduler"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def kinds() -> Iterator[Callable[..., str]]:
    """``register(func, timeout=None)`` registers ``func`` under a new kind until the test ends."""
    registered: list[str] = []

    def register(func: Callable[[Any], Any], timeout: float | None = None) -> str:
        kind = f"test.pool-{len(registered)}"
        registry.handler(kind, timeout=timeout)(func)
        registered.append(kind)
        return kind

    yield register
    for kind in registered:
        registry.unregister(kind)


def run_of(kind: str, n: int = 0, timeout: float | None = None) -> Run:
    occurrence = Occurrence(
        occurrence_id=f"occ-{kind}-{n}",
        job_id="job",
        scheduled_for=NOW,
        available_at=NOW,
        attempt=1,
        max_attempts=3,
        fence=1,
        authority={"principal": {"type": "user", "id": "ann"}},
        created_at=NOW,
        updated_at=NOW,
    )
    occurrence.claimed_kind = kind
    return Run.of(occurrence, owner="w-pool", using=None, default_timeout=timeout)


class Pool:
    """A started pool of ``concurrency`` threads, what it hands over, and what it learnt."""

    def __init__(self, concurrency: int) -> None:
        self.woken = threading.Event()
        self.learnt: list[float] = []
        self.held = Held(self.woken.set)
        self.pool = HandlerPool(
            concurrency=concurrency,
            held=self.held,
            wake=self.woken.set,
            learn=self.learnt.append,
            sender=Worker,
            worker_id="w-pool",
        )
        self.pool.start()

    def submit(self, *runs: Run) -> None:
        self.held.add(list(runs))
        self.pool.submit(list(runs))

    def wait_finished(self, n: int) -> list[Run]:
        deadline = time.monotonic() + 30
        while self.held.finished < n:
            assert time.monotonic() < deadline, f"{self.held.finished} of {n} finished"
            self.woken.wait(0.05)
            self.woken.clear()
        return self.held.take_finished()


@pytest.fixture
def pool() -> Iterator[Callable[[int], Pool]]:
    started: list[Pool] = []

    def start(concurrency: int = 2) -> Pool:
        started.append(Pool(concurrency))
        return started[-1]

    yield start
    for each in started:
        each.pool.drop_queued()
        each.pool.stop()


def test_the_threads_run_the_handlers_and_hand_over_their_outcomes(pool, kinds):
    threads: set[str] = set()
    gate = threading.Barrier(2, timeout=30)

    def handler(ctx):
        threads.add(threading.current_thread().name)
        gate.wait()  # both threads run at once
        return {"payload": ctx.payload, "occurrence": ctx.occurrence_id}

    kind = kinds(handler)
    running = pool(2)
    runs = [run_of(kind, n) for n in range(2)]
    running.submit(*runs)
    finished = running.wait_finished(2)
    assert sorted(run.occurrence.pk for run in finished) == sorted(run.occurrence.pk for run in runs)
    assert {run.outcome.status for run in finished} == {"succeeded"}
    assert finished[0].outcome.result["occurrence"] == finished[0].occurrence.pk
    assert threads == {"dsch-run-0", "dsch-run-1"}
    assert len(running.learnt) == 2 and all(run.ran > 0 for run in finished)
    assert running.pool.stuck == 0 and running.pool.queued == 0


def test_a_run_past_its_timeout_is_failed_and_its_late_outcome_dropped(pool, kinds, caplog):
    release, started = threading.Event(), threading.Event()

    def hang(ctx):
        started.set()
        release.wait(30)
        return "late"

    kind = kinds(hang, timeout=0.05)
    running = pool(1)
    run = run_of(kind)
    assert run.timeout == 0.05
    running.pool.expire()  # nothing has a deadline yet
    running.submit(run)
    assert started.wait(30)
    deadline = running.pool.next_deadline()
    assert deadline is not None
    assert running.pool.sleep_limit(300) <= 0.05, "the loop's sleep ends at the deadline"
    running.pool.awake()
    time.sleep(max(0.0, deadline - time.monotonic()) + 0.01)
    with caplog.at_level(logging.WARNING, logger=LOG):
        running.pool.expire()
    (failed,) = running.wait_finished(1)
    assert failed is run and run.context.lease_lost and run.ran == 0.05
    assert run.outcome.error["type"] == "HandlerTimeout"
    assert "hang" in run.outcome.error["traceback"], "where the thread is stuck"
    assert isinstance(run.outcome.exception, HandlerTimeout)
    assert (running.pool.stuck, running.pool.all_stuck()) == (1, True)
    (warning,) = [r for r in caplog.records if "failing it" in r.getMessage()]
    assert "(1 of 1 stuck)" in warning.getMessage() and warning.scheduler_timeout == 0.05
    with caplog.at_level(logging.ERROR, logger=LOG):
        assert running.pool.give_up() == EXIT_STUCK
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert (
        f"all 1 handler threads are stuck in handlers past their timeout (kinds {kind})" in error.getMessage()
    )

    running.woken.clear()
    with caplog.at_level(logging.WARNING, logger=LOG):
        release.set()
        assert running.woken.wait(30), "a thread free again wakes the loop"
    assert running.pool.stuck == 0 and running.held.finished == 0, "the late outcome is dropped"
    assert any("its outcome (succeeded) is dropped" in r.getMessage() for r in caplog.records)


def test_a_run_that_starts_before_the_end_of_the_loops_sleep_wakes_it(pool, kinds):
    release = threading.Event()
    kind = kinds(lambda ctx: release.wait(30), timeout=5)
    running = pool(1)
    assert running.pool.sleep_limit(300) == 300  # no deadline yet
    running.submit(run_of(kind))
    assert running.woken.wait(30), "its deadline comes before the sleep ends"
    limit = running.pool.sleep_limit(300)
    assert 0 < limit <= 5, "the next sleep ends at the deadline"
    running.pool.awake()
    running.woken.clear()
    release.set()
    running.wait_finished(1)
    running.woken.clear()
    running.submit(run_of(kind, 1))  # each run's time is learnt
    running.wait_finished(1)
    assert running.learnt and len(running.learnt) == 2


def test_queued_runs_dropped_never_start(pool, kinds):
    release = threading.Event()
    started: list[str] = []

    def handler(ctx):
        started.append(ctx.occurrence_id)
        release.wait(30)

    kind = kinds(handler)
    running = pool(1)
    first, second = run_of(kind, 0), run_of(kind, 1)
    running.submit(first, second)
    deadline = time.monotonic() + 30
    while not started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert running.pool.queued == 1
    running.pool.drop_queued()
    release.set()
    running.wait_finished(1)
    assert started == [first.occurrence.pk] and running.pool.queued == 0


def test_the_started_signal_is_sent_with_the_worker_as_sender(pool, kinds):
    got: list[dict[str, Any]] = []

    def receiver(sender, **kwargs):
        got.append({"sender": sender, **kwargs})

    signals.occurrence_started.connect(receiver)
    try:
        running = pool(1)
        run = run_of(kinds(lambda ctx: None, timeout=2))
        running.submit(run)
        running.wait_finished(1)
    finally:
        signals.occurrence_started.disconnect(receiver)
    (sent,) = got
    assert sent["sender"] is Worker and sent["worker_id"] == "w-pool" and sent["occurrence"] is run.occurrence
    assert (sent["attempt"], sent["timeout"]) == (1, 2.0)


def test_a_handler_outcome_is_what_it_returned_or_raised(kinds, settings):
    settings.DURABLE_SCHEDULER_CLOCK = lambda: NOW

    def later(ctx):
        raise Retry(delay=timedelta(seconds=30))

    def never(ctx):
        raise PermanentFailure("no such account", code="E_ACCOUNT")

    def broken(ctx):
        raise RuntimeError("boom")

    run = run_of(kinds(lambda ctx: [1, 2]))
    assert call_handler(run.context) == Outcome(run.occurrence.pk, run.occurrence.fence, "succeeded", [1, 2])
    retry = call_handler(run_of(kinds(later)).context)
    assert (retry.error["type"], retry.retry_at) == ("Retry", NOW + timedelta(seconds=30))
    assert isinstance(retry.exception, Retry)
    permanent = call_handler(run_of(kinds(never)).context)
    assert (permanent.retryable, permanent.error["code"]) == (False, "E_ACCOUNT")
    failed = call_handler(run_of(kinds(broken)).context)
    assert failed.error["message"] == "boom" and "RuntimeError: boom" in failed.error["traceback"]
    assert failed.retryable, "an exception is retried"
    run = run_of("test.pool-unregistered")
    assert call_handler(run.context) == Outcome(
        run.occurrence.pk,
        run.occurrence.fence,
        "failed",
        error={"message": "no handler for kind 'test.pool-unregistered'"},
        retryable=True,
    )


def test_a_run_whose_lease_is_known_lost_never_starts(pool, kinds, caplog):
    """Marked lost (the heartbeat found it so) or past the end of its lease (the worker was
    stopped while it waited): the handler is not called, nothing is handed over to settle, and
    the run is no longer held, nor counted as processed; one warning line each."""
    started: list[str] = []
    kind = kinds(lambda ctx: started.append(ctx.occurrence_id) or "ran")
    running = pool(1)
    marked, expired, live = run_of(kind, 0), run_of(kind, 1), run_of(kind, 2)
    marked.context.mark_lease_lost()
    expired.lease_until = time.monotonic()
    live.lease_until = time.monotonic() + 60
    with caplog.at_level(logging.WARNING, logger=LOG):
        running.submit(marked, expired, live)
        (finished,) = running.wait_finished(1)
    assert finished is live and started == [live.occurrence.pk]
    assert len(running.held) == 1 and running.held.processed == 0  # live waits to be settled
    assert marked.forgotten and expired.forgotten and expired.context.lease_lost
    dropped = [r for r in caplog.records if "lease lost before its handler started" in r.getMessage()]
    assert [r.scheduler_occurrence_id for r in dropped] == [marked.occurrence.pk, expired.occurrence.pk]
    why = "lease lost before its handler started (attempt 1/3, fence 1): not running it"
    assert dropped[0].getMessage() == f"{marked.occurrence.pk}: {why}"
