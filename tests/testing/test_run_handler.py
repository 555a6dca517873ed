"""``testing.run_handler()``: a registered handler called with a real context, no queue."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import testing
from django_durable_scheduler.models import Occurrence

from .conftest import START


def test_the_handler_gets_the_context_a_worker_would_give(frozen, handle, db):
    @handle("t.context")
    def context(ctx):
        ctx.record_metadata({"step": 1})
        ctx.record_metadata({"step": 2})
        ctx.record_receipt({"id": "r"})
        return {
            "payload": ctx.payload,
            "attempt": [ctx.attempt, ctx.max_attempts],
            "fence": ctx.fence,
            "principal": ctx.authority["principal"],
            "capabilities": ctx.authority["requestedCapabilities"],
            "scheduled_for": ctx.scheduled_for.isoformat(),
            "job": ctx.job_id,
        }

    call = testing.run_handler("t.context", {"n": 1}, attempt=2, max_attempts=5)
    assert call.result == {
        "payload": {"n": 1},
        "attempt": [2, 5],
        "fence": 1,
        "principal": {"type": "app", "id": "durable_scheduler"},
        "capabilities": ["t.context"],
        "scheduled_for": START.isoformat(),
        "job": "testing-job",
    }
    assert call.context.metadata == {"step": 2} and call.context.receipt == {"id": "r"}
    assert call.context.recorded == [
        {"metadata": {"step": 1}},
        {"metadata": {"step": 2}},
        {"receipt": {"id": "r"}},
    ]
    assert not Occurrence.objects.exists()  # no queue, nothing written


def test_what_the_handler_raises_propagates(handle):
    @handle("t.raises")
    def raises(ctx):
        if ctx.cancel_requested:
            ctx.raise_if_cancelled()
        if ctx.attempt == 1:
            raise scheduler.Retry("later", delay=60)
        raise scheduler.PermanentFailure("never", code="E_X")

    with pytest.raises(scheduler.Retry) as retry:
        testing.run_handler("t.raises")
    assert retry.value.delay == 60
    with pytest.raises(scheduler.PermanentFailure, match="never"):
        testing.run_handler("t.raises", attempt=2)
    with pytest.raises(scheduler.OccurrenceCancelled):
        testing.run_handler("t.raises", cancel_requested=True)


def test_follow_ups_batches_authority_and_async_handlers(handle):
    @handle("t.follow")
    async def follow(ctx):
        await asyncio.sleep(0)
        return [ctx.predecessor, ctx.batch, ctx.authority["principal"], ctx.scheduled_for.year]

    authority = {"principal": {"type": "team", "id": "ops"}, "requestedCapabilities": ["t.follow"]}
    result = testing.run_handler(
        "t.follow",
        predecessor={"result": {"rows": 3}},
        authority=authority,
        scheduled_for=START + timedelta(days=365),
    ).result
    assert result[0]["result"] == {"rows": 3} and result[0]["status"] == "succeeded"
    assert result[1:] == [None, {"type": "team", "id": "ops"}, 2027]
    (predecessor, batch, *_) = testing.run_handler("t.follow", batch={"counts": {"succeeded": 2}}).result
    assert predecessor is None and batch["counts"] == {"succeeded": 2}


def test_a_result_the_worker_could_not_store_is_refused(handle):
    handle("t.sets")(lambda ctx: {1, 2})
    with pytest.raises(scheduler.InvalidArgument) as refused:
        testing.run_handler("t.sets")
    assert refused.value.details["field"] == "result"
