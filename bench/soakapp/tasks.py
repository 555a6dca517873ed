"""The soak's handlers (autodiscovered as this app's ``tasks`` module). What a run does is in
its payload: ``ms`` of work (checking for a cancel request every 50 ms), then ``fail``:
``"once"`` asks for a retry on the first attempt, ``"always"`` fails for good (a dead letter).
Each success returns the occurrence and the fence it ran under."""

from __future__ import annotations

import time
from typing import Any

import django_durable_scheduler as scheduler

CUSTOMERS = ("acme", "globex", "initech")
# The handler's own limit: this many runs of the kind at once per customer, on every worker.
LIMITED_PER_CUSTOMER = 2
BUDGET_UNITS = 2  # what one run of the budgeted kind costs


def _run(ctx: Any) -> dict[str, Any]:
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    deadline = time.monotonic() + payload.get("ms", 0) / 1000
    while True:
        ctx.raise_if_cancelled()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(0.05, left))
    fail = payload.get("fail")
    if fail == "always":
        raise scheduler.PermanentFailure("soak: this run fails for good")
    if fail == "once" and ctx.attempt == 1:
        raise scheduler.Retry("soak: the first attempt asks for a retry", delay=1)
    return {"occurrence": ctx.occurrence_id, "fence": ctx.fence}


@scheduler.handler("soak.work")
def work(ctx: Any) -> dict[str, Any]:
    return _run(ctx)


@scheduler.handler("soak.limited", concurrency=LIMITED_PER_CUSTOMER, concurrency_key="{customer}")
def limited(ctx: Any) -> dict[str, Any]:
    return _run(ctx)


@scheduler.handler("soak.budget", units=BUDGET_UNITS)
def budgeted(ctx: Any) -> dict[str, Any]:
    return _run(ctx)


@scheduler.handler("soak.callback")
def callback(ctx: Any) -> dict[str, Any]:
    if ctx.batch is None:
        raise scheduler.PermanentFailure("soak: a batch callback without its batch")
    return {"batch": ctx.batch["batch_id"], "counts": ctx.batch["counts"]}
