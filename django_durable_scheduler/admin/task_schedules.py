"""The schedules of ``django.tasks`` tasks in the admin: jobs shown in the task's terms,
registered only when a ``DurableBackend`` is configured."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.module_loading import import_string

from ..models import TASK_SCHEDULE_PREFIX, Job, TaskSchedule
from .forms import TaskScheduleForm
from .jobs import JobAdmin


class TaskScheduleAdmin(JobAdmin):
    """The schedules of ``django.tasks`` tasks, in the task's terms. Registered when a
    ``DurableBackend`` is configured (``uses_durable_tasks``). A schedule declared in code
    (``tasks.schedule``) is shown, not edited: its code would undo the edit at the next sync."""

    form = TaskScheduleForm  # type: ignore[assignment]
    list_display = [
        "name",
        "task_path",
        "trigger_words",
        "next_fire_at",
        "enabled",
        "last_outcome",
        "declared_in",
    ]
    list_filter = ["enabled", "declared_in"]
    search_fields = ["job_id", "payload__task"]

    _EDIT = ["task", "trigger", "args", "kwargs", "enabled", "loaded_revision"]
    _SHOWN = ["job_id", "task_path", "trigger", "payload", "enabled", "kind", "authority"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [(None, {"fields": ["name", *self._EDIT]})]
        recent = ("Recent occurrences", {"fields": ["recent_occurrences"]})
        if not self.has_change_permission(request, obj):
            return [(None, {"fields": self._SHOWN}), ("Schedule", {"fields": self._INFO}), recent]
        return [(None, {"fields": ["job_id", *self._EDIT]}), ("Schedule", {"fields": self._INFO}), recent]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else ["job_id", "task_path", *self._INFO, "recent_occurrences"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.declared_in:
            return False
        return super().has_change_permission(request, obj)

    @admin.display(description="name", ordering="job_id")
    def name(self, obj: Job) -> str:
        return obj.job_id.removeprefix(TASK_SCHEDULE_PREFIX)

    @admin.display(description="task")
    def task_path(self, obj: Job) -> str:
        payload = obj.payload if isinstance(obj.payload, dict) else {}
        return str(payload.get("task", "-"))


def uses_durable_tasks() -> bool:
    """Whether ``settings.TASKS`` has a ``DurableBackend`` (or a subclass); a project without
    ``TASKS`` imports no task framework."""
    configured = getattr(django_settings, "TASKS", None)
    if not isinstance(configured, dict) or not configured:
        return False
    try:
        from ..tasks.backend import DurableBackend
    except ImproperlyConfigured:  # TASKS without a framework: Django reports that itself
        return False
    for options in configured.values():
        try:
            backend = import_string(options["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if isinstance(backend, type) and issubclass(backend, DurableBackend):
            return True
    return False


if uses_durable_tasks():
    admin.site.register(TaskSchedule, TaskScheduleAdmin)
