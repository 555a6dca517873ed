"""The lease-and-dispatch loop behind ``manage.py runscheduler``.

claim a batch up to free capacity -> run each handler in its own thread while a
heartbeat renews the leases (every lease/3) -> settle. Handlers for kinds this process
has not registered are never claimed.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from datetime import timedelta
from types import FrameType
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections

from . import conf, dialect, kernel, registry, reservations
from .context import ExecutionContext
from .exceptions import InvalidArgument, LeaseLost, PermanentFailure, Retry, SchedulerError
from .identity import to_duration_ms
from .models import Occurrence, WorkerHeartbeat

logger = logging.getLogger("django_durable_scheduler")

MAX_TRACEBACK = 16 * 1024
# How often the loop looks for due schedule slots and for expired final attempts (seconds):
# each check is one cheap query, but not one per claim.
MATERIALIZE_EVERY = 0.2
SWEEP_EVERY = 1.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _Running:
    def __init__(self, occurrence: Occurrence, context: ExecutionContext) -> None:
        self.occurrence = occurrence
        self.context = context
        self.done = threading.Event()


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
        concurrency: int = 4,
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
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._signals = 0
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._principal_cursor: str | None = None
        self._queue: queue.Queue[_Running | None] = queue.Queue()
        self._next_materialize = 0.0
        self._next_sweep = 0.0
        self._listener: dialect.Listener | None = None
        self._listener_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop claiming; running handlers get ``grace`` seconds to finish."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("second signal: exiting at once; unfinished leases will expire")
            os._exit(1)
        logger.info("signal %s: stopping (grace %.1f s)", signal.Signals(signum).name, self.grace)
        self.stop()

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)

    def kinds(self) -> list[str]:
        local = registry.registered_kinds()
        if self.requested_kinds is None:
            return local
        return [kind for kind in local if kind in set(self.requested_kinds)]

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        kinds = self.kinds()
        logger.info(
            "worker %s: concurrency %d, lease %.1f s, kinds %s",
            self.worker_id,
            self.concurrency,
            self.lease,
            kinds,
        )
        self._beat(started=True)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat, name="dsch-heartbeat", daemon=True)
        self._heartbeat_thread.start()
        for n in range(self.concurrency):
            threading.Thread(target=self._pool_thread, name=f"dsch-run-{n}", daemon=True).start()
        listener = dialect.Listener(self.using or DEFAULT_DB_ALIAS, self._wake.set, logger)
        if listener.supported and not (self.once or self.burst):
            self._listener = listener
            self._listener_thread = threading.Thread(target=listener.run, name="dsch-listen", daemon=True)
            self._listener_thread.start()
        failures = 0
        while not self._stopping.is_set():
            claimed: list[Occurrence] = []
            attempted = drained = False
            free = self.concurrency - len(self._running)
            if self.max_occurrences is not None:
                free = min(free, self.max_occurrences - self.processed - len(self._running))
            try:
                _tidy_connections()
                now = time.monotonic()
                if now >= self._next_materialize:
                    self._next_materialize = now + MATERIALIZE_EVERY
                    kernel.materialize_due(using=self.using)
                if now >= self._next_sweep:
                    self._next_sweep = now + SWEEP_EVERY
                    kernel.dead_letter_expired(using=self.using)
                if free > 0 and kinds:
                    attempted = True
                    claimed = kernel.claim_batch(
                        owner=self.worker_id,
                        lease=self.lease,
                        limit=free,
                        kinds=kinds,
                        after_principal=self._principal_cursor,
                        sweep_expired=False,
                        using=self.using,
                    )
                    if claimed:
                        # Round-robin: the next claim starts after the last principal served.
                        self._principal_cursor = claimed[-1].principal_key
                    self._start(claimed)
                    if self.burst and not claimed and not self._running:
                        # Empty may mean "locked by another claimer", not "nothing due".
                        drained = not kernel.has_due(kinds=kinds, using=self.using)
                failures = 0
            except DatabaseError:
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                logger.exception("database error in the scheduler loop; retrying in %.1f s", delay)
                connections.close_all()
                self._stopping.wait(delay)
                continue
            if self.once:
                self._wait_all(None)
                break
            if (
                self.max_occurrences is not None
                and self.processed + len(self._running) >= self.max_occurrences
            ):
                self._wait_all(None)
                break
            if self.burst and attempted and not claimed and not self._running and drained:
                break
            if claimed and len(self._running) < self.concurrency:
                continue  # there may be more due work: claim again at once
            self._wake.wait(self._idle_wait())
            self._wake.clear()
        self._shutdown()
        return 0

    def _idle_wait(self) -> float:
        """Sleep until the next poll, or sooner when a job's next slot comes first."""
        try:
            due = kernel.next_due_at(using=self.using)
        except DatabaseError:
            return self.poll_interval
        if due is None:
            return self.poll_interval
        return max(0.0, min(self.poll_interval, (due - conf.now()).total_seconds()))

    def _wait_all(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                pending = [r.done for r in self._running.values()]
            if not pending:
                return
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            pending[0].wait(remaining)
            if deadline is not None and time.monotonic() >= deadline:
                return

    def _shutdown(self) -> None:
        self._wait_all(self.grace)
        with self._lock:
            left = list(self._running.values())
        for running in left:
            occurrence = running.occurrence
            try:
                kernel.release(occurrence.pk, owner=self.worker_id, fence=occurrence.fence, using=self.using)
                logger.warning("gave up the lease on %s after the grace period", occurrence.pk)
            except SchedulerError as exc:
                logger.warning("could not give up the lease on %s: %s", occurrence.pk, exc)
            running.context._lease_lost.set()
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

    # ------------------------------------------------------------------ execution

    def _start(self, claimed: list[Occurrence]) -> None:
        if not claimed:
            return
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
            )
            running = _Running(occurrence, context)
            with self._lock:
                self._running[occurrence.pk] = running
            self._queue.put(running)

    def _execute(self, running: _Running) -> None:
        occurrence, ctx = running.occurrence, running.context
        started = time.monotonic()
        try:
            verdict = self._authorize(occurrence, ctx)
            if verdict is not None:
                logger.info("%s %s job=%s kind=%s by authority", occurrence.pk, verdict, ctx.job_id, ctx.kind)
                return
            outcome = self._call_handler(ctx)
            self._settle(occurrence, outcome)
            logger.info(
                "%s %s job=%s kind=%s attempt=%d/%d in %.0f ms",
                occurrence.pk,
                outcome["status"],
                ctx.job_id,
                ctx.kind,
                ctx.attempt,
                ctx.max_attempts,
                (time.monotonic() - started) * 1000,
            )
        except Exception:
            logger.exception("unexpected error running %s", occurrence.pk)
        finally:
            with self._lock:
                self._running.pop(occurrence.pk, None)
                self.processed += 1
            running.done.set()
            _tidy_connections()
            self._wake.set()

    def _pool_thread(self) -> None:
        """One of ``concurrency`` long-lived handler threads, each with its own connection."""
        while True:
            running = self._queue.get()
            if running is None:
                connections.close_all()
                return
            self._execute(running)

    def _authorize(self, occurrence: Occurrence, ctx: ExecutionContext) -> str | None:
        """Check and reserve the principal's authority; None when the handler may run, else
        what happened instead ("denied": dead-lettered, "deferred": waits for the window,
        "lease_lost", "failed": the registration's ``units`` function failed or gave a bad
        value, a durable non-retryable failure; "unauthorized": the database kept failing,
        the lease expires and the occurrence comes back)."""
        handler = registry.get_handler(ctx.kind)
        units = handler.units if handler is not None else 1
        for attempt in range(5):
            try:
                verdict = reservations.authorize(
                    occurrence, units=units, owner=self.worker_id, using=self.using
                )
            except LeaseLost as exc:
                ctx._lease_lost.set()
                logger.warning("%s: lease lost before authorization: %s", occurrence.pk, exc)
                return "lease_lost"
            except InvalidArgument as exc:
                error = {"type": "InvalidUnits", "message": str(exc)}
                self._settle(occurrence, {"status": "failed", "error": error, "retryable": False})
                return "failed"
            except DatabaseError:
                logger.exception("database error authorizing %s (try %d)", occurrence.pk, attempt + 1)
                connections.close_all()
                time.sleep(min(5.0, 0.2 * 2**attempt))
                continue
            return verdict if verdict in (reservations.DENIED, reservations.DEFERRED) else None
        return "unauthorized"

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
            return {"status": "failed", "error": {"type": "Retry", "message": str(exc)}, "retry_at": retry_at}
        except PermanentFailure as exc:
            error = {"type": "PermanentFailure", "message": str(exc), "code": exc.code}
            return {"status": "failed", "error": error, "retryable": False}
        except Exception as exc:
            error = {
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc()[-MAX_TRACEBACK:],
            }
            return {"status": "failed", "error": error}
        return {"status": "succeeded", "result": result}

    def _settle(self, occurrence: Occurrence, outcome: dict[str, Any]) -> None:
        kwargs: dict[str, Any] = {"owner": self.worker_id, "fence": occurrence.fence, "using": self.using}
        # Keep trying through a database outage for as long as the lease could still hold:
        # giving up earlier would make finished work run again after the lease expires.
        deadline = time.monotonic() + self.lease
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            try:
                try:
                    if outcome["status"] == "succeeded":
                        kernel.settle(occurrence.pk, outcome="succeeded", result=outcome["result"], **kwargs)
                    else:
                        kernel.settle(
                            occurrence.pk,
                            outcome="failed",
                            error=outcome["error"],
                            retryable=outcome.get("retryable", True),
                            retry_at=outcome.get("retry_at"),
                            **kwargs,
                        )
                except InvalidArgument as exc:
                    # A result that is not JSON or too large is the handler's durable failure.
                    outcome.update(status="failed", error={"type": "InvalidResult", "message": str(exc)})
                    kernel.settle(
                        occurrence.pk, outcome="failed", error=outcome["error"], retryable=False, **kwargs
                    )
                return
            except LeaseLost as exc:
                outcome["status"] = "lease_lost"
                logger.warning("%s: result not recorded: %s", occurrence.pk, exc)
                return
            except DatabaseError:
                logger.exception("database error settling %s (try %d)", occurrence.pk, attempt)
                connections.close_all()
                time.sleep(min(5.0, 0.2 * 2 ** min(attempt, 5), max(0.0, deadline - time.monotonic())))
        outcome["status"] = "unsettled"

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
