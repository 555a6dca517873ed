"""The outcome of one run of a handler: one typed value from the worker's handler pool,
through its settle, to the kernel's settle (see docs/design.md, "Occurrence lifecycle")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

SUCCEEDED = "succeeded"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one run of an occurrence's handler, the one value that goes from the
    handler pool through the worker's settle to the kernel: ``status`` is ``succeeded``
    (with its ``result``) or ``failed`` (with its ``error``), and a failure is retried,
    at ``retry_at`` or its job's backoff, unless it is not ``retryable`` (dead-lettered, or
    cancelled when a cancel was asked for). ``exception`` is what the handler raised, for
    the log and the signals: it is never stored."""

    occurrence_id: str
    fence: int
    status: str
    result: Any = None
    error: Any = None
    retryable: bool = True
    retry_at: datetime | int | None = None
    exception: BaseException | None = None
