"""What monitoring sees of the worker: log records at the level tools listen to, with the
exception and ``scheduler_*`` fields, and the signals of ``django_durable_scheduler.signals``
(a receiver that raises never breaks a run). In process: the records and the receivers are
this process's."""

from __future__ import annotations

import logging
from collections import defaultdict

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import signals
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.worker import EXIT_STUCK, Worker

from ..conftest import AUTHORITY, authority_for

pytestmark = pytest.mark.django_db(transaction=True)

LOG = "django_durable_scheduler"
FIELDS = (
    "scheduler_occurrence_id",
    "scheduler_job_id",
    "scheduler_kind",
    "scheduler_attempt",
    "scheduler_max_attempts",
    "scheduler_principal",
)


@pytest.fixture(autouse=True)
def handlers():
    registry.autodiscover()


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO, logger=LOG)
    return caplog


def make(job_id, kind, n=1, authority=AUTHORITY, **job):
    scheduler.ensure_policy(authority)
    scheduler.create_job(job_id, kind, authority=authority, **job)
    return [
        scheduler.enqueue(job_id, scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")[0]
        for i in range(n)
    ]


def burst():
    return Worker(worker_id="w-obs", burst=True, concurrency=2, poll_interval=0.05).run()


def records_of(caplog, occurrence, status):
    return [
        r
        for r in caplog.records
        if r.name == LOG
        and getattr(r, "scheduler_occurrence_id", None) == occurrence.pk
        and getattr(r, "scheduler_status", None) == status
    ]


# --------------------------------------------------------------------------- logging


def test_a_retryable_failure_logs_a_warning_and_the_success_an_info_with_fields(log):
    (occ,) = make("flaky", "test.flaky", retry_base_delay=0.001, retry_max_delay=0.001)
    assert burst() == 0
    (failed,) = records_of(log, occ, "retry_wait")
    assert failed.levelno == logging.WARNING
    assert failed.exc_info is not None and isinstance(failed.exc_info[1], RuntimeError)
    assert failed.exc_info[2] is not None  # the traceback, for error trackers
    assert str(failed.exc_info[1]) == "first attempt fails"
    assert {name: getattr(failed, name) for name in FIELDS} == {
        "scheduler_occurrence_id": occ.pk,
        "scheduler_job_id": "flaky",
        "scheduler_kind": "test.flaky",
        "scheduler_attempt": 1,
        "scheduler_max_attempts": 3,
        "scheduler_principal": "user:alice",
    }
    assert failed.scheduler_error_type == "RuntimeError"
    assert "retry_wait job=flaky kind=test.flaky attempt=1/3" in failed.getMessage()
    assert "RuntimeError: first attempt fails" in failed.getMessage()

    (succeeded,) = records_of(log, occ, "succeeded")
    assert (succeeded.levelno, succeeded.exc_info, succeeded.scheduler_attempt) == (logging.INFO, None, 2)
    assert succeeded.scheduler_duration_ms >= 0


def test_a_dead_letter_logs_an_error_with_the_exception(log):
    (flaky,) = make("flaky", "test.flaky", max_attempts=1)
    (permanent,) = make("permanent", "test.permanent")
    (bad,) = make("bad", "test.bad-result")
    assert burst() == 0
    (record,) = records_of(log, flaky, "dead_letter")
    assert record.levelno == logging.ERROR
    assert isinstance(record.exc_info[1], RuntimeError) and record.exc_info[2] is not None
    assert (record.scheduler_attempt, record.scheduler_max_attempts) == (1, 1)
    (record,) = records_of(log, permanent, "dead_letter")
    assert record.levelno == logging.ERROR
    assert isinstance(record.exc_info[1], scheduler.PermanentFailure)
    # No exception to show when the result could not be stored: the reason is in the line.
    (record,) = records_of(log, bad, "dead_letter")
    assert (record.levelno, record.exc_info, record.scheduler_error_type) == (
        logging.ERROR,
        None,
        "InvalidResult",
    )


def test_a_retry_the_handler_asks_for_is_info(log):
    (occ,) = make("later", "test.retry-later")
    assert burst() == 0
    (record,) = records_of(log, occ, "retry_wait")
    assert (record.levelno, record.exc_info, record.scheduler_error_type) == (logging.INFO, None, "Retry")


def test_a_denial_logs_a_warning_and_a_deferral_an_info_with_the_reason(log):
    stranger = authority_for("nobody", "x.run")
    scheduler.create_job("denied", "test.ok", authority=stranger)  # no policy: policy_required
    (denied,) = [scheduler.enqueue("denied", scheduled_for=1_700_000_000_000, trigger_key="t")[0]]
    scheduler.set_policy("user", "bob", capabilities=["x.run"], window=3600, max_runs=1, max_units=10)
    _, deferred = make("budget", "test.ok", n=2, authority=authority_for("bob", "x.run"))
    assert burst() == 0

    (record,) = records_of(log, denied, "denied")
    assert (record.levelno, record.scheduler_reason) == (logging.WARNING, "policy_required")
    assert record.scheduler_principal == "user:nobody" and "policy_required" in record.getMessage()
    (record,) = records_of(log, deferred, "deferred")
    assert (record.levelno, record.scheduler_reason) == (logging.INFO, "budget_exhausted")
    assert record.scheduler_kind == "test.ok" and "budget_exhausted" in record.getMessage()
    assert Occurrence.objects.get(pk=deferred.pk).status == "queued"


def test_every_thread_stuck_is_one_error(log):
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("hang", "test.hang", authority=AUTHORITY)
    scheduler.enqueue("hang", scheduled_for=1_700_000_000_000, trigger_key="t", payload={"seconds": 2})
    worker = Worker(worker_id="w-obs", concurrency=1, poll_interval=0.05)
    assert worker.run() == EXIT_STUCK  # its one thread is stuck past the 0.3 s timeout
    (record,) = [r for r in log.records if r.name == LOG and r.levelno >= logging.ERROR]
    assert record.levelno == logging.ERROR
    assert "all 1 handler threads are stuck" in record.getMessage() and "test.hang" in record.getMessage()
    assert worker.stopping


# --------------------------------------------------------------------------- signals


@pytest.fixture
def received():
    """Every signal sent during the test: {signal name: [kwargs, ...]}."""
    got: dict[str, list[dict]] = defaultdict(list)
    names = {id(signal): name for name, signal in vars(signals).items() if signal in signals.ALL}
    receivers = []
    for signal in signals.ALL:

        def receiver(sender, signal, **kwargs):
            # Recorded, not asserted here: send_robust would swallow a failed assert.
            got[names[id(signal)]].append({**kwargs, "sender": sender})

        signal.connect(receiver, weak=False, dispatch_uid=f"test-{names[id(signal)]}")
        receivers.append((signal, receiver))
    yield got
    for signal, _ in receivers:
        signal.disconnect(dispatch_uid=f"test-{names[id(signal)]}")


def test_signals_are_sent_with_their_arguments(received):
    (flaky,) = make("flaky", "test.flaky", max_attempts=2, retry_base_delay=0.001, retry_max_delay=0.001)
    (dead,) = make("dead", "test.permanent")
    scheduler.create_job("denied", "test.ok", authority=authority_for("nobody", "x.run"))
    (denied,) = [scheduler.enqueue("denied", scheduled_for=1_700_000_000_000, trigger_key="t")[0]]
    scheduler.set_policy("user", "bob", capabilities=["x.run"], window=3600, max_runs=1, max_units=10)
    ran, deferred = make("budget", "test.ok", n=2, authority=authority_for("bob", "x.run"))
    assert burst() == 0

    common = {"worker_id", "occurrence", "kind"}
    documented = {
        "occurrence_claimed": common,
        "occurrence_started": common | {"attempt", "timeout"},
        "occurrence_finished": common | {"outcome", "result", "error", "exception", "duration"},
        "occurrence_dead_lettered": common | {"error", "exception"},
        "authority_denied": common | {"reason", "error"},
        "budget_deferred": common | {"reason"},
    }
    assert set(received) == set(documented)

    def by_occurrence(name):
        out = defaultdict(list)
        for kwargs in received[name]:
            assert set(kwargs) == documented[name] | {"sender"}
            assert (kwargs.pop("sender"), kwargs["worker_id"]) == (Worker, "w-obs")
            assert kwargs["kind"] == kwargs["occurrence"].claimed_kind
            out[kwargs["occurrence"].pk].append(kwargs)
        return out

    claimed = by_occurrence("occurrence_claimed")
    assert {pk: len(sent) for pk, sent in claimed.items()} == {flaky.pk: 2, dead.pk: 1, ran.pk: 1}
    started = by_occurrence("occurrence_started")
    assert [(s["attempt"], s["timeout"]) for s in started[flaky.pk]] == [(1, None), (2, None)]
    finished = by_occurrence("occurrence_finished")
    first, second = finished[flaky.pk]
    assert (first["outcome"], first["result"], first["error"]["message"]) == (
        "retry_wait",
        None,
        "first attempt fails",
    )
    assert isinstance(first["exception"], RuntimeError) and first["duration"] >= 0
    assert (second["outcome"], second["result"], second["error"], second["exception"]) == (
        "succeeded",
        "recovered",
        None,
        None,
    )
    (done,) = finished[dead.pk]
    assert (done["outcome"], done["error"]["code"]) == ("dead_letter", "E_BAD")
    assert finished[ran.pk][0]["outcome"] == "succeeded"

    dead_letters = by_occurrence("occurrence_dead_lettered")
    assert set(dead_letters) == {dead.pk, denied.pk}
    assert isinstance(dead_letters[dead.pk][0]["exception"], scheduler.PermanentFailure)
    assert dead_letters[denied.pk][0]["error"]["reason"] == "policy_required"
    ((denial,),) = by_occurrence("authority_denied").values()
    assert (denial["occurrence"].pk, denial["reason"]) == (denied.pk, "policy_required")
    assert "nobody" in denial["error"]["message"]
    ((deferral,),) = by_occurrence("budget_deferred").values()
    assert (deferral["occurrence"].pk, deferral["reason"]) == (deferred.pk, "budget_exhausted")


def test_a_receiver_that_raises_never_breaks_a_run(caplog):
    def broken(sender, **kwargs):
        raise ValueError("receiver bug")

    for signal in (signals.occurrence_claimed, signals.occurrence_started, signals.occurrence_finished):
        signal.connect(broken, weak=False, dispatch_uid="test-broken")
    try:
        occurrences = make("ok", "test.ok", n=3)
        assert burst() == 0
    finally:
        for signal in (signals.occurrence_claimed, signals.occurrence_started, signals.occurrence_finished):
            signal.disconnect(dispatch_uid="test-broken")
    assert {o.status for o in Occurrence.objects.filter(pk__in=[o.pk for o in occurrences])} == {"succeeded"}
    errors = [r for r in caplog.records if r.name == "django.dispatch"]
    # Logged once per call, at ERROR with the receiver's exception: three signals, three runs.
    assert len(errors) == 9
    assert {r.levelno for r in errors} == {logging.ERROR}
    assert all(isinstance(r.exc_info[1], ValueError) for r in errors)


# --------------------------------------------------------------------------- without [otel]


def test_without_the_otel_extra_nothing_is_measured_and_runs_go_on(monkeypatch):
    import sys

    from django_durable_scheduler.telemetry import metrics

    # As if opentelemetry-api were not installed: importing it fails.
    monkeypatch.setitem(sys.modules, "opentelemetry.metrics", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    monkeypatch.setattr(metrics, "_loaded", False)
    monkeypatch.setattr(metrics, "_instruments", None)
    (occ,) = make("ok", "test.ok")
    assert metrics.get() is None
    worker = Worker(worker_id="w-obs", burst=True, concurrency=2, poll_interval=0.05)
    assert worker.instruments is None
    assert worker.run() == 0
    assert Occurrence.objects.get(pk=occ.pk).status == "succeeded"
