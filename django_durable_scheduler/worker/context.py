"""The execution context handed to a handler."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..exceptions import LeaseLost, OccurrenceCancelled
from ..rules.authority import Envelope
from ..rules.causes import BatchSummary, Cause, Predecessor
from ..rules.progress import Progress, normalize_progress
from .progress import ProgressThrottle

# Told of each progress report written: the context, what was stored, what was before it.
ProgressSink = Callable[["ExecutionContext", Progress, Progress | None], None]


@dataclass
class ExecutionContext:
    occurrence_id: str
    job_id: str
    kind: str
    attempt: int
    max_attempts: int
    fence: int
    scheduled_for: datetime
    payload: Any
    authority: Envelope
    owner: str = ""
    using: str | None = None
    # When the occurrence was written and when this attempt claimed it (None where the
    # context was not made by a claim), and its priority: what a handler would otherwise
    # read back from the database, as the django.tasks backend does for a TaskResult.
    enqueued_at: datetime | None = None
    claimed_at: datetime | None = None
    priority: int = 0
    # Why the occurrence exists when a chain or a batch made it (``Occurrence.cause``).
    cause: Cause | None = None
    # Flags, not Events: nobody waits on them, and every run would pay for an Event's lock
    # and condition. _lease_lost is set once, by any thread; _cancelled under _async_lock.
    _lease_lost: bool = field(default=False, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    # The event loop and task of an async handler while it runs, for a cancel to reach it.
    _async: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = field(default=None, repr=False)
    _async_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Told of each progress report written (the worker's signal and metric), if set; and the
    # throttle of the reports, made by the first one (a run that reports none has none).
    progress_sink: ProgressSink | None = field(default=None, repr=False)
    progress_throttle: ProgressThrottle | None = field(default=None, repr=False)

    @property
    def predecessor(self) -> Predecessor | None:
        """For a follow-up (``then`` / ``on_dead_letter``): the occurrence it follows, a
        :class:`Predecessor` ``{"occurrence_id", "job_id", "status", "result"}``
        (``"error"`` instead of ``"result"`` after a dead letter); None for any other
        occurrence."""
        cause = self.cause
        return cause if cause is not None and "occurrence_id" in cause else None

    @property
    def batch(self) -> BatchSummary | None:
        """For a batch's callback: a :class:`BatchSummary` ``{"batch_id", "description",
        "size", "counts", "cancelled"}``, ``counts`` being its members by final status
        (``succeeded``, ``dead_letter``, ``cancelled``); the members' ids:
        ``scheduler.batch_members``. None for any other occurrence."""
        cause = self.cause
        return cause if cause is not None and "batch_id" in cause else None

    @property
    def cancel_requested(self) -> bool:
        """True once a cancel was requested for this attempt (the worker learns it at its
        next lease renewal): stop, and let :meth:`raise_if_cancelled` end the run."""
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        """Raise ``OccurrenceCancelled`` if a cancel was requested; the worker then records
        the occurrence ``cancelled``, without a retry."""
        if self._cancelled:
            raise OccurrenceCancelled(
                f"occurrence {self.occurrence_id!r} was asked to stop",
                {"occurrence_id": self.occurrence_id, "fence": self.fence},
            )

    def mark_cancel_requested(self) -> None:
        """Record that a cancel was requested; an async handler is cancelled at its next
        ``await`` (its task is cancelled on its own loop, from whatever thread calls this)."""
        with self._async_lock:
            self._cancelled = True
            running = self._async
        if running is not None:
            loop, task = running
            with contextlib.suppress(RuntimeError):  # a closed loop: the handler is done
                loop.call_soon_threadsafe(task.cancel)

    def run_coroutine(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run an async handler to its end on an event loop of its own, in this thread. A
        cancel request cancels it at its next ``await``, raising ``OccurrenceCancelled``."""
        loop = asyncio.new_event_loop()
        try:
            task = loop.create_task(coroutine)
            with self._async_lock:
                self._async = (loop, task)
                requested = self._cancelled
            if requested:
                task.cancel()
            try:
                return loop.run_until_complete(task)
            except asyncio.CancelledError as exc:
                self.raise_if_cancelled()
                # Not ours: a failure like any other, not a BaseException that ends the thread.
                raise RuntimeError("the handler's task was cancelled") from exc
        finally:
            with self._async_lock:
                self._async = None
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    @property
    def lease_lost(self) -> bool:
        """True once the lease is known lost: stop; the result would be refused."""
        return self._lease_lost

    def mark_lease_lost(self) -> None:
        """Record that the lease is gone (the worker found it lost, timed the run out or gave
        it back): from now on ``lease_lost`` is True, and the handler should stop."""
        self._lease_lost = True

    def record_metadata(self, value: Any) -> None:
        """Persist ``value`` (JSON, <= 64 KiB) on the occurrence now. Raises
        ``SchedulerError`` (``SCHEDULER_LEASE_LOST`` once the lease is gone)."""
        self._record(metadata=value)

    def record_receipt(self, value: Any) -> None:
        """Persist an execution receipt (JSON, <= 64 KiB) now, e.g. the id of an external
        side effect, so a retry can see what the last attempt already did."""
        self._record(receipt=value)

    def report_progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the run has come: ``done`` of ``total`` (None: not known) units of
        work, with a short ``note`` (one line, <= 200 characters), shown on the occurrence in
        the admin. Call it as often as you like: the first report is written at once, later
        ones at most about once a second, and the last one when the handler returns. Bad
        input raises ``InvalidArgument`` naming the field (``done``, ``total``, ``note``),
        nothing written; ``SCHEDULER_LEASE_LOST`` once the lease is gone."""
        self._report_progress(normalize_progress(done, total, note))

    def _report_progress(self, progress: Progress) -> None:
        throttle = self.progress_throttle
        if throttle is None:
            with self._async_lock:  # a handler may report from threads of its own
                if self.progress_throttle is None:
                    self.progress_throttle = ProgressThrottle(self._write_progress, self._progress_written)
                throttle = self.progress_throttle
        throttle.report(progress)

    def flush_progress(self) -> None:
        """Write the last progress report if the throttle held it back (the worker calls
        this when the handler returns). ``SCHEDULER_LEASE_LOST`` once the lease is gone."""
        if self.progress_throttle is not None:
            self.progress_throttle.flush()

    def _write_progress(self, progress: Progress) -> Progress:
        from .. import kernel

        try:
            return kernel.record_progress(
                self.occurrence_id,
                owner=self.owner,
                fence=self.fence,
                done=progress.done,
                total=progress.total,
                note=progress.note,
                using=self.using,
            )
        except LeaseLost:
            self.mark_lease_lost()
            raise

    def _progress_written(self, stored: Progress, before: Progress | None) -> None:
        if self.progress_sink is not None:
            self.progress_sink(self, stored, before)

    def _record(self, **values: Any) -> None:
        from .. import kernel

        try:
            kernel.record_execution(
                self.occurrence_id, owner=self.owner, fence=self.fence, using=self.using, **values
            )
        except LeaseLost:
            self.mark_lease_lost()
            raise
