"""The execution context handed to a handler."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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
    authority: dict[str, Any]
    owner: str = ""
    using: str | None = None
    # When the occurrence was written and when this attempt claimed it (None where the
    # context was not made by a claim), and its priority: what a handler would otherwise
    # read back from the database, as the django.tasks backend does for a TaskResult.
    enqueued_at: datetime | None = None
    claimed_at: datetime | None = None
    priority: int = 0
    _lease_lost: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def lease_lost(self) -> bool:
        """True once the lease is known lost: stop; the result would be refused."""
        return self._lease_lost.is_set()

    def mark_lease_lost(self) -> None:
        """Record that the lease is gone (the worker found it lost, timed the run out or gave
        it back): from now on ``lease_lost`` is True, and the handler should stop."""
        self._lease_lost.set()

    def record_metadata(self, value: Any) -> None:
        """Persist ``value`` (JSON, <= 64 KiB) on the occurrence now. Raises
        ``SchedulerError`` (``SCHEDULER_LEASE_LOST`` once the lease is gone)."""
        self._record(metadata=value)

    def record_receipt(self, value: Any) -> None:
        """Persist an execution receipt (JSON, <= 64 KiB) now, e.g. the id of an external
        side effect, so a retry can see what the last attempt already did."""
        self._record(receipt=value)

    def _record(self, **values: Any) -> None:
        from . import kernel
        from .exceptions import LeaseLost

        try:
            kernel.record_execution(
                self.occurrence_id, owner=self.owner, fence=self.fence, using=self.using, **values
            )
        except LeaseLost:
            self.mark_lease_lost()
            raise
