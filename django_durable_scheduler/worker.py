"""The lease-and-dispatch loop behind ``manage.py runscheduler``.

The loop thread does every kernel write of the hot path, in batches: settle the outcomes
that finished since its last turn (one transaction), claim up to the free capacity (one
transaction, which also authorizes what it claims), and hand the runnable ones to
``concurrency`` long-lived handler threads. A heartbeat thread renews the leases of
everything held (every lease/3) until it is settled. Handlers for kinds this process has
not registered are never claimed.

Between turns the loop sleeps until the next due slot, a finished handler, a wake-up or the
poll interval. A wake-up (NOTIFY, or a datagram on SQLite: see :mod:`.wakeup`) is latched
until the next claim starts, so one that comes in while the loop is busy (settling,
claiming, materializing, or with no free slot) is acted on by the next turn that can claim.

A run that passes its timeout (the job's, else the handler's, else
``DURABLE_SCHEDULER_HANDLER_TIMEOUT``) is failed by the loop as ``HandlerTimeout`` and
settled like any failure, so its lease is no longer renewed; Python cannot stop the thread,
so it stays counted against ``concurrency`` until the handler returns, and its late
outcome is dropped. When every handler thread is stuck so, the worker stops and
``run()`` returns EXIT_STUCK for its supervisor to restart it.

Logging (the ``django_durable_scheduler`` logger): a success at INFO, a retry at WARNING (a
``Retry`` the handler raised at INFO), a dead letter at ERROR, the failures with the
exception (``exc_info``) and every one with ``scheduler_*`` fields in ``extra``
(:func:`log_fields`). Signals: :mod:`.signals`.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from . import claiming, conf, kernel, metrics, registry, reservations, signals, wakeup
from .authority import principal_label
from .context import ExecutionContext
from .dialect import alias_for
from .exceptions import HandlerTimeout, InvalidArgument, LeaseLost, PermanentFailure, Retry, SchedulerError
from .identity import to_duration_ms, to_ms
from .models import Occurrence, OccurrenceStatus, WorkerHeartbeat

logger = logging.getLogger("django_durable_scheduler")

MAX_TRACEBACK = 16 * 1024
# How often the loop looks for due schedule slots and for expired final attempts (seconds):
# each check is one cheap query, but not one per claim.
MATERIALIZE_EVERY = 0.2
SWEEP_EVERY = 1.0
# Handlers that take less than this on average (seconds) are "fast": the loop then claims
# ahead (see claim_ahead), so that each turn's settle and claim transactions are
# shared by that many more occurrences: for handlers of a millisecond or less the loop's
# per-turn cost, not the handlers, bounds the rate. Slow handlers get no claim-ahead: rows
# waiting behind them would be rows other workers could run.
FAST_HANDLER = 0.05
# The least queued work (seconds per handler thread) a fast worker holds; it holds more when
# its turns take longer (TURNS_AHEAD of them), so the threads do not run dry before the next
# claim, and never more than LEASE_SHARE of the lease.
HOLD_AHEAD = 0.05
TURNS_AHEAD = 2
LEASE_SHARE = 0.25
# How long a finished outcome may wait for others before the loop settles it (seconds).
GATHER = 0.01
# An empty claim while work is due means other claimers hold those rows (SKIP LOCKED) or
# cannot yet take them: the loop looks again after this, doubling up to the poll interval,
# rather than idling a whole poll interval with nothing running (nothing would wake it).
LOCKED_RETRY = 0.02
# run()'s exit code when every handler thread is stuck in a handler past its timeout: the
# process can do no more work, and only a restart frees the threads.
EXIT_STUCK = 3


def _handler_units(occurrence: Occurrence) -> reservations.Units:
    """The units of the occurrence's handler registration (1 without a handler)."""
    handler = registry.get_handler(occurrence.claimed_kind or "")
    return handler.units if handler is not None else 1


def _timeout_of(occurrence: Occurrence, default: float | None) -> float | None:
    """The run's timeout in seconds: the job's, else its handler's, else ``default``."""
    ms = occurrence.claimed_timeout_ms
    if ms is None:
        handler = registry.get_handler(occurrence.claimed_kind or "")
        ms = handler.timeout_ms if handler is not None else None
    return default if ms is None else ms / 1000


def log_fields(occurrence: Occurrence, kind: str, **more: Any) -> dict[str, Any]:
    """The ``extra`` of this worker's log records about ``occurrence``: ``scheduler_*``
    attributes on the LogRecord (a prefix no LogRecord attribute has), for logging
    integrations that index them."""
    return {
        "scheduler_occurrence_id": occurrence.pk,
        "scheduler_job_id": occurrence.job_id,
        "scheduler_kind": kind,
        "scheduler_attempt": occurrence.attempt,
        "scheduler_max_attempts": occurrence.max_attempts,
        "scheduler_principal": principal_label(occurrence.authority),
        **{f"scheduler_{key}": value for key, value in more.items()},
    }


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_ahead(
    *, concurrency: int, handler_seconds: float, turn_seconds: float, lease: float, max_batch: int
) -> int:
    """How many occurrences a worker holds at once (running or queued for a handler thread).

    ``concurrency`` for slow handlers. For fast ones, as many as the threads run in the
    longer of HOLD_AHEAD and TURNS_AHEAD of the loop's recent turns, so that a worker with
    one thread batches as much as its handlers' speed allows, not a fixed multiple of its
    thread count; the last one queued starts within LEASE_SHARE of its lease (which the
    heartbeat renews meanwhile anyway). At most ``max_batch`` (MAX_CLAIM_BATCH).
    """
    if handler_seconds >= FAST_HANDLER:
        return concurrency
    horizon = min(max(HOLD_AHEAD, TURNS_AHEAD * turn_seconds), LEASE_SHARE * lease)
    per_thread = horizon / max(handler_seconds, 1e-6)
    return max(concurrency, min(int(concurrency * per_thread), max_batch))


