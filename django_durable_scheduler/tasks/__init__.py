"""A ``django.tasks`` backend: Django's task API, run durably by this app's ``runscheduler``.

    TASKS = {"default": {"BACKEND": "django_durable_scheduler.tasks.DurableBackend"}}

Names are exported lazily: this package is also the app's handler module (``tasks``), which
``runscheduler`` autodiscovers in every app, and importing it must not need a task framework.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "DurableBackend": "backend",
    "durable": "options",
    "TaskOptions": "options",
    "queue_kind": "options",
    "schedule": "schedules",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
