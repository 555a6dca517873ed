"""A task's occurrence in Django's words (import path, arguments, status, errors), read from
the occurrence alone: the admin shows it without importing a task framework."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..models import Occurrence, OccurrenceStatus
from .options import queue_of

# The occurrence status as django.tasks' TaskResultStatus names it.
TASK_STATUS = {
    OccurrenceStatus.QUEUED: "READY",
    OccurrenceStatus.RETRY_WAIT: "READY",
    OccurrenceStatus.RUNNING: "RUNNING",
    OccurrenceStatus.SUCCEEDED: "SUCCESSFUL",
    OccurrenceStatus.DEAD_LETTER: "FAILED",
    OccurrenceStatus.CANCELLED: "FAILED",
}
# The failed attempts' errors, in the occurrence's metadata (see failures.record_error).
ERRORS_KEY = "taskErrors"
# What a failure no task raised is reported as (an importable exception class).
SCHEDULER_ERROR_PATH = "django_durable_scheduler.exceptions.SchedulerError"


@dataclass(frozen=True)
class TaskView:
    path: str
    args: list[Any]
    kwargs: dict[str, Any]
    status: str
    # (exception class path, traceback) of each failed attempt, oldest first.
    errors: list[tuple[str, str]]


def task_view(occurrence: Occurrence, kind: str) -> TaskView | None:
    """The task an occurrence of a job of ``kind`` runs, or None when it is not a task's."""
    payload = occurrence.payload
    if queue_of(kind) is None or not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        return None
    args = payload.get("args")
    kwargs = payload.get("kwargs")
    return TaskView(
        path=payload["task"],
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        status=TASK_STATUS[OccurrenceStatus(occurrence.status)],
        errors=task_errors(occurrence),
    )


def task_errors(occurrence: Occurrence) -> list[tuple[str, str]]:
    """Each failed attempt's (exception class path, traceback); a failure that no task raised
    on the last attempt (a lease that expired, a cancel, a denial, a result that could not be
    stored) comes last, as a ``SchedulerError`` with its stored reason."""
    errors = recorded_errors(occurrence.metadata)
    last = occurrence.last_error if isinstance(occurrence.last_error, dict) else None
    failed = occurrence.status in (OccurrenceStatus.DEAD_LETTER, OccurrenceStatus.CANCELLED)
    attempts = {e.get("attempt") for e in _recorded(occurrence.metadata)}
    if failed and last is not None and (occurrence.attempt == 0 or occurrence.attempt not in attempts):
        reason = " ".join(str(last[key]) for key in ("type", "code") if last.get(key))
        message = str(last.get("message") or "failed")
        errors.append((SCHEDULER_ERROR_PATH, f"{reason}: {message}" if reason else message))
    return errors


def recorded_errors(metadata: Any) -> list[tuple[str, str]]:
    """The (exception class path, traceback) of each failed attempt recorded in an
    occurrence's ``metadata``, oldest first."""
    return [(str(e.get("exceptionClassPath")), str(e.get("traceback"))) for e in _recorded(metadata)]


def _recorded(metadata: Any) -> list[dict[str, Any]]:
    errors = metadata.get(ERRORS_KEY) if isinstance(metadata, dict) else None
    return [e for e in errors or [] if isinstance(e, dict)]
