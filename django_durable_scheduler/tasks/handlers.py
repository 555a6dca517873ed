"""The handler that runs tasks in ``runscheduler``: one per queue of every DurableBackend in
``settings.TASKS``, registered when the app is ready (no task framework is imported unless a
DurableBackend is configured)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .. import registry
from ..exceptions import InvalidArgument, PermanentFailure
from .options import queue_kind, validate_queue

BACKEND_PATH = "django_durable_scheduler.tasks.DurableBackend"


def run_task(ctx: Any) -> Any:
    """Run the task of a claimed occurrence through its backend."""
    from .backend import DurableBackend
    from .framework import task_backends

    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    alias = str(payload.get("backend"))
    try:
        backend = task_backends[alias]
    except Exception as exc:
        raise PermanentFailure(f"task backend {alias!r} is not configured here: {exc}") from exc
    if not isinstance(backend, DurableBackend):
        raise PermanentFailure(f"task backend {alias!r} is not a DurableBackend")
    return backend.run(ctx)


def _is_durable(path: Any) -> bool:
    if path == BACKEND_PATH:
        return True
    if not isinstance(path, str):
        return False
    try:
        backend = import_string(path)
    except ImportError:
        return False  # Django reports a backend it cannot import when it is used
    from .backend import DurableBackend

    return isinstance(backend, type) and issubclass(backend, DurableBackend)


def durable_queues() -> dict[str, list[str]]:
    """The queues of each DurableBackend in ``settings.TASKS``, by alias."""
    configured = getattr(settings, "TASKS", None) or {}
    found: dict[str, list[str]] = {}
    for alias, params in configured.items():
        if not isinstance(params, dict) or not _is_durable(params.get("BACKEND")):
            continue
        queues = params.get("QUEUES", ["default"])
        if isinstance(queues, str) or not queues:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES'] must list at least one queue name")
        try:
            found[alias] = [
                validate_queue(q, f"TASKS[{alias!r}]['QUEUES'][{i}]") for i, q in enumerate(queues)
            ]
        except InvalidArgument as exc:
            raise ImproperlyConfigured(str(exc)) from None
    return found


def register_queue_handlers() -> list[str]:
    """Register the task handler for every configured queue; returns their kinds."""
    kinds = sorted({queue_kind(queue) for queues in durable_queues().values() for queue in queues})
    for kind in kinds:
        registry.handler(kind)(run_task)
    return kinds
