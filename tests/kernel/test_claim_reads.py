"""A claim reads every column a run needs: making the runs of what it claimed (the contexts
their handlers get) sends no query. A column left out of the claim's SELECT is deferred, and
Django loads it with a query per row on first access: on the worker's loop thread, once per
claimed occurrence."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_durable_scheduler import kernel
from django_durable_scheduler.worker.runs import Run

from ..conftest import CLOCK_START, authority_for

pytestmark = pytest.mark.django_db(transaction=True)
OWNER = "w-reads"


def _settle_all() -> None:
    for row in kernel.claim_batch(owner=OWNER, lease=60, limit=100, sweep_expired=False):
        kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome="succeeded", result={"of": row.pk})


def test_the_runs_of_claimed_plain_follow_up_and_callback_occurrences_send_no_query(clock):
    authority = authority_for("alice", "reports.export")
    kernel.create_job("export", "reports.export", authority=authority)
    kernel.create_job("report", "reports.export", authority=authority)
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", then="report")
    kernel.enqueue_batch(
        "export", [{"scheduled_for": CLOCK_START, "trigger_key": "m1"}], callback="report", batch_id="b1"
    )
    _settle_all()  # the predecessor and the member: a follow-up and a callback are now queued
    kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t2")
    clock.advance(1)
    claimed = kernel.claim_batch(owner=OWNER, lease=60, limit=10, sweep_expired=False)
    assert len(claimed) == 3

    with CaptureQueriesContext(connection) as queries:
        runs = [Run.of(row, owner=OWNER, using=None, default_timeout=None) for row in claimed]
    assert queries.captured_queries == []
    seen = {run.context.occurrence_id: run.context for run in runs}
    (follow,) = [ctx for ctx in seen.values() if ctx.predecessor is not None]
    assert follow.predecessor["occurrence_id"] == first.pk and follow.predecessor["result"] == {
        "of": first.pk
    }
    (callback,) = [ctx for ctx in seen.values() if ctx.batch is not None]
    assert callback.batch["batch_id"] == "b1" and callback.batch["counts"]["succeeded"] == 1
