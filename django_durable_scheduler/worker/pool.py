"""The handler pool: ``concurrency`` long-lived threads that run the handlers of claimed
occurrences, each with its own database connection.

A run that passes its timeout (the job's, else the handler's, else
``DURABLE_SCHEDULER_HANDLER_TIMEOUT``) is failed as ``HandlerTimeout`` when the loop calls
:meth:`HandlerPool.expire`, and settled like any failure, so its lease is no longer renewed;
Python cannot stop the thread, so it stays counted against ``concurrency`` (stuck) until the
handler returns, and its late outcome is dropped. When every thread is stuck so, the worker
can do no more work: it stops and exits with EXIT_STUCK for its supervisor to restart it.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import logging
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connections

from .. import conf, kernel, signals
from ..exceptions import HandlerTimeout, OccurrenceCancelled, PermanentFailure, Retry
from ..handlers import registry
from ..rules.outcomes import FAILED, SUCCEEDED, Outcome
from ..rules.validation import to_duration_ms
from ..telemetry import metrics, tracing
from .context import ExecutionContext
from .runs import Held, Run, log_fields

logger = logging.getLogger("django_durable_scheduler")

MAX_TRACEBACK = 16 * 1024
# run()'s exit code when every handler thread is stuck in a handler past its timeout: the
# process can do no more work, and only a restart frees the threads.
EXIT_STUCK = 3


def call_handler(ctx: ExecutionContext) -> Outcome:
    """Run the handler of ``ctx.kind``; its return value or what it raised, as an outcome."""
    at = (ctx.occurrence_id, ctx.fence)
    handler = registry.get_handler(ctx.kind)
    if handler is None:  # unregistered after the claim
        return Outcome(*at, FAILED, error={"message": f"no handler for kind {ctx.kind!r}"})
    try:
        result = handler.func(ctx)
        if inspect.iscoroutine(result):  # an async handler
            result = ctx.run_coroutine(result)
    except OccurrenceCancelled as exc:
        # Asked to stop: a failure without retry, which settles as cancelled.
        error = {**kernel.storable_error(exc), "type": "OccurrenceCancelled", "code": exc.code}
        return Outcome(*at, FAILED, error=error, retryable=False, exception=exc)
    except Retry as exc:
        retry_at = exc.at
        if exc.delay is not None:
            delay_ms = to_duration_ms(exc.delay, "Retry.delay", minimum_ms=0)
            retry_at = conf.now() + timedelta(milliseconds=delay_ms)
        error = {**kernel.storable_error(exc), "type": "Retry"}
        return Outcome(*at, FAILED, error=error, retry_at=retry_at, exception=exc)
    except PermanentFailure as exc:
        error = {**kernel.storable_error(exc), "type": "PermanentFailure", "code": exc.code}
        return Outcome(*at, FAILED, error=error, retryable=False, exception=exc)
    except BaseException as exc:
        # sys.exit(), KeyboardInterrupt or a BaseException of its own fail the run like any
        # error: escaping, it would end this thread and leave the run held for ever. Only
        # in the main thread may a KeyboardInterrupt be SIGINT's, which stops the process.
        if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            raise
        error = {**kernel.storable_error(exc), "traceback": traceback.format_exc()[-MAX_TRACEBACK:]}
        return Outcome(*at, FAILED, error=error, exception=exc)
    return Outcome(*at, SUCCEEDED, result=result)


def tidy_connections() -> None:
    """Keep this thread's connections open between occurrences (reconnecting costs more
    than the work), but drop one that saw an error and no longer answers."""
    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()


class HandlerPool:
    """Runs submitted runs on ``concurrency`` threads and hands each outcome to ``held``.

    ``learn`` is told each run's time; ``wake`` is called when the loop must look sooner than
    it planned (a deadline before the end of its sleep, a thread free again). Signals are
    sent with ``sender`` (the Worker class) and ``worker_id``.
    """

    def __init__(
        self,
        *,
        concurrency: int,
        held: Held,
        wake: Callable[[], None],
        learn: Callable[[float], None],
        sender: type,
        worker_id: str,
        instruments: metrics.Instruments | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.held = held
        self.instruments = instruments
        self._wake = wake
        self._learn = learn
        self._sender = sender
        self._worker_id = worker_id
        self._queue: queue.Queue[Run | None] = queue.Queue()
        self._lock = threading.Lock()
        # Runs with a timeout, by deadline (monotonic), and the runs past theirs whose
        # handlers have not returned: their threads are lost to the pool until they do.
        self._deadlines: list[tuple[float, int, Run]] = []
        self._deadline_order = itertools.count()
        self._stuck: set[Run] = set()
        self._sleep_until = 0.0  # when the loop's current sleep ends (see sleep_limit, _execute)

    # ------------------------------------------------------------------ the loop's side

    def start(self) -> None:
        for n in range(self.concurrency):
            threading.Thread(target=self._thread, name=f"dsch-run-{n}", daemon=True).start()

    def submit(self, runs: list[Run]) -> None:
        for run in runs:
            self._queue.put(run)

    @property
    def queued(self) -> int:
        """How many submitted runs no thread has started yet."""
        return self._queue.qsize()

    def run_queued(self) -> list[Run]:
        """Run every submitted run in the calling thread, one after another, each as a
        handler thread would (``testing.drain`` drives the pool so, with no thread started:
        the handlers see the caller's connection and its transaction). Returns them."""
        ran: list[Run] = []
        while True:
            try:
                run = self._queue.get_nowait()
            except queue.Empty:
                return ran
            if run is not None:
                self._execute(run)
                ran.append(run)

    def drop_queued(self) -> None:
        """Past the grace period: what no handler thread has started yet must never start
        (the worker gives its lease back, and another worker may run it)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break

    def stop(self) -> None:
        """Each thread ends once it has no run to finish."""
        for _ in range(self.concurrency):
            self._queue.put(None)

    @property
    def stuck(self) -> int:
        """How many threads are stuck in a handler past its timeout."""
        return len(self._stuck)

    def all_stuck(self) -> bool:
        return len(self._stuck) >= self.concurrency

    def give_up(self) -> int:
        """Log that every thread is stuck; returns EXIT_STUCK, the worker's exit code."""
        with self._lock:
            kinds = sorted({run.context.kind for run in self._stuck})
        logger.error(
            "all %d handler threads are stuck in handlers past their timeout (kinds %s): "
            "stopping claims and exiting with code %d so that the process is restarted",
            self.concurrency,
            ", ".join(kinds),
            EXIT_STUCK,
        )
        return EXIT_STUCK

    def expire(self) -> None:
        """Fail every run past its deadline whose handler has not returned: settled by the
        next flush like any failure (so its lease is no longer renewed), while its thread
        stays counted as busy (stuck) until the handler returns (see _execute)."""
        if not self._deadlines:
            return
        now = time.monotonic()
        expired: list[Run] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                run = heapq.heappop(self._deadlines)[2]
                if not run.returned and not run.timed_out:
                    run.timed_out = True
                    self._stuck.add(run)
                    expired.append(run)
            if len(self._deadlines) > 64 and len(self._deadlines) > 2 * len(self.held):
                # Runs that returned in time leave their entries behind: drop them now and then.
                self._deadlines = [entry for entry in self._deadlines if not entry[2].returned]
                heapq.heapify(self._deadlines)
            stuck = len(self._stuck)
        for run in expired:
            self._time_out(run, stuck)

    def next_deadline(self) -> float | None:
        with self._lock:
            return self._deadlines[0][0] if self._deadlines else None

    def sleep_limit(self, timeout: float) -> float:
        """``timeout`` cut at the first run's deadline (a deadline ends the loop's sleep);
        until :meth:`awake`, a run that starts with an earlier deadline sets ``wake``."""
        now = time.monotonic()
        with self._lock:
            if self._deadlines:
                timeout = max(0.0, min(timeout, self._deadlines[0][0] - now))
            self._sleep_until = now + timeout
        return timeout

    def awake(self) -> None:
        self._sleep_until = 0.0

    # ------------------------------------------------------------------ the threads

    def _thread(self) -> None:
        """One of ``concurrency`` long-lived handler threads, each with its own connection."""
        while True:
            run = self._queue.get()
            if run is None:
                connections.close_all()
                return
            self._execute(run)
            tidy_connections()

    def _execute(self, run: Run) -> None:
        started = time.monotonic()
        if started >= run.lease_until or run.context.lease_lost:
            self._drop(run)
            return
        if signals.occurrence_started.has_listeners(self._sender):
            self._send(signals.occurrence_started, run, attempt=run.context.attempt, timeout=run.timeout)
            started = time.monotonic()
        if run.timeout is not None:
            run.thread_id = threading.get_ident()
            deadline = started + run.timeout
            with self._lock:
                heapq.heappush(self._deadlines, (deadline, next(self._deadline_order), run))
                wake = deadline < self._sleep_until  # the loop sleeps past it (see sleep_limit)
            if wake:
                self._wake()
        try:
            if self.instruments is None:
                outcome = call_handler(run.context)
            else:
                name = f"scheduler.run {run.context.kind}"
                parent = tracing.parent_of(run.occurrence.trace_context, run.occurrence.pk)
                outcome = self.instruments.run(
                    _span_attributes(run), name, lambda: call_handler(run.context), parent
                )
        except BaseException as exc:  # call_handler catches the handler's; this is ours
            logger.exception("unexpected error running %s", run.occurrence.pk)
            outcome = Outcome(run.context.occurrence_id, run.context.fence, FAILED, error=exc, exception=exc)
        with self._lock:
            late = run.timed_out
            run.returned = True
            self._stuck.discard(run)
        if late:
            # Already failed and settled (or about to be) by the loop: never settled twice.
            # The kernel's fence would refuse it anyway once the lease moved on.
            logger.warning(
                "%s: the handler returned %.1f s after its timeout; its outcome (%s) is dropped",
                run.occurrence.pk,
                time.monotonic() - started - (run.timeout or 0.0),
                outcome.status,
                extra=log_fields(run.occurrence, run.context.kind),
            )
            self._wake()  # a thread is free again
            return
        if run.context.progress_throttle is not None:  # only a run that reported progress
            _flush_progress(run)
        run.ran = time.monotonic() - started
        self._learn(run.ran)
        self.held.finish(run, outcome)

    def _drop(self, run: Run) -> None:
        """A run whose lease is known lost (marked, or past its end) never starts: its
        outcome could not be stored, and whoever reclaims the occurrence runs it. It is
        forgotten unsettled, with no event: its lease runs out (if it has not already) and
        the occurrence is claimed again, or dead-lettered on its final attempt."""
        ctx = run.context
        logger.warning(
            "%s: lease lost before its handler started (attempt %d/%d, fence %d): not running it",
            ctx.occurrence_id,
            ctx.attempt,
            ctx.max_attempts,
            ctx.fence,
            extra=log_fields(run.occurrence, ctx.kind, status="lease_lost"),
        )
        ctx.mark_lease_lost()
        self.held.forget(run, processed=False)
        self._wake()  # held one less: the loop may claim again

    def _time_out(self, run: Run, stuck: int) -> None:
        timeout = run.timeout or 0.0
        ctx = run.context
        message = f"the handler of kind {ctx.kind!r} did not return within its timeout of {timeout:g} s"
        # Where the thread is stuck is what the operator needs to see.
        frame = sys._current_frames().get(run.thread_id or 0)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        error = {"type": "HandlerTimeout", "message": message, "timeout": timeout, "traceback": stack}
        ctx.mark_lease_lost()  # a handler that looks at ctx.lease_lost stops
        run.ran = timeout
        self._learn(timeout)
        logger.warning(
            "%s: %s; failing it. Its thread stays busy until the handler returns (%d of %d stuck)",
            ctx.occurrence_id,
            message,
            stuck,
            self.concurrency,
            extra=log_fields(run.occurrence, ctx.kind, timeout=timeout),
        )
        exception = HandlerTimeout(message, timeout=timeout)
        self.held.finish(run, Outcome(ctx.occurrence_id, ctx.fence, FAILED, error=error, exception=exception))

    def _send(self, signal: Any, run: Run, **kwargs: Any) -> None:
        """Send one of :mod:`..signals` (the caller checked that it has receivers)."""
        sender, worker_id = self._sender, self._worker_id
        signals.send(
            signal, sender, worker_id=worker_id, occurrence=run.occurrence, kind=run.context.kind, **kwargs
        )


def _flush_progress(run: Run) -> None:
    """Write the run's last progress report if the throttle held it back: the final progress
    is stored before the outcome is. A failure only loses that report, with a log line."""
    try:
        run.context.flush_progress()
    except Exception as exc:
        logger.warning(
            "%s: could not record the last progress report: %s",
            run.occurrence.pk,
            exc,
            extra=log_fields(run.occurrence, run.context.kind),
        )


def _span_attributes(run: Run) -> dict[str, Any]:
    ctx = run.context
    return {
        **run.labels,
        "scheduler.occurrence_id": ctx.occurrence_id,
        "scheduler.job_id": ctx.job_id,
        "scheduler.attempt": ctx.attempt,
        "scheduler.fence": ctx.fence,
    }
