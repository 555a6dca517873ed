"""Handler timeouts: a handler that never returns is failed at its timeout (retried, then
dead-lettered), its late outcome is dropped, and a worker whose every thread is stuck exits
for its supervisor to restart it. Real ``runscheduler`` processes; the settings and the
precedence of the timeouts are checked in process."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Job, Occurrence
from django_durable_scheduler.worker import EXIT_STUCK
from django_durable_scheduler.worker.runs import timeout_of

from ..conftest import AUTHORITY
from ..procs.runner import Workers, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def make(job_id: str, kind: str, n: int = 1, payload=None, **job) -> list[Occurrence]:
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job(job_id, kind, authority=AUTHORITY, payload=payload, **job)
    return [
        scheduler.enqueue(job_id, scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")[0]
        for i in range(n)
    ]


def events(occurrence: Occurrence) -> list[str]:
    return [event.event_type for event in reversed(scheduler.history(occurrence_id=occurrence.pk))]


def test_a_hung_handler_is_retried_then_dead_lettered_and_its_late_result_dropped(workers):
    fast_retry = {"retry_base_delay": 0.05, "retry_max_delay": 0.05}
    # The handler's own timeout (0.3 s): it never returns.
    (hung,) = make("hung", "test.hang", max_attempts=2, **fast_retry)
    # A job's timeout overrides the handler's (none here): it returns after 0.8 s, too late.
    (late,) = make("late", "test.sleep", payload={"seconds": 0.8}, max_attempts=1, timeout=0.3)
    worker = workers.start("--concurrency", "4", "--worker-id", "w-timeout", "--grace", "1")

    def settled() -> bool:
        dead = Occurrence.objects.filter(pk=hung.pk, status="dead_letter").exists()
        return dead and "is dropped" in worker.output()

    assert wait_for(settled, timeout=60), worker.output()
    hung.refresh_from_db()
    late.refresh_from_db()

    assert (hung.status, hung.attempt) == ("dead_letter", 2), worker.output()
    assert hung.last_error["type"] == "HandlerTimeout"
    assert "did not return within its timeout of 0.3 s" in hung.last_error["message"]
    assert "threading.py" in hung.last_error["traceback"]  # where the thread was stuck
    assert events(hung) == [
        "occurrence_enqueued",
        "occurrence_claimed",
        "occurrence_retry_scheduled",
        "occurrence_claimed",
        "occurrence_dead_lettered",
    ]

    # Settled as timed out; the result that came later never overwrote it.
    assert (late.status, late.result, late.last_error["type"]) == ("dead_letter", None, "HandlerTimeout")
    assert "timeout of 0.3 s" in late.last_error["message"]
    assert "occurrence_succeeded" not in events(late)
    assert late.lease_owner is None  # not renewed after the timeout, nor afterwards

    log = worker.output(100_000)
    assert f"{late.pk}: the handler returned" in log and "its outcome (succeeded) is dropped" in log
    assert f"{hung.pk} retry_wait job=hung kind=test.hang attempt=1/2" in log
    assert f"{hung.pk} dead_letter job=hung kind=test.hang attempt=2/2" in log
    # Logged with the exception (levels and fields: tests/telemetry/test_observability.py).
    assert "django_durable_scheduler.exceptions.HandlerTimeout: the handler of kind 'test.hang'" in log

    worker.proc.send_signal(signal.SIGTERM)  # stuck threads do not hold up the exit
    assert worker.wait(30) == 0, worker.output()


def test_a_worker_whose_every_thread_is_stuck_exits_for_a_restart(workers):
    hung = make("hung", "test.hang", n=3)
    worker = workers.start("--concurrency", "2", "--worker-id", "w-stuck")
    assert worker.wait(60) == EXIT_STUCK, worker.output()
    log = worker.output(100_000)
    errors = [line for line in log.splitlines() if "threads are stuck" in line]
    assert len(errors) == 1, log
    assert "all 2 handler threads are stuck in handlers past their timeout (kinds test.hang)" in errors[0]
    assert f"exiting with code {EXIT_STUCK}" in errors[0]
    statuses = sorted(Occurrence.objects.filter(pk__in=[o.pk for o in hung]).values_list("status", flat=True))
    # The two that ran were failed (to retry later); the third was never claimed.
    assert statuses == ["queued", "retry_wait", "retry_wait"], log
    assert not Occurrence.objects.filter(status="running").exists()


# --------------------------------------------------------------------------- in process


def test_the_jobs_timeout_overrides_the_handlers_which_overrides_the_setting(settings):
    registry.autodiscover()
    make("own", "test.hang", timeout=timedelta(seconds=2))
    make("handler", "test.hang")
    make("default", "test.ok")
    settings.DURABLE_SCHEDULER_HANDLER_TIMEOUT = 5
    claimed = {o.job_id: o for o in scheduler.claim_batch(owner="w", lease=30, limit=10)}
    assert Job.objects.get(pk="own").timeout_ms == 2000
    assert timeout_of(claimed["own"], 5.0) == 2.0
    assert timeout_of(claimed["handler"], 5.0) == 0.3
    assert timeout_of(claimed["default"], 5.0) == 5.0
    assert timeout_of(claimed["default"], None) is None


@pytest.mark.parametrize("value", [0, -1, "5", True, timedelta(days=40)])
def test_a_bad_timeout_is_refused_naming_the_field(value):
    with pytest.raises(InvalidArgument) as raised:
        scheduler.handler("test.bad-timeout", timeout=value)
    assert raised.value.details["field"] == "timeout"
    scheduler.ensure_policy(AUTHORITY)
    with pytest.raises(InvalidArgument) as raised:
        scheduler.create_job("bad-timeout", "test.ok", authority=AUTHORITY, timeout=value)
    assert raised.value.details["field"] == "timeout"
    assert not Job.objects.filter(pk="bad-timeout").exists()
    job = scheduler.create_job("good-timeout", "test.ok", authority=AUTHORITY)
    with pytest.raises(InvalidArgument):
        scheduler.update_job("good-timeout", expected_revision=job.revision, timeout=value)
    updated = scheduler.update_job("good-timeout", expected_revision=job.revision, timeout=1.5)
    assert (updated.revision, updated.timeout_ms) == (2, 1500)


def test_the_handler_timeout_setting_accepts_seconds_and_timedeltas(settings):
    from django_durable_scheduler import conf

    assert conf.settings.HANDLER_TIMEOUT is None
    settings.DURABLE_SCHEDULER_HANDLER_TIMEOUT = timedelta(minutes=2)
    assert conf.settings.HANDLER_TIMEOUT == 120.0
    settings.DURABLE_SCHEDULER_HANDLER_TIMEOUT = 1
    assert conf.settings.HANDLER_TIMEOUT == 1.0
