"""A task's failed attempt on the worker: its error kept in the occurrence's metadata (where
``display.recorded_errors`` reads it) and ``task_finished`` sent for it."""

from __future__ import annotations

import contextlib
import traceback
from typing import TYPE_CHECKING, Any

from .. import conf
from ..exceptions import SchedulerError
from ..models import Occurrence
from .display import ERRORS_KEY
from .framework import TaskError, TaskResultStatus, set_field, task_finished

if TYPE_CHECKING:
    from .framework import AnyResult

# The failed attempts' errors are kept in the occurrence's metadata (the task handler's
# record), the newest MAX_ERRORS, each traceback cut to MAX_TRACEBACK: within 64 KiB.
MAX_ERRORS = 8
MAX_TRACEBACK = 6 * 1024


def failed(sender: type, using: str, ctx: Any, result: AnyResult, exc: BaseException, *, final: bool) -> None:
    """Record a failed attempt and send ``task_finished`` from ``sender`` (from the except
    block, as Django does, so that its log receiver sees the exception): FAILED when no
    attempt is left, else READY (it will run again)."""
    error = record_error(using, ctx, exc)
    set_field(result, "errors", [*result.errors, error])
    set_field(result, "status", TaskResultStatus.FAILED if final else TaskResultStatus.READY)
    if final:
        set_field(result, "finished_at", conf.now())
    task_finished.send(sender, task_result=result)


def record_error(using: str, ctx: Any, exc: BaseException) -> TaskError:
    """Keep this attempt's error in the occurrence's metadata (now: a later attempt, or a
    crash after this, must not lose it) and return it."""
    text = "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:]
    error = TaskError(exception_class_path=_path(type(exc)), traceback=text)
    stored = Occurrence.objects.using(using).filter(pk=ctx.occurrence_id).values_list("metadata", flat=True)
    metadata = next(iter(stored), None)
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    recorded = list(metadata.get(ERRORS_KEY) or [])
    recorded.append(
        {"attempt": ctx.attempt, "exceptionClassPath": error.exception_class_path, "traceback": text}
    )
    metadata[ERRORS_KEY] = recorded[-MAX_ERRORS:]
    with contextlib.suppress(SchedulerError):  # a lost lease: the outcome will not be recorded either
        ctx.record_metadata(metadata)
    return error


def _path(value: type) -> str:
    return f"{value.__module__}.{value.__qualname__}"
