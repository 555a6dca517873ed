"""``ctx.report_progress`` in the worker: throttled to about one write a second, the last report
always written when the handler returns, fenced like every write of a running occurrence,
and sent as the ``occurrence_progressed`` signal."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel, signals, testing
from django_durable_scheduler.exceptions import InvalidArgument, LeaseLost
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.rules.progress import Progress
from django_durable_scheduler.testing.handlers import run_handler
from django_durable_scheduler.worker.progress import ProgressThrottle
from django_durable_scheduler.worker.runs import Run

from ..conftest import AUTHORITY, CLOCK_START, snapshot

KIND = "test.progress"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def throttle_of(clock: FakeClock) -> tuple[ProgressThrottle, list[Progress], list[Progress | None]]:
    written: list[Progress] = []
    before: list[Progress | None] = []

    def write(progress: Progress) -> Progress:
        written.append(progress)
        return progress

    throttle = ProgressThrottle(write, lambda stored, last: before.append(last), clock=clock)
    return throttle, written, before


def test_the_first_report_is_written_at_once_and_later_ones_once_a_second():
    clock = FakeClock()
    throttle, written, before = throttle_of(clock)
    for n in range(1, 101):  # 100 reports over 2 seconds
        throttle.report(Progress(n, 100))
        clock.now += 0.02
    # At 0 s, then the first report at or past 1 s, then past 2 s: never two within a second.
    assert [p.done for p in written] == [1, 51]
    assert throttle.pending == Progress(100, 100)
    assert throttle.flush() is True
    assert [p.done for p in written] == [1, 51, 100]
    assert before == [None, Progress(1, 100), Progress(51, 100)]
    assert throttle.flush() is False  # nothing pending: nothing written


def test_a_failed_write_keeps_the_report_pending_for_the_flush():
    clock = FakeClock()
    fail = [True]

    def write(progress: Progress) -> Progress:
        if fail[0]:
            raise LeaseLost("gone", {})
        return progress

    throttle = ProgressThrottle(write, lambda stored, last: None, clock=clock)
    with pytest.raises(LeaseLost):
        throttle.report(Progress(1))
    assert throttle.pending == Progress(1)
    fail[0] = False
    assert throttle.flush() is True and throttle.pending is None


# --------------------------------------------------------------------------- through the worker


@pytest.fixture
def handle(db, clock) -> Iterator[Callable[[Callable[[Any], Any]], None]]:
    """``handle(func)`` makes ``func`` the handler of a job "progress" of KIND."""
    scheduler.ensure_policy(AUTHORITY)
    kernel.create_job("progress", KIND, authority=AUTHORITY)

    def register(func: Callable[[Any], Any]) -> None:
        registry.unregister(KIND)
        registry.handler(KIND)(func)

    yield register
    registry.unregister(KIND)


@pytest.fixture
def heard() -> Iterator[list[dict[str, Any]]]:
    found: list[dict[str, Any]] = []

    def receiver(sender, **kwargs):
        found.append(kwargs)

    signals.occurrence_progressed.connect(receiver)
    yield found
    signals.occurrence_progressed.disconnect(receiver)


def _progress_writes(queries: CaptureQueriesContext) -> int:
    column = connection.ops.quote_name("progress")
    return sum(q["sql"].startswith("UPDATE") and f"{column} =" in q["sql"] for q in queries.captured_queries)


def test_a_tight_loop_of_reports_writes_about_once_a_second_and_the_last_one_at_the_end(handle, heard):
    def count(ctx):
        for n in range(1, 101):
            ctx.report_progress(n, 100, f"item {n}")
        return "counted"

    handle(count)
    kernel.enqueue("progress", scheduled_for=CLOCK_START, trigger_key="t")
    started = time.monotonic()
    with CaptureQueriesContext(connection) as queries:
        (ran,) = testing.drain()
    elapsed = time.monotonic() - started
    assert ran.status == "succeeded"
    writes = _progress_writes(queries)
    # The first report, at most one more per second the loop took, and the last at the end:
    # 2 here unless the machine stalled for over a second.
    assert 2 <= writes <= 2 + int(elapsed), (writes, elapsed)
    row = Occurrence.objects.get(pk=ran.occurrence_id)
    assert row.progress == {"done": 100, "total": 100, "note": "item 100", "fence": row.fence}
    assert [(h["done"], h["total"], h["note"]) for h in heard][-1] == (100, 100, "item 100")
    assert len(heard) == writes
    assert heard[0]["occurrence"].pk == ran.occurrence_id and heard[0]["kind"] == KIND


def test_a_run_that_reports_nothing_writes_no_progress(handle, heard):
    handle(lambda ctx: "quiet")
    kernel.enqueue("progress", scheduled_for=CLOCK_START, trigger_key="t")
    with CaptureQueriesContext(connection) as queries:
        (ran,) = testing.drain()
    assert _progress_writes(queries) == 0 and heard == []
    assert Occurrence.objects.get(pk=ran.occurrence_id).progress is None


def test_the_last_report_is_written_before_a_failure_is_settled(handle):
    def fail_half_way(ctx):
        ctx.report_progress(1, 4)
        ctx.report_progress(2, 4, "stuck")  # held back by the throttle
        raise RuntimeError("half way")

    handle(fail_half_way)
    kernel.enqueue("progress", scheduled_for=CLOCK_START, trigger_key="t")
    (ran,) = testing.drain()
    assert ran.status == "retry_wait"
    assert Occurrence.objects.get(pk=ran.occurrence_id).progress["done"] == 2


def test_bad_input_from_a_handler_is_refused_naming_the_field_and_writes_nothing(handle):
    refused: list[InvalidArgument] = []

    def bad(ctx):
        for kwargs in ({"done": -1}, {"done": 3, "total": 2}, {"done": "x"}, {"done": 1, "note": "n" * 201}):
            try:
                ctx.report_progress(**kwargs)
            except InvalidArgument as exc:
                refused.append(exc)

    handle(bad)
    kernel.enqueue("progress", scheduled_for=CLOCK_START, trigger_key="t")
    (ran,) = testing.drain()
    assert [exc.field for exc in refused] == ["done", "total", "done", "note"]
    assert Occurrence.objects.get(pk=ran.occurrence_id).progress is None


def test_a_report_after_the_lease_moved_on_is_refused_and_the_handler_told(job, clock):
    kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key="t")
    (first,) = kernel.claim_batch(owner="w1", lease=30, limit=1, sweep_expired=False)
    first.claimed_kind = "reports.send"
    ctx = Run.of(first, owner="w1", using=None, default_timeout=None).context
    clock.advance(31)
    (second,) = kernel.claim_batch(owner="w2", lease=30, limit=1, sweep_expired=False)
    kernel.record_progress(second.pk, owner="w2", fence=second.fence, done=4, total=10)
    before = snapshot()
    with pytest.raises(LeaseLost):  # a first report is written at once: refused
        ctx.report_progress(9, 10)
    assert ctx.lease_lost
    assert snapshot() == before
    assert Occurrence.objects.get(pk=first.pk).progress["fence"] == second.fence


def test_run_handler_keeps_every_report_unthrottled(db):
    registry.handler("test.progress-unit")(lambda ctx: [ctx.report_progress(n, 5) for n in range(3)])
    try:
        call = run_handler("test.progress-unit")
    finally:
        registry.unregister("test.progress-unit")
    assert call.context.progress == Progress(2, 5)
    assert [r["progress"]["done"] for r in call.context.recorded] == [0, 1, 2]
