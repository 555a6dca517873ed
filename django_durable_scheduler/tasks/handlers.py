"""The handler that runs tasks in ``runscheduler``: one per queue of every DurableBackend in
``settings.TASKS``, registered when the app is ready (no task framework is imported unless a
DurableBackend is configured). A backend with ``QUEUES = []`` takes any queue name, so the
worker registers it for the queues of the task jobs it finds stored (``stored_queue_kinds``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from ..db.dialect import alias_for
from ..exceptions import PermanentFailure
from ..handlers import registry
from ..models import Job
from .options import KIND_PREFIX, configured_queues, queue_kind

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
    """The queues of each DurableBackend in ``settings.TASKS``, by alias; an empty list for
    a backend that takes any queue name (``QUEUES = []``, as Django documents it)."""
    configured = getattr(settings, "TASKS", None) or {}
    found: dict[str, list[str]] = {}
    for alias, params in configured.items():
        if not isinstance(params, dict) or not _is_durable(params.get("BACKEND")):
            continue
        found[alias] = configured_queues(alias, params.get("QUEUES", ["default"]))
    return found


def any_queue() -> bool:
    """Whether a DurableBackend in ``settings.TASKS`` takes any queue name."""
    return any(not queues for queues in durable_queues().values())


def register_queue_handlers(queues: Iterable[str] = ()) -> list[str]:
    """Register the task handler for every configured queue, and for ``queues`` (of a backend
    that takes any); returns their kinds."""
    configured = {queue for names in durable_queues().values() for queue in names}
    kinds = sorted(queue_kind(queue) for queue in configured.union(queues))
    for kind in kinds:
        registry.handler(kind)(run_task)
    return kinds


def stored_queue_kinds(using: str | None) -> list[str]:
    """Register the task handler for the queue of every task job stored (for a backend that
    takes any queue name, whose queues are known only once a task is enqueued on them);
    returns their kinds. The job exists before its first task's occurrence does."""
    jobs = Job.objects.using(alias_for(using)).filter(kind__startswith=KIND_PREFIX)
    # order_by: not Meta.ordering's job_id, which would defeat distinct().
    kinds = list(jobs.order_by("kind").values_list("kind", flat=True).distinct())
    for kind in kinds:
        if registry.get_handler(kind) is None:  # a handler of the app's own keeps its kind
            registry.handler(kind)(run_task)
    return kinds
