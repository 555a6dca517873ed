"""The worker's throttle on progress reports: a handler may call ``ctx.report_progress`` in a
tight loop, and each call would otherwise be a write. The first report is written at once
(an operator sees the run start moving), later ones at most once per :data:`INTERVAL`; the
latest report not yet written waits, and is written by the next report past the interval
or when the run ends (:meth:`ProgressThrottle.flush`), so the final progress is never lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..rules.progress import Progress

# Seconds between two writes of one run's progress, at least.
INTERVAL = 1.0


class ProgressThrottle:
    """Writes one run's progress reports through ``write`` (which returns what it stored),
    at most once per ``interval`` seconds of ``clock``; ``written`` is called after each
    write with what was stored and what had been stored before it (None: nothing yet)."""

    def __init__(
        self,
        write: Callable[[Progress], Progress],
        written: Callable[[Progress, Progress | None], None],
        *,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._written = written
        self._interval = interval
        self._clock = clock
        # A handler may report from threads of its own: one write at a time, in order.
        self._lock = threading.Lock()
        self._pending: Progress | None = None
        self._last: Progress | None = None
        self._last_at = -float("inf")

    @property
    def pending(self) -> Progress | None:
        """The latest report, if it is not written yet."""
        return self._pending

    def report(self, progress: Progress) -> bool:
        """Take a report: written now if the interval has passed since the last write (the
        first one always is), else kept as pending. Returns whether it was written."""
        with self._lock:
            self._pending = progress
            if self._clock() - self._last_at < self._interval:
                return False
            self._store()
            return True

    def flush(self) -> bool:
        """Write the pending report, if any (the run ends). Returns whether one was written."""
        with self._lock:
            if self._pending is None:
                return False
            self._store()
            return True

    def _store(self) -> None:
        progress, self._pending = self._pending, None
        assert progress is not None
        try:
            stored = self._write(progress)
        except BaseException:
            # Not retried now (the lease lost, the database down): pending again unless a
            # newer report came, for the next report past the interval or the flush.
            if self._pending is None:
                self._pending = progress
            self._last_at = self._clock()
            raise
        self._last_at = self._clock()
        before, self._last = self._last, stored
        self._written(stored, before)
