"""What a worker holds is held by attempt, (occurrence id, fence): a worker that stalled past
its lease and reclaimed its own row holds both attempts, renews the new one, and settles each
on its own fence; and each run knows when its lease ends at the latest."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Event, Occurrence
from django_durable_scheduler.rules.outcomes import SUCCEEDED
from django_durable_scheduler.worker import Worker
from django_durable_scheduler.worker.claims import Claimer
from django_durable_scheduler.worker.outcomes import OutcomeReporter
from django_durable_scheduler.worker.pool import HandlerPool
from django_durable_scheduler.worker.runs import Held, Run

from ..conftest import AUTHORITY

LOG = "django_durable_scheduler"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = "w-runs"


def attempt(fence: int, pk: str = "occ-1") -> Run:
    occurrence = Occurrence(
        occurrence_id=pk,
        job_id="job",
        scheduled_for=NOW,
        available_at=NOW,
        attempt=fence,
        max_attempts=3,
        fence=fence,
        authority=AUTHORITY,
        created_at=NOW,
        updated_at=NOW,
    )
    occurrence.claimed_kind = "test.ok"
    return Run.of(occurrence, owner=OWNER, using=None, default_timeout=None)


def test_two_attempts_of_one_occurrence_are_held_apart():
    held = Held(lambda: None)
    old, new = attempt(1), attempt(2)
    held.add([old])
    held.add([new])  # the worker reclaimed its own row
    assert len(held) == 2 and held.holds("occ-1", 1) and held.holds("occ-1", 2)
    held.forget(old)  # settling the old attempt leaves the new one held
    assert held.runs() == [new] and not held.holds("occ-1", 1) and held.holds("occ-1", 2)
    assert held.processed == 1
    held.forget(new, processed=False)  # dropped unstarted: not processed
    assert len(held) == 0 and held.processed == 1 and new.forgotten


def test_a_settle_takes_one_attempt_of_each_occurrence():
    """Two finished attempts of one occurrence are settled one after the other, never in one
    batch (which takes each occurrence once)."""
    held = Held(lambda: None)
    old, other, new = attempt(1), attempt(1, "occ-2"), attempt(2)
    held.add([old, other, new])
    for run in (old, other, new):
        held.finish(run, kernel.Outcome(run.occurrence.pk, run.occurrence.fence, SUCCEEDED))
    assert held.take_finished() == [old, other]
    assert held.finished == 1
    assert held.take_finished() == [new]
    assert held.take_finished() == []


@pytest.mark.django_db(transaction=True)
def test_a_reclaimed_own_row_settles_each_attempt_on_its_own_fence(clock, caplog):
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("runs", "test.ok", authority=AUTHORITY)
    scheduler.enqueue("runs", scheduled_for=1_700_000_000_000, trigger_key="t")
    reporter = OutcomeReporter(held=Held(lambda: None), worker_id=OWNER, sender=Worker)
    held = reporter.held
    (first,) = kernel.claim_batch(owner=OWNER, lease=10, limit=1)
    old = Run.of(first, owner=OWNER, using=None, default_timeout=None)
    clock.advance(11)  # the worker stalled past its lease, then reclaimed its own row
    (second,) = kernel.claim_batch(owner=OWNER, lease=10, limit=1)
    new = Run.of(second, owner=OWNER, using=None, default_timeout=None)
    held.add([old, new])
    for run in (old, new):
        held.finish(
            run,
            kernel.Outcome(run.occurrence.pk, run.occurrence.fence, SUCCEEDED, result=run.occurrence.fence),
        )
    with caplog.at_level(logging.WARNING, logger=LOG):
        reporter.flush()  # the old attempt: refused by the fence
        assert held.runs() == [new] and old.context.lease_lost and not new.context.lease_lost
        reporter.flush()  # the new one
    assert len(held) == 0
    row = Occurrence.objects.get(pk=first.pk)
    assert (row.status, row.fence, row.result) == ("succeeded", 2, 2)
    (success,) = Event.objects.filter(occurrence_id=first.pk, event_type="occurrence_succeeded")
    assert success.fence == 2
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records] == ["result not recorded"]


@pytest.mark.django_db(transaction=True)
def test_a_claimed_run_knows_when_its_lease_ends(clock, monkeypatch):
    """From the claim's expiry, read against the clock when the run is made: a worker stopped
    between its claim and then holds that much less of its lease."""
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("runs", "test.ok", authority=AUTHORITY)
    for n in range(2):
        scheduler.enqueue("runs", scheduled_for=1_700_000_000_000 + n, trigger_key=f"t{n}")
    held = Held(lambda: None)
    pool = HandlerPool(
        concurrency=1, held=held, wake=lambda: None, learn=lambda s: None, sender=Worker, worker_id=OWNER
    )
    reporter = OutcomeReporter(held=held, worker_id=OWNER, sender=Worker)
    claimer = Claimer(worker_id=OWNER, lease=30, using=None, held=held, pool=pool, reporter=reporter)
    before = time.monotonic()
    assert len(claimer.claim(1, ["test.ok"])) == 1
    (run,) = held.runs()
    assert before + 29 < run.lease_until <= time.monotonic() + 30

    claim_authorized = kernel.claim_authorized

    def stalled(**kwargs):
        batch = claim_authorized(**kwargs)
        clock.advance(20)  # stopped for 20 s after the claim's commit
        return batch

    monkeypatch.setattr(kernel, "claim_authorized", stalled)
    before = time.monotonic()
    assert len(claimer.claim(1, ["test.ok"])) == 1
    (late,) = [each for each in held.runs() if each is not run]
    assert before + 9 < late.lease_until <= time.monotonic() + 10
