"""What a handler raises that is no ``Exception`` (``sys.exit()``, KeyboardInterrupt,
GeneratorExit, a BaseException of its own) fails its run like any error: recorded with its
class and traceback, counted as an attempt, retried or dead-lettered by its job's rules, and
its handler thread goes on. Real ``runscheduler`` processes: before this, such a run held its
lease for ever and ``--burst`` never exited."""

from __future__ import annotations

import signal
import subprocess
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.worker.context import ExecutionContext
from django_durable_scheduler.worker.pool import call_handler

from ..conftest import AUTHORITY
from ..procs.runner import Worker, Workers, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Each mode of the test.raise-base handler and the class its failure is recorded as.
RAISED = {
    "exit": "SystemExit",
    "interrupt": "KeyboardInterrupt",
    "generator-exit": "GeneratorExit",
    "custom": "Abort",
    "async-exit": "SystemExit",
}


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def enqueue(job_id: str, payloads: list[dict[str, Any]], **job: Any) -> list[Occurrence]:
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job(job_id, "test.raise-base", authority=AUTHORITY, **job)
    slot = 1_700_000_000_000
    return [
        scheduler.enqueue(job_id, scheduled_for=slot + i, trigger_key=f"t{i}", payload=payload)[0]
        for i, payload in enumerate(payloads)
    ]


def error_of(occurrence: Occurrence) -> dict[str, Any]:
    """The error the occurrence's last failure stored (read fresh)."""
    occurrence.refresh_from_db()
    assert isinstance(occurrence.last_error, dict), occurrence.last_error
    return occurrence.last_error


def finish(worker: Worker, timeout: float = 60) -> int:
    """The burst worker's exit code; a worker still running after ``timeout`` fails the test."""
    try:
        return worker.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"runscheduler --burst did not exit:\n{worker.output()}")


def events(occurrence: Occurrence) -> list[str]:
    return [event.event_type for event in reversed(scheduler.history(occurrence_id=occurrence.pk))]


def test_each_base_exception_dead_letters_its_run_and_the_thread_runs_the_next(workers):
    raising = enqueue("raise-once", [{"mode": mode} for mode in RAISED], max_attempts=1)
    fine = enqueue("fine", [{"mode": "ok"}] * 3)
    # One handler thread: the runs after a raising one show that it lived on.
    worker = workers.start("--burst", "--concurrency", "1", "--worker-id", "w-base")
    assert finish(worker) == 0, worker.output()
    for occurrence in raising:
        error = error_of(occurrence)
        expected = RAISED[str(occurrence.payload and occurrence.payload["mode"])]
        assert (occurrence.status, occurrence.attempt, occurrence.lease_owner) == ("dead_letter", 1, None)
        assert error["type"] == expected, error
        assert f"{expected}: handler" in error["traceback"], error
        assert "tests/testapp/tasks.py" in error["traceback"], error
    for occurrence in fine:
        occurrence.refresh_from_db()
        assert (occurrence.status, occurrence.result) == ("succeeded", {"attempt": 1})
    assert "dead_letter" in worker.output(100_000)


def test_a_base_exception_counts_as_an_attempt_and_is_retried(workers):
    fast = {"retry_base_delay": 0.05, "retry_max_delay": 0.05}
    modes = ("exit", "interrupt", "custom")
    recovers = enqueue("recovers", [{"mode": mode, "until": 2} for mode in modes], max_attempts=3, **fast)
    (doomed,) = enqueue("doomed", [{"mode": "interrupt"}], max_attempts=2, **fast)
    # Not --burst: it exits when nothing is due, before a retry's backoff has passed.
    worker = workers.start("--concurrency", "2", "--worker-id", "w-retry", "--grace", "1")
    ids = [occurrence.pk for occurrence in (*recovers, doomed)]
    settled = wait_for(
        lambda: Occurrence.objects.filter(pk__in=ids, settled_at__isnull=False).count() == 4, 60
    )
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert settled, worker.output()
    for occurrence in recovers:
        occurrence.refresh_from_db()
        assert (occurrence.status, occurrence.attempt, occurrence.result) == ("succeeded", 2, {"attempt": 2})
        assert events(occurrence) == [
            "occurrence_enqueued",
            "occurrence_claimed",
            "occurrence_retry_scheduled",
            "occurrence_claimed",
            "occurrence_succeeded",
        ]
    assert error_of(doomed)["type"] == "KeyboardInterrupt"
    assert (doomed.status, doomed.attempt) == ("dead_letter", 2)


def test_a_stopped_worker_does_not_give_back_a_run_that_exited(workers):
    """Before, the run stayed running until the stop gave it back, due again at attempt 0,
    so a job of one attempt never dead-lettered it."""
    (occurrence,) = enqueue("exits", [{"mode": "exit"}], max_attempts=1)
    worker = workers.start("--worker-id", "w-stop", "--grace", "1")
    settled = wait_for(lambda: Occurrence.objects.filter(pk=occurrence.pk, settled_at__isnull=False).exists())
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert settled, worker.output()
    assert error_of(occurrence)["type"] == "SystemExit"
    assert (occurrence.status, occurrence.attempt) == ("dead_letter", 1)


def test_a_keyboard_interrupt_in_the_main_thread_is_still_a_stop():
    """Python raises KeyboardInterrupt for SIGINT in the main thread only: there it stops the
    process rather than fail a run (handler threads never see a signal's)."""
    assert threading.current_thread() is threading.main_thread()
    context = ExecutionContext(
        occurrence_id="o1",
        job_id="j1",
        kind="test.raise-base",
        attempt=1,
        max_attempts=1,
        fence=1,
        scheduled_for=datetime.now(UTC),
        payload={"mode": "interrupt"},
        authority={},
    )
    with pytest.raises(KeyboardInterrupt):
        call_handler(context)
