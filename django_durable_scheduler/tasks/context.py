"""What a ``django.tasks`` task with ``takes_context=True`` gets: Django's ``TaskContext``
(its ``task_result`` and ``attempt``), and the scheduler's progress report on top, so a task
can show an operator how far it has come as any handler can (``ctx.report_progress``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .framework import TaskContext

if TYPE_CHECKING:  # generic in django-stubs only
    _TaskContext = TaskContext[Any, Any]
else:
    _TaskContext = TaskContext


# Frozen as Django's own dataclass is at run time (django-stubs declares a plain class).
@dataclass(frozen=True, kw_only=True)
class DurableTaskContext(_TaskContext):  # type: ignore[misc]
    """Django's ``TaskContext`` of a task run by ``runscheduler``, with
    :meth:`report_progress`. ``execution``: the worker's context of the run."""

    execution: Any

    def report_progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """The handler context's ``report_progress``: ``done`` of ``total`` units (None: not
        known), with a short ``note``; throttled to about one write a second, the last one
        written when the task returns. Bad input raises ``InvalidArgument`` naming the field."""
        self.execution.report_progress(done, total, note)