class _Running:
    """A claimed occurrence, from its claim until it is settled (or given up)."""

    def __init__(self, occurrence: Occurrence, context: ExecutionContext, timeout: float | None) -> None:
        self.occurrence = occurrence
        self.context = context
        self.started = time.monotonic()
        self.outcome: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None  # the error settled, for the log
        self.done = threading.Event()
        self.timeout = timeout
        self.thread_id: int | None = None  # of the handler thread, while it runs with a timeout
        # Both under the worker's lock: the handler's outcome or the timeout, whichever is first.
        self.returned = False
        self.timed_out = False
        self.ran = 0.0  # seconds the handler ran (its timeout, if it timed out)
        self.labels: dict[str, str] = {}  # metric attributes, with the [otel] extra


def _one_line(error: BaseException | None) -> str:
    """An error as one log line (database errors often span several)."""
    try:
        text = " ".join(str(error).split()) if error is not None else ""
    except Exception:
        text = ""
    return f"{type(error).__name__}: {text[:500]}" if text else type(error).__name__


def _tidy_connections() -> None:
    """Keep this thread's connections open between occurrences (reconnecting costs more
    than the work), but drop one that saw an error and no longer answers."""
    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()


class Worker:
    """One scheduler process. ``run()`` returns the process exit code."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int = 8,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        kinds: list[str] | None = None,
        once: bool = False,
        burst: bool = False,
        max_occurrences: int | None = None,
        grace: float = 30.0,
        using: str | None = None,
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll_interval
        self.requested_kinds = kinds
        self.once = once
        self.burst = burst
        self.max_occurrences = max_occurrences
        self.grace = grace
        self.using = using
        self.processed = 0
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()  # ends the loop's sleep; see _sleep
        self._new_work = threading.Event()  # a wake-up came; cleared as the next claim starts
        self._stopping = threading.Event()
        self._signals = 0
        self._signal_pipe: tuple[int, int] | None = None  # (read, write), see _on_signal
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._principal_cursor: str | None = None
        self._queue: queue.Queue[_Running | None] = queue.Queue()
        self._finished: list[_Running] = []  # handlers done, outcomes not yet settled
        self._next_materialize = 0.0
        self._next_sweep = 0.0
        self._next_due: tuple[float, datetime | None] | None = None  # (read at, value)
        self._handler_seconds = 1.0  # moving average of handler run time (starts "slow")
        self._handler_runs = 0
        self._turn_seconds = 0.0  # moving average of a turn that claimed (settle to authorize)
        self._kinds: list[str] = []
        self._retry_wait = 0.0  # the current back-off while due work is held elsewhere
        self._listener: wakeup.Listener | wakeup.SocketListener | None = None
        self._listener_thread: threading.Thread | None = None
        # Runs with a timeout, by deadline (monotonic), and the runs past theirs whose
        # handlers have not returned: their threads are lost to the pool until they do.
        self._deadlines: list[tuple[float, int, _Running]] = []
        self._deadline_order = itertools.count()
        self._stuck: set[_Running] = set()
        self._sleep_until = 0.0  # when the loop's current sleep ends (see _sleep, _execute)
        self._exit_code = 0
        self._metrics = metrics.get()  # None without the [otel] extra: nothing is measured

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop claiming; running handlers get ``grace`` seconds to finish."""
        self._stopping.set()
        self._wake.set()

    def _announced(self) -> None:
        """The listener's callback: new work was committed. Latched until the next claim
        starts, so it is not lost if it comes while the loop is busy or has no free slot."""
        self._new_work.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM/SIGINT handler. Python runs it in the main thread between two of that
        thread's steps, which may be inside ``Event.wait`` or ``Event.clear`` holding the
        event's lock: stopping from here (``self._wake.set()``) would wait forever on a lock
        its own thread holds. So it takes no lock: it writes the signal to a pipe, and the
        ``dsch-signals`` thread logs it and stops the worker."""
        if self._signal_pipe is not None:
            with contextlib.suppress(OSError):  # a full pipe: the thread has signals to read
                os.write(self._signal_pipe[1], bytes([signum]))

    def _handle_signals(self) -> None:
        """The ``dsch-signals`` thread: the first signal stops the worker (running handlers
        get the grace period), a second one exits at once."""
        assert self._signal_pipe is not None
        while True:
            for signum in os.read(self._signal_pipe[0], 64):
                self._signals += 1
                if self._signals > 1:
                    logger.warning("second signal: exiting at once; unfinished leases will expire")
                    os._exit(1)
                logger.info("signal %s: stopping (grace %.1f s)", signal.Signals(signum).name, self.grace)
                self.stop()

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._signal_pipe is None:
            read, write = os.pipe()
            os.set_blocking(write, False)
            self._signal_pipe = (read, write)
            threading.Thread(target=self._handle_signals, name="dsch-signals", daemon=True).start()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def kinds(self) -> list[str]:
        local = registry.registered_kinds()
        if self.requested_kinds is None:
            return local
        return [kind for kind in local if kind in set(self.requested_kinds)]

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        kinds = self._kinds = self.kinds()
        logger.info(
            "worker %s: concurrency %d, lease %.1f s, kinds %s",
            self.worker_id,
            self.concurrency,
            self.lease,
            kinds,
        )
        # Listening before the first heartbeat: a worker that shows as started already hears
        # the wake-ups of enqueues made from then on.
        listener = wakeup.listener(alias_for(self.using), self._announced, logger)
        if not conf.settings.LISTEN and listener.supported:
            logger.info(
                "wake-ups off (DURABLE_SCHEDULER_LISTEN = False): polling every %.2f s", self.poll_interval
            )
        elif listener.supported and not (self.once or self.burst) and listener.open():
            self._listener = listener
            self._listener_thread = threading.Thread(target=listener.run, name="dsch-listen", daemon=True)
            self._listener_thread.start()
        self._beat(started=True)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat, name="dsch-heartbeat", daemon=True)
        self._heartbeat_thread.start()
        for n in range(self.concurrency):
            threading.Thread(target=self._pool_thread, name=f"dsch-run-{n}", daemon=True).start()
        failures = 0
        while not self._stopping.is_set():
            claimed: list[Occurrence] = []
            asked = 0
            attempted = drained = False
            try:
                turn_started = time.monotonic()
                _tidy_connections()
                self._expire()
                if len(self._stuck) >= self.concurrency:
                    self._give_up()
                    break
                self._flush()
                free = self._free()
                # Woken for new work: claim it first, and look after the schedules after.
                woken = self._new_work.is_set() and free > 0
                if not woken:
                    self._maintain()
                if free > 0 and kinds:
                    attempted = True
                    asked = min(free, conf.settings.MAX_CLAIM_BATCH)
                    # Cleared before the claim reads: a wake-up from now on gets another turn.
                    self._new_work.clear()
                    claimed = self._claim(asked, kinds)
                    if claimed:
                        self._turn_seconds += (time.monotonic() - turn_started - self._turn_seconds) / 10
                    if not claimed and not self._running:
                        # Empty may mean "locked by another claimer", not "nothing due".
                        drained = not kernel.has_due(kinds=kinds, using=self.using)
                if woken:
                    self._maintain()
                failures = 0
            except DatabaseError:
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                logger.exception("database error in the scheduler loop; retrying in %.1f s", delay)
                connections.close_all()
                self._stopping.wait(delay)
                continue
            if self.once:
                self._drain(None)
                break
            if (
                self.max_occurrences is not None
                and self.processed + len(self._running) >= self.max_occurrences
            ):
                self._drain(None)
                break
            if self.burst and attempted and not claimed and not self._running and drained:
                break
            if claimed and len(claimed) >= asked and len(self._running) < self._capacity():
                # A full batch: there may be more due work, claim again at once. A short one
                # means nothing else was claimable just now; claiming again at once would
                # only keep the GIL from the handler threads starting what was claimed.
                continue
            held_elsewhere = attempted and not claimed and not self._running and not drained
            if held_elsewhere:
                self._retry_wait = min(self.poll_interval, max(LOCKED_RETRY, 2 * self._retry_wait))
            else:
                self._retry_wait = 0.0
            wait = self._idle_wait()
            self._sleep(min(wait, self._retry_wait) if held_elsewhere else wait)
            self._gather()
        self._shutdown()
        return self._exit_code

    def _expire(self) -> None:
        """Fail every run past its deadline whose handler has not returned: settled by the
        next flush like any failure (so its lease is no longer renewed), while its thread
        stays counted as busy (``_stuck``) until the handler returns (see _execute)."""
        if not self._deadlines:
            return
        now = time.monotonic()
        expired: list[_Running] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                running = heapq.heappop(self._deadlines)[2]
                if not running.returned and not running.timed_out:
                    running.timed_out = True
                    self._stuck.add(running)
                    expired.append(running)
            if len(self._deadlines) > 64 and len(self._deadlines) > 2 * len(self._running):
                # Runs that returned in time leave their entries behind: drop them now and then.
                self._deadlines = [entry for entry in self._deadlines if not entry[2].returned]
                heapq.heapify(self._deadlines)
            stuck = len(self._stuck)
        for running in expired:
            self._time_out(running, stuck)

    def _time_out(self, running: _Running, stuck: int) -> None:
        timeout = running.timeout or 0.0
        ctx = running.context
        message = f"the handler of kind {ctx.kind!r} did not return within its timeout of {timeout:g} s"
        # Where the thread is stuck is what the operator needs to see.
        frame = sys._current_frames().get(running.thread_id or 0)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        error = {"type": "HandlerTimeout", "message": message, "timeout": timeout, "traceback": stack}
        ctx._lease_lost.set()  # a handler that looks at ctx.lease_lost stops
        running.ran = timeout
        self._learn(timeout)
        logger.warning(
            "%s: %s; failing it. Its thread stays busy until the handler returns (%d of %d stuck)",
            ctx.occurrence_id,
            message,
            stuck,
            self.concurrency,
            extra=log_fields(running.occurrence, ctx.kind, timeout=timeout),
        )
        exception = HandlerTimeout(message, timeout=timeout)
        self._finish(running, {"status": "failed", "error": error, "exception": exception})

    def _give_up(self) -> None:
        """Every handler thread is stuck: settle what finished (the timeouts among it), give
        the other leases back, and stop with EXIT_STUCK so a supervisor restarts the process."""
        with self._lock:
            kinds = sorted({running.context.kind for running in self._stuck})
        logger.error(
            "all %d handler threads are stuck in handlers past their timeout (kinds %s): "
            "stopping claims and exiting with code %d so that the process is restarted",
            self.concurrency,
            ", ".join(kinds),
            EXIT_STUCK,
        )
        self._exit_code = EXIT_STUCK
        self._stopping.set()

    def _next_deadline(self) -> float | None:
        with self._lock:
            return self._deadlines[0][0] if self._deadlines else None

    def _maintain(self) -> None:
        """Materialize the jobs' due slots and dead-letter expired leases, each on its own
        period."""
        now = time.monotonic()
        if now >= self._next_materialize:
            self._next_materialize = now + MATERIALIZE_EVERY
            kernel.materialize_due(using=self.using)
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_EVERY
            kernel.dead_letter_expired(using=self.using)

    def _free(self) -> int:
        """How many more occurrences this turn may claim."""
        free = self._capacity() - len(self._running)
        if self.max_occurrences is not None:
            free = min(free, self.max_occurrences - self.processed - len(self._running))
        return free

    def _turn_due(self) -> bool:
        """Whether the next turn has something to do at once: outcomes to settle, stopping,
        or a wake-up and a free slot to claim it into."""
        return (
            bool(self._finished)
            or self._stopping.is_set()
            or (self._new_work.is_set() and bool(self._kinds) and self._free() > 0)
        )

    def _sleep(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, unless or until the next turn has something to
        do. The event is cleared before the state is read: whatever sets it afterwards ends
        the sleep, and whatever came before is seen in the state."""
        self._wake.clear()
        if not self._turn_due():
            now = time.monotonic()
            with self._lock:
                if self._deadlines:  # a run's deadline ends the sleep
                    timeout = max(0.0, min(timeout, self._deadlines[0][0] - now))
                self._sleep_until = now + timeout
            self._wake.wait(timeout)
            self._sleep_until = 0.0

    def _gather(self) -> None:
        """Once a handler has finished, wait up to GATHER seconds for others still running,
        until half of what is held has finished: then one settle (and the claim after it)
        serves them all, instead of one loop turn per finished handler. A wake-up ends the
        wait: new work is not kept waiting for a settle."""
        deadline = time.monotonic() + GATHER
        while True:
            self._wake.clear()
            with self._lock:
                finished = len(self._finished)
                executing = len(self._running) - finished
            if not finished or executing <= 0 or 2 * finished >= self._capacity():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set() or self._new_work.is_set():
                return
            self._wake.wait(remaining)

    def _capacity(self) -> int:
        """How many occurrences to hold at once (see claim_ahead); never more than
        --max-occurrences allows (_free checks)."""
        threads = self.concurrency - len(self._stuck)
        if self.once or threads <= 0:
            return max(threads, 0)
        return claim_ahead(
            concurrency=threads,
            handler_seconds=self._handler_seconds,
            turn_seconds=self._turn_seconds,
            lease=self.lease,
            max_batch=conf.settings.MAX_CLAIM_BATCH,
        )

    def _idle_wait(self) -> float:
        """Sleep until the next poll, or sooner when a job's next slot comes first. The
        earliest next fire time is read at most every MATERIALIZE_EVERY: a busy loop waits
        often, and a slot learnt of that much later is materialized that much later."""
        now = time.monotonic()
        if self._next_due is None or now - self._next_due[0] >= MATERIALIZE_EVERY:
            try:
                self._next_due = (now, kernel.next_due_at(using=self.using))
            except DatabaseError:
                return self.poll_interval
        due = self._next_due[1]
        if due is None:
            return self.poll_interval
        return max(0.0, min(self.poll_interval, (due - conf.now()).total_seconds()))

    def _drain(self, timeout: float | None) -> None:
        """Settle what is pending until nothing is held (or ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._wake.clear()  # before the state is read, as in _sleep
            self._expire()
            if len(self._stuck) >= self.concurrency and self._exit_code != EXIT_STUCK:
                self._give_up()  # what is left to run never will: settle, give up the rest
                deadline = time.monotonic()
            try:
                self._flush()
            except DatabaseError:
                logger.exception("database error while finishing the running occurrences; retrying")
                connections.close_all()
                time.sleep(0.5)
            with self._lock:
                if not self._running:
                    return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            wait = 0.5 if remaining is None else min(0.5, remaining)
            due = self._next_deadline()
            if due is not None:
                wait = max(0.0, min(wait, due - time.monotonic()))
            self._wake.wait(wait)

    def _shutdown(self) -> None:
        # Stuck: no thread is left to finish anything; settle what has finished, no more.
        self._drain(0 if self._exit_code == EXIT_STUCK else self.grace)
        # Past the grace period: what no handler thread has started yet must never start
        # (its lease is given back below, and another worker may run it).
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        with self._lock:
            left = list(self._running.values())
        self._release(left, "after the grace period")
        for _ in range(self.concurrency):
            self._queue.put(None)
        if self._listener is not None and self._listener_thread is not None:
            self._listener.stop()
            self._listener_thread.join(timeout=5)
        self._heartbeat_stop.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=30)
        self._beat(stopped=True)
        connections.close_all()

    def _release(self, held: list[_Running], why: str) -> None:
        for running in held:
            occurrence = running.occurrence
            try:
                kernel.release(occurrence.pk, owner=self.worker_id, fence=occurrence.fence, using=self.using)
                logger.warning("gave up the lease on %s %s", occurrence.pk, why)
            except (SchedulerError, DatabaseError) as exc:
                logger.warning("could not give up the lease on %s: %s", occurrence.pk, exc)
            running.context._lease_lost.set()
            self._forget(running)

    # ------------------------------------------------------------------ execution

    def _hold(self, claimed: list[Occurrence]) -> list[_Running]:
        """Register claimed occurrences as held (the heartbeat renews their leases)."""
        held = []
        default_timeout = conf.settings.HANDLER_TIMEOUT if claimed else None
        for occurrence in claimed:
            context = ExecutionContext(
                occurrence_id=occurrence.pk,
                job_id=occurrence.job_id,
                kind=occurrence.claimed_kind or "",
                attempt=occurrence.attempt,
                max_attempts=occurrence.max_attempts,
                fence=occurrence.fence,
                scheduled_for=occurrence.scheduled_for,
                payload=occurrence.payload,
                authority=occurrence.authority,
                owner=self.worker_id,
                using=self.using,
                enqueued_at=occurrence.created_at,
                claimed_at=occurrence.updated_at,  # set by the claim
                priority=occurrence.priority,
            )
            running = _Running(occurrence, context, _timeout_of(occurrence, default_timeout))
            with self._lock:
                self._running[occurrence.pk] = running
            held.append(running)
        return held

    def _forget(self, running: _Running) -> None:
        with self._lock:
            self._running.pop(running.occurrence.pk, None)
            self.processed += 1
        running.done.set()

    def _claim(self, asked: int, kinds: list[str]) -> list[Occurrence]:
        """Claim and authorize up to ``asked`` occurrences in one transaction (one commit
        before the handlers start), then hand the runnable ones to the handler threads.
        Denied ones are dead-lettered, deferred ones wait for their window (both written in
        that transaction); a failing units function is the occurrence's durable failure.
        Returns everything claimed, in claim order."""
        batch = claiming.claim_authorized(
            owner=self.worker_id,
            lease=self.lease,
            limit=asked,
            kinds=kinds,
            units_of=_handler_units,
            after_principal=self._principal_cursor,
            sweep_expired=False,
            using=self.using,
        )
        if batch.claimed:
            # Round-robin: the next claim starts after the last principal served.
            self._principal_cursor = batch.claimed[-1].principal_key
        for occurrence, result in batch.refused:
            self._refused(occurrence, result)
        with self._lock:
            self.processed += len(batch.refused)
        unpriced = self._hold([occurrence for occurrence, _ in batch.unpriced])
        for running, (_, exc) in zip(unpriced, batch.unpriced, strict=True):
            error = {"type": "InvalidUnits", "message": str(exc)}
            self._finish(running, {"status": "failed", "error": error, "retryable": False, "exception": exc})
        runnable = self._hold(batch.runnable)
        if self._metrics is not None:
            self._measure_claims(self._metrics, runnable)
        if signals.occurrence_claimed.has_listeners(Worker):
            for running in runnable:
                self._send(signals.occurrence_claimed, running.occurrence, running.context.kind)
        for running in runnable:
            self._queue.put(running)
        return batch.claimed

    @staticmethod
    def _measure_claims(instruments: metrics.Instruments, runnable: list[_Running]) -> None:
        now = conf.now()
        for running in runnable:
            occurrence = running.occurrence
            labels = running.labels = metrics.labels(running.context.kind, occurrence.authority)
            instruments.claimed.add(1, labels)
            instruments.due_lag.record(max(0.0, (now - occurrence.available_at).total_seconds()), labels)
            if occurrence.charged_units:
                instruments.budget_runs.add(1, labels)
                instruments.budget_units.add(occurrence.charged_units, labels)

    def _send(self, signal: Any, occurrence: Occurrence, kind: str, **kwargs: Any) -> None:
        """Send one of :mod:`.signals` (the caller checked that it has receivers)."""
        signals.send(signal, Worker, worker_id=self.worker_id, occurrence=occurrence, kind=kind, **kwargs)

    def _refused(self, occurrence: Occurrence, result: reservations.Authorization) -> None:
        """Log (and signal) an occurrence its authority refused: a denial, dead-lettered,
        at WARNING; a budget deferral, which only waits, at INFO."""
        kind = occurrence.claimed_kind or ""
        if result.verdict == reservations.LEASE_LOST:
            logger.warning(
                "%s: lease lost before authorization", occurrence.pk, extra=log_fields(occurrence, kind)
            )
            return
        error = result.error or {}
        reason = error.get("reason") or result.verdict
        denied = result.verdict == reservations.DENIED
        # The stored message names the reason and what was refused (the missing
        # capabilities, the principal), so the log line alone tells the operator.
        logger.log(
            logging.WARNING if denied else logging.INFO,
            "%s %s job=%s kind=%s principal=%s: %s: %s",
            occurrence.pk,
            result.verdict,
            occurrence.job_id,
            kind,
            principal_label(occurrence.authority),
            reason,
            error.get("message", "by authority"),
            extra=log_fields(occurrence, kind, status=result.verdict, reason=reason),
        )
        if self._metrics is not None:
            counter = self._metrics.denied if denied else self._metrics.deferred
            counter.add(1, metrics.labels(kind, occurrence.authority))
            if denied:
                self._metrics.dead_lettered.add(1, metrics.labels(kind, occurrence.authority))
        if denied:
            if signals.authority_denied.has_listeners(Worker):
                self._send(signals.authority_denied, occurrence, kind, reason=reason, error=error)
            if signals.occurrence_dead_lettered.has_listeners(Worker):
                self._send(signals.occurrence_dead_lettered, occurrence, kind, error=error, exception=None)
        elif signals.budget_deferred.has_listeners(Worker):
            self._send(signals.budget_deferred, occurrence, kind, reason=reason)

    def _finish(self, running: _Running, outcome: dict[str, Any]) -> None:
        """Hand an outcome to the loop thread, which settles it with the others."""
        running.outcome = outcome
        with self._lock:
            self._finished.append(running)
        self._wake.set()

    def _execute(self, running: _Running) -> None:
        if signals.occurrence_started.has_listeners(Worker):
            self._send(
                signals.occurrence_started,
                running.occurrence,
                running.context.kind,
                attempt=running.context.attempt,
                timeout=running.timeout,
            )
        started = time.monotonic()
        if running.timeout is not None:
            running.thread_id = threading.get_ident()
            deadline = started + running.timeout
            with self._lock:
                heapq.heappush(self._deadlines, (deadline, next(self._deadline_order), running))
                wake = deadline < self._sleep_until  # the loop sleeps past it (see _sleep)
            if wake:
                self._wake.set()
        try:
            if self._metrics is None:
                outcome = self._call_handler(running.context)
            else:
                outcome = self._metrics.run(
                    self._span_attributes(running),
                    f"scheduler.run {running.context.kind}",
                    lambda: self._call_handler(running.context),
                )
        except Exception as exc:  # _call_handler catches the handler's; this is ours
            logger.exception("unexpected error running %s", running.occurrence.pk)
            outcome = {"status": "failed", "error": exc, "exception": exc}
        with self._lock:
            late = running.timed_out
            running.returned = True
            self._stuck.discard(running)
        if late:
            # Already failed and settled (or about to be) by the loop: never settled twice.
            # The kernel's fence would refuse it anyway once the lease moved on.
            logger.warning(
                "%s: the handler returned %.1f s after its timeout; its outcome (%s) is dropped",
                running.occurrence.pk,
                time.monotonic() - started - (running.timeout or 0.0),
                outcome["status"],
                extra=log_fields(running.occurrence, running.context.kind),
            )
            self._wake.set()  # a thread is free again
            return
        running.ran = time.monotonic() - started
        self._learn(running.ran)
        self._finish(running, outcome)

    @staticmethod
    def _span_attributes(running: _Running) -> dict[str, Any]:
        ctx = running.context
        return {
            **running.labels,
            "scheduler.occurrence_id": ctx.occurrence_id,
            "scheduler.job_id": ctx.job_id,
            "scheduler.attempt": ctx.attempt,
            "scheduler.fence": ctx.fence,
        }

    def _learn(self, seconds: float) -> None:
        """Fold one handler run time into the average that sizes the claim-ahead: the mean
        of the runs so far, then a moving average over about the last 20 (a race between
        threads loses an update at worst). A worker learns its handlers' speed from its
        first few runs, not after the hundred that the slow starting guess would take."""
        self._handler_runs += 1
        self._handler_seconds += (seconds - self._handler_seconds) / min(self._handler_runs, 20)

    def _pool_thread(self) -> None:
        """One of ``concurrency`` long-lived handler threads, each with its own connection."""
        while True:
            running = self._queue.get()
            if running is None:
                connections.close_all()
                return
            self._execute(running)
            _tidy_connections()

    def _flush(self) -> None:
        """Settle every finished outcome in one transaction. When the database refuses the
        batch, each outcome is settled on its own, so that one the database cannot store
        fails alone rather than stall the rest; while the database does not answer at all
        they stay pending (their leases are still renewed) and the next turn tries again."""
        with self._lock:
            finished, self._finished = self._finished, []
        if not finished:
            return
        items = [self._settle_item(running) for running in finished]
        for running, item in zip(finished, items, strict=True):
            running.error = item.get("error")
        results: list[Occurrence | LeaseLost | None] = []
        try:
            results.extend(kernel.settle_many(items, owner=self.worker_id, using=self.using))
        except (InvalidArgument, DatabaseError) as exc:
            try:
                if isinstance(exc, DatabaseError) and not self._database_answers():
                    raise
                logger.warning(
                    "could not settle %d outcomes together (%s); settling them one by one",
                    len(finished),
                    _one_line(exc),
                )
                for running, item in zip(finished, items, strict=True):
                    results.append(self._settle_alone(running, item))
            except DatabaseError:
                with self._lock:
                    self._finished = finished[len(results) :] + self._finished
                self._report(finished[: len(results)], results)
                raise
        self._report(finished, results)

    def _report(self, finished: list[_Running], results: list[Occurrence | LeaseLost | None]) -> None:
        for running, settled in zip(finished, results, strict=True):
            ctx = running.context
            if isinstance(settled, LeaseLost):
                ctx._lease_lost.set()
                logger.warning("%s: result not recorded: %s", ctx.occurrence_id, settled)
            elif settled is not None:
                self._log_outcome(running, settled.status)
                self._signal_outcome(running, settled.status)
                if self._metrics is not None:
                    self._measure_outcome(self._metrics, running, settled.status)
            self._forget(running)

    @staticmethod
    def _log_outcome(running: _Running, status: str) -> None:
        """One line per settled run: success at INFO, a retry at WARNING (INFO when the
        handler asked for it with ``Retry``), a dead letter at ERROR; failures carry the
        exception and traceback (``exc_info``) where there is one."""
        error = running.error
        if status == OccurrenceStatus.SUCCEEDED:
            level = logging.INFO
        elif status == OccurrenceStatus.RETRY_WAIT:
            level = logging.INFO if error is not None and error.get("type") == "Retry" else logging.WARNING
        else:
            level = logging.ERROR
        if not logger.isEnabledFor(level):
            return
        ctx = running.context
        seconds = time.monotonic() - running.started
        args: tuple[Any, ...] = (
            ctx.occurrence_id,
            status,
            ctx.job_id,
            ctx.kind,
            ctx.attempt,
            ctx.max_attempts,
            seconds * 1000,
        )
        fields = log_fields(running.occurrence, ctx.kind, status=status, duration_ms=round(seconds * 1000))
        if error is None:
            logger.log(level, "%s %s job=%s kind=%s attempt=%d/%d in %.0f ms", *args, extra=fields)
            return
        kind = error.get("type") or "Error"
        fields["scheduler_error_type"] = kind
        exception = running.outcome.get("exception")
        logger.log(
            level,
            "%s %s job=%s kind=%s attempt=%d/%d in %.0f ms: %s: %s",
            *args,
            kind,
            error.get("message", ""),
            exc_info=exception if isinstance(exception, BaseException) and level > logging.INFO else None,
            extra=fields,
        )

    @staticmethod
    def _measure_outcome(instruments: metrics.Instruments, running: _Running, status: str) -> None:
        labels = running.labels or metrics.labels(running.context.kind, running.occurrence.authority)
        if status == OccurrenceStatus.SUCCEEDED:
            instruments.succeeded.add(1, labels)
        elif status == OccurrenceStatus.RETRY_WAIT:
            instruments.failed.add(1, labels)
        else:
            instruments.dead_lettered.add(1, labels)
        if running.ran:
            instruments.run_duration.record(running.ran, labels)

    def _signal_outcome(self, running: _Running, status: str) -> None:
        finished = signals.occurrence_finished.has_listeners(Worker)
        dead = status == OccurrenceStatus.DEAD_LETTER
        dead = dead and signals.occurrence_dead_lettered.has_listeners(Worker)
        if not (finished or dead):
            return
        occurrence, kind = running.occurrence, running.context.kind
        exception = running.outcome.get("exception")
        if finished:
            self._send(
                signals.occurrence_finished,
                occurrence,
                kind,
                outcome=str(status),
                result=running.outcome.get("result") if status == OccurrenceStatus.SUCCEEDED else None,
                error=running.error,
                exception=exception,
                duration=time.monotonic() - running.started,
            )
        if dead:
            error = running.error
            self._send(signals.occurrence_dead_lettered, occurrence, kind, error=error, exception=exception)

    def _database_answers(self) -> bool:
        """Whether the database answers at all: tells an outage (everything waits for it to
        come back) from an error that only some statement's values cause."""
        conn = connections[alias_for(self.using)]
        try:
            conn.close_if_unusable_or_obsolete()
            conn.ensure_connection()
            return bool(conn.is_usable())
        except DatabaseError:
            return False

    def _settle_item(self, running: _Running) -> dict[str, Any]:
        """The settle arguments of a handler's outcome, made storable: a result the database
        could not store is the occurrence's failure, dead-lettered at once (the handler would
        return the same again), and error text is repaired and cut to its limits."""
        outcome = running.outcome
        item: dict[str, Any] = {"occurrence_id": running.occurrence.pk, "fence": running.occurrence.fence}
        if outcome["status"] == "succeeded":
            try:
                return {**item, "outcome": "succeeded", "result": kernel.storable_result(outcome["result"])}
            except SchedulerError as exc:
                reason = f"the handler's result could not be stored: {exc}"
                return self._failure(item, "InvalidResult", reason)
        retry_at = outcome.get("retry_at")
        if retry_at is not None:
            try:
                to_ms(retry_at, "Retry.at")
            except SchedulerError as exc:
                return self._failure(
                    item, "InvalidRetry", f"the handler's Retry could not be scheduled: {exc}"
                )
        return {
            **item,
            "outcome": "failed",
            "error": kernel.storable_error(outcome["error"]),
            "retryable": outcome.get("retryable", True) is not False,
            "retry_at": retry_at,
        }

    @staticmethod
    def _failure(item: dict[str, Any], kind: str, reason: str) -> dict[str, Any]:
        """``item``'s occurrence failed for good with ``reason``, whatever outcome it held."""
        error = kernel.storable_error({"type": kind, "message": reason})
        held = {key: item[key] for key in ("occurrence_id", "fence")}
        return {**held, "outcome": "failed", "error": error, "retryable": False}

    def _settle_alone(self, running: _Running, item: dict[str, Any]) -> Occurrence | LeaseLost | None:
        """Settle one outcome on its own, after its batch failed. One the kernel refuses, or
        that the database refuses twice while it answers otherwise, is recorded as the
        occurrence's failure instead (dead-lettered: it would be refused again). If even
        that is refused, the occurrence is given up with one log line: it is no longer
        renewed, and its lease expires as a crashed worker's would. A DatabaseError means
        the database stopped answering: the caller keeps what is left for the next turn."""
        problem: Exception | None = None
        for _ in range(2):  # twice: a deadlock or a lost connection rarely repeats
            try:
                return kernel.settle(owner=self.worker_id, using=self.using, **item)
            except LeaseLost as exc:
                return exc
            except InvalidArgument as exc:
                problem = exc
                break
            except DatabaseError as exc:
                if not self._database_answers():
                    raise
                problem = exc
        reason = f"the handler's outcome could not be stored: {_one_line(problem)}"
        failure = self._failure(item, "UnstorableOutcome", reason)
        try:
            return kernel.settle(owner=self.worker_id, using=self.using, **failure)
        except LeaseLost as exc:
            return exc
        except (SchedulerError, DatabaseError) as exc:
            if isinstance(exc, DatabaseError) and not self._database_answers():
                raise
            logger.error(
                "%s: could not record its outcome (%s) nor that failure (%s); "
                "no longer renewing its lease, which will expire",
                running.occurrence.pk,
                _one_line(problem),
                _one_line(exc),
            )
            return None

    def _call_handler(self, ctx: ExecutionContext) -> dict[str, Any]:
        handler = registry.get_handler(ctx.kind)
        if handler is None:  # unregistered after the claim
            return {
                "status": "failed",
                "error": {"message": f"no handler for kind {ctx.kind!r}"},
                "retryable": True,
            }
        try:
            result = handler.func(ctx)
        except Retry as exc:
            retry_at = exc.at
            if exc.delay is not None:
                delay_ms = to_duration_ms(exc.delay, "Retry.delay", minimum_ms=0)
                retry_at = conf.now() + timedelta(milliseconds=delay_ms)
            return {
                "status": "failed",
                "error": {**kernel.storable_error(exc), "type": "Retry"},
                "retry_at": retry_at,
                "exception": exc,
            }
        except PermanentFailure as exc:
            error = {**kernel.storable_error(exc), "type": "PermanentFailure", "code": exc.code}
            return {"status": "failed", "error": error, "retryable": False, "exception": exc}
        except Exception as exc:
            error = {**kernel.storable_error(exc), "traceback": traceback.format_exc()[-MAX_TRACEBACK:]}
            return {"status": "failed", "error": error, "exception": exc}
        return {"status": "succeeded", "result": result}

    # ------------------------------------------------------------------ heartbeat

    def _beat(self, *, started: bool = False, stopped: bool = False) -> None:
        """Upsert this process's row in the workers table (what the status command lists)."""
        now = conf.now()
        values: dict[str, Any] = {"last_seen_at": now}
        if stopped or started:
            values["stopped_at"] = now if stopped else None
        if started:
            values.update(
                hostname=socket.gethostname(),
                pid=os.getpid(),
                concurrency=self.concurrency,
                kinds=self.kinds(),
                started_at=now,
            )
        try:
            if started:
                WorkerHeartbeat.objects.using(self.using).update_or_create(
                    worker_id=self.worker_id, defaults=values
                )
            else:
                WorkerHeartbeat.objects.using(self.using).filter(worker_id=self.worker_id).update(**values)
        except DatabaseError:
            logger.warning("could not record the worker heartbeat of %s", self.worker_id)

    def _heartbeat(self) -> None:
        """Renew running leases every lease/3, and beat the worker row at least every 10 s."""
        lease_every = max(0.05, self.lease / 3)
        tick = min(lease_every, 10.0)
        last_renew = time.monotonic()
        while not self._heartbeat_stop.wait(tick):
            try:
                self._beat()
                if time.monotonic() - last_renew >= lease_every - tick / 2:
                    last_renew = time.monotonic()
                    self._renew_all()
            except Exception:
                # The heartbeat must outlive anything one renewal throws, or every lease expires.
                logger.exception("heartbeat error; continuing")
                close_old_connections()
        connections.close_all()

    def _renew_all(self) -> None:
        with self._lock:
            running = list(self._running.values())
        for item in running:
            occurrence = item.occurrence
            try:
                kernel.renew(
                    occurrence.pk,
                    owner=self.worker_id,
                    fence=occurrence.fence,
                    lease=self.lease,
                    using=self.using,
                )
            except LeaseLost:
                if occurrence.pk in self._running:  # not merely settled in the meantime
                    item.context._lease_lost.set()
            except DatabaseError:
                logger.warning("heartbeat could not renew %s; will retry", occurrence.pk)
                close_old_connections()
