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
    _lease_lost: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def lease_lost(self) -> bool:
        """True once the worker failed to renew the lease: stop, the result will be refused."""
        return self._lease_lost.is_set()
