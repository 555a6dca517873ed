"""Handlers used by the worker tests (autodiscovered as this app's ``tasks`` module)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import django_durable_scheduler as scheduler


@scheduler.handler("test.ok")
def ok(ctx):
    return {"job": ctx.job_id, "attempt": ctx.attempt, "payload": ctx.payload}


@scheduler.handler("test.flaky")
def flaky(ctx):
    if ctx.attempt < 2:
        raise RuntimeError("first attempt fails")
    return "recovered"


@scheduler.handler("test.permanent")
def permanent(ctx):
    raise scheduler.PermanentFailure("cannot ever work", code="E_BAD")


@scheduler.handler("test.retry-later")
def retry_later(ctx):
    raise scheduler.Retry("not yet", delay=120)


@scheduler.handler("test.bad-result")
def bad_result(ctx):
    return {"not json": {1, 2}}


@scheduler.handler("test.sleep")
def sleep(ctx):
    time.sleep(float((ctx.payload or {}).get("seconds", 1)))
    return "slept"


@scheduler.handler("test.receipt")
def receipt(ctx):
    ctx.record_metadata({"step": "charging"})
    ctx.record_receipt({"charge_id": f"ch_{ctx.occurrence_id[-6:]}"})
    return "charged"


# --- crash and scale tests (tests/worker/test_crash.py, tests/worker/test_scale.py)


@scheduler.handler("test.crash-once")
def crash_once(ctx):
    """Attempt 1 records that it started, then sleeps far past its lease (the test kills the
    process meanwhile); later attempts succeed at once."""
    if ctx.attempt < 2:
        ctx.record_metadata({"started": ctx.attempt})
        time.sleep(float((ctx.payload or {}).get("seconds", 120)))
    return {"occurrence": ctx.occurrence_id, "attempt": ctx.attempt, "fence": ctx.fence}


@scheduler.handler("test.echo")
def echo(ctx):
    """Sleeps ``payload.seconds``, then returns its own occurrence id (checkable per occurrence)."""
    time.sleep(float((ctx.payload or {}).get("seconds", 0)))
    return {"occurrence": ctx.occurrence_id, "attempt": ctx.attempt}


# --- outcomes the database cannot store as they are (tests/worker/test_poison.py)


@scheduler.handler("test.poison")
def poison(ctx):
    """Returns or raises what ``payload.mode`` names; "ok" succeeds with a plain result."""
    mode = (ctx.payload or {}).get("mode", "ok")
    if mode == "nul-result":
        return {"text": "before\x00after"}
    if mode == "nul-key":
        return {"key\x00": 1}
    if mode == "huge-result":
        return "x" * (64 * 1024 + 1)
    if mode == "deep-result":
        deep: list = []
        for _ in range(100):
            deep = [deep]
        return deep
    if mode == "set-result":
        return {"ids": {1, 2}}
    if mode == "nul-error":
        raise RuntimeError("bad\x00message")
    if mode == "long-error":
        raise RuntimeError("\ud800" + "é" * 10_000)
    if mode == "nul-permanent":
        raise scheduler.PermanentFailure("never\x00works", code="E\x00NUL")
    return {"mode": mode, "occurrence": ctx.occurrence_id}


# --- wake-ups (tests/db/test_wakeups.py)


@scheduler.handler("test.stamp")
def stamp(ctx):
    """Returns the wall-clock time it started (the test compares it to the enqueue's), after
    sleeping ``payload.seconds`` (so that later enqueues find the worker busy)."""
    started = time.time()
    time.sleep(float((ctx.payload or {}).get("seconds", 0)))
    return {"started": started}


@scheduler.handler("test.hang", timeout=0.3)
def hang(ctx):
    """Blocks for ``payload["seconds"]`` (default: an hour), past its 0.3 s timeout."""
    threading.Event().wait(float((ctx.payload or {}).get("seconds", 3600)))
    return "late"


# --- cancelling a running occurrence (tests/kernel/test_cancel.py)


@scheduler.handler("test.cancel-poll")
def cancel_poll(ctx):
    """Reports that it started, then works in small steps, stopping when asked to."""
    ctx.record_metadata({"started": ctx.attempt})
    deadline = time.monotonic() + float((ctx.payload or {}).get("seconds", 60))
    while time.monotonic() < deadline:
        ctx.raise_if_cancelled()
        time.sleep(0.05)
    return "finished"


@scheduler.handler("test.cancel-ignore", timeout=4)
def cancel_ignore(ctx):
    """Reports that it started, then never looks at the request: runs into its timeout."""
    ctx.record_metadata({"started": ctx.attempt})
    threading.Event().wait(float((ctx.payload or {}).get("seconds", 60)))
    return "late"


@scheduler.handler("test.cancel-async")
async def cancel_async(ctx):
    """An async handler: reports that it started, then awaits; a cancel stops it there."""
    from asgiref.sync import sync_to_async

    await sync_to_async(ctx.record_metadata)({"started": ctx.attempt})
    await asyncio.sleep(float((ctx.payload or {}).get("seconds", 60)))
    return "finished"


# --- concurrency limits (tests/kernel/test_concurrency_limits.py)


def _record_run(ctx, event: str) -> None:
    """Append "<event> <time> <occurrence> <customer>" to the file ``payload.log`` names: one
    short O_APPEND write per line, so lines of concurrent processes never interleave."""
    payload = ctx.payload or {}
    line = f"{event} {time.time():.6f} {ctx.occurrence_id} {payload.get('customer', '-')}\n"
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@scheduler.handler("test.limited")
def limited(ctx):
    """Records its start and end, sleeping ``payload.seconds`` between; with ``payload.hang``
    its first attempt sleeps far past its lease (the test kills the worker meanwhile)."""
    payload = ctx.payload or {}
    _record_run(ctx, "start")
    time.sleep(120 if payload.get("hang") and ctx.attempt < 2 else float(payload.get("seconds", 0.5)))
    _record_run(ctx, "end")
    return {"attempt": ctx.attempt}


@scheduler.handler("test.per-customer", concurrency=1, concurrency_key="{customer}")
def per_customer(ctx):
    """One run at a time per customer (the handler's limit), recorded as ``test.limited``."""
    _record_run(ctx, "start")
    time.sleep(float((ctx.payload or {}).get("seconds", 0.5)))
    _record_run(ctx, "end")
    return "done"


@scheduler.handler("test.keyed-by-function", concurrency=1, concurrency_key=lambda p: f"tenant-{p['tenant']}")
def keyed_by_function(ctx):
    """A handler whose concurrency key is a function (tests/test_autodiscover.py)."""
    return "done"


# --- a worker stopped past its lease (tests/worker/test_stall.py)


@scheduler.handler("test.counted")
def counted(ctx):
    """Appends "<time> <occurrence> <fence>" to the file ``payload.log`` names as it starts
    (one O_APPEND write: lines of concurrent threads never interleave), then sleeps
    ``payload.seconds``: every execution of a handler is counted, settled or not."""
    payload = ctx.payload or {}
    line = f"{time.time():.6f} {ctx.occurrence_id} {ctx.fence}\n"
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    time.sleep(float(payload.get("seconds", 0)))
    return {"occurrence": ctx.occurrence_id, "attempt": ctx.attempt}


# --- chains and batches under SIGKILL (tests/worker/test_chains_crash.py)


@scheduler.handler("test.step")
def step(ctx):
    """A chain's predecessor or a batch's member, as ``payload.mode`` says: "ok" sleeps
    ``payload.seconds`` and succeeds, "fail" fails for good (dead-lettered at once), "flaky"
    fails its first attempt (retried), "hang" sleeps ``payload.seconds`` (longer than the test:
    only a SIGKILL, then its lease's expiry, ends it)."""
    payload = ctx.payload or {}
    mode = payload.get("mode", "ok")
    if mode == "fail":
        raise scheduler.PermanentFailure("this step never works", code="E_STEP")
    if mode == "flaky" and ctx.attempt < 2:
        raise RuntimeError("first attempt fails")
    time.sleep(float(payload.get("seconds", 0)))
    return {"occurrence": ctx.occurrence_id, "attempt": ctx.attempt, "i": payload.get("i")}


@scheduler.handler("test.follow")
def follow(ctx):
    """A follow-up or a batch's callback: sleeps ``payload.seconds``, then returns what it saw
    of why it exists (``ctx.predecessor``, ``ctx.batch``), for the test to compare with the rows."""
    time.sleep(float((ctx.payload or {}).get("seconds", 0)))
    return {
        "occurrence": ctx.occurrence_id,
        "attempt": ctx.attempt,
        "predecessor": ctx.predecessor,
        "batch": ctx.batch,
    }


# --- what a handler raises that is no Exception (tests/worker/test_base_exceptions.py)


class Abort(BaseException):
    """A BaseException of the handler's own, as some libraries define one."""


@scheduler.handler("test.raise-base")
def raise_base(ctx):
    """Raises what ``payload.mode`` names, on the attempts before ``payload.until`` (every
    attempt without it), then succeeds: "exit" calls ``sys.exit``, "interrupt" raises
    KeyboardInterrupt, "generator-exit" GeneratorExit, "custom" ``Abort``, "async-exit" is an
    async handler's ``sys.exit``; "ok" succeeds."""
    payload = ctx.payload or {}
    mode = payload.get("mode", "ok")
    if mode == "ok" or ctx.attempt >= payload.get("until", ctx.attempt + 1):
        return {"attempt": ctx.attempt}
    if mode == "async-exit":
        return _exit_async()
    raised = {"interrupt": KeyboardInterrupt, "generator-exit": GeneratorExit, "custom": Abort}.get(mode)
    if raised is None:
        sys.exit(f"handler exits ({mode})")
    raise raised(f"handler raises ({mode})")


async def _exit_async():
    await asyncio.sleep(0)
    sys.exit("handler exits (async)")
