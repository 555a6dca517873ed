"""The outcome reporter, with a real settle: finished outcomes settled in one batch, then
logged, signalled and forgotten; a lease lost meanwhile is marked on the handler's context.
(The fallbacks when the database refuses a batch: test_poison.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel, signals
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.worker import Worker
from django_durable_scheduler.worker.outcomes import OutcomeReporter
from django_durable_scheduler.worker.runs import Held, Run

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db(transaction=True)

LOG = "django_durable_scheduler"


def finished(reporter: OutcomeReporter, outcomes: list[dict[str, Any]]) -> list[Run]:
    """One claimed occurrence per outcome, each finished with its outcome."""
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("out", "test.ok", authority=AUTHORITY)
    for i in range(len(outcomes)):
        scheduler.enqueue("out", scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")
    owner = reporter.worker_id
    claimed = kernel.claim_batch(owner=owner, lease=60, limit=len(outcomes))
    runs = [Run.of(row, owner=owner, using=None, default_timeout=None) for row in claimed]
    reporter.held.add(runs)
    for run, outcome in zip(runs, outcomes, strict=True):
        reporter.held.finish(run, kernel.Outcome(run.occurrence.pk, run.occurrence.fence, **outcome))
    return runs


@pytest.fixture
def reporter() -> OutcomeReporter:
    return OutcomeReporter(held=Held(lambda: None), worker_id="w-out", sender=Worker)


@pytest.fixture
def received():
    got: list[tuple[str, dict[str, Any]]] = []
    connected = {"finished": signals.occurrence_finished, "dead": signals.occurrence_dead_lettered}
    receivers = {}
    for name, signal in connected.items():

        def receive(sender, name=name, **kwargs):
            got.append((name, {"sender": sender, **kwargs}))

        receivers[name] = receive
        signal.connect(receive)
    yield got
    for name, signal in connected.items():
        signal.disconnect(receivers[name])


def test_a_batch_is_settled_logged_signalled_and_forgotten(reporter, caplog, received, clock):
    runs = finished(
        reporter,
        [
            {"status": "succeeded", "result": {"n": 1}},
            {"status": "failed", "error": {"type": "RuntimeError", "message": "boom"}},
            {"status": "failed", "error": {"type": "Bad", "message": "never"}, "retryable": False},
        ],
    )
    with caplog.at_level(logging.INFO, logger=LOG):
        reporter.flush()
    rows = [Occurrence.objects.get(pk=run.occurrence.pk) for run in runs]
    assert [row.status for row in rows] == ["succeeded", "retry_wait", "dead_letter"]
    assert (len(reporter.held), reporter.held.finished, reporter.held.processed) == (0, 0, 3)
    assert all(run.forgotten for run in runs)
    records = {r.scheduler_occurrence_id: r for r in caplog.records if hasattr(r, "scheduler_status")}
    levels = [
        (records[run.occurrence.pk].levelno, records[run.occurrence.pk].scheduler_status) for run in runs
    ]
    assert levels == [
        (logging.INFO, "succeeded"),
        (logging.WARNING, "retry_wait"),
        (logging.ERROR, "dead_letter"),
    ]
    assert records[runs[1].occurrence.pk].scheduler_error_type == "RuntimeError"
    assert [(name, kw["occurrence"].pk) for name, kw in received] == [
        ("finished", runs[0].occurrence.pk),
        ("finished", runs[1].occurrence.pk),
        ("finished", runs[2].occurrence.pk),
        ("dead", runs[2].occurrence.pk),
    ]
    assert all(kw["sender"] is Worker and kw["worker_id"] == "w-out" for _, kw in received)
    assert received[0][1]["result"] == {"n": 1} and received[0][1]["outcome"] == "succeeded"


def test_an_outcome_whose_lease_was_lost_is_not_recorded(reporter, caplog, clock):
    (run,) = finished(reporter, [{"status": "succeeded", "result": 1}])
    clock.advance(61)  # expired, and taken by another worker
    assert kernel.claim(owner="other", lease=60) is not None
    with caplog.at_level(logging.INFO, logger=LOG):
        reporter.flush()
    assert run.context.lease_lost and len(reporter.held) == 0
    row = Occurrence.objects.get(pk=run.occurrence.pk)
    assert (row.status, row.lease_owner, row.result) == ("running", "other", None)
    (warning,) = [r for r in caplog.records if "result not recorded" in r.getMessage()]
    assert warning.levelno == logging.WARNING


def test_nothing_finished_is_nothing_to_do(reporter, django_assert_num_queries):
    with django_assert_num_queries(0):
        reporter.flush()
    assert reporter.held.processed == 0
