"""Which task framework is present: ``django.tasks`` (Django 6) or the ``django-tasks``
backport (Django 5.2). Everything else in this package imports the framework from here.

The two spell a few names differently (``InvalidTask`` / ``InvalidTaskError``); this module
gives them one name each, so the backend has one code path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:  # django-stubs types django.tasks; the backport has the same shapes
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
    # Generic in the stubs (and the backport), not in Django 6.
    AnyTask = Task[Any, Any]
    AnyResult = TaskResult[Any, Any]
else:
    try:
        from django.tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            Task,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task,
            task_backends,
        )
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        FRAMEWORK = "django.tasks"
    except ImportError:
        try:
            from django_tasks import (
                DEFAULT_TASK_QUEUE_NAME,
                TaskContext,
                TaskResult,
                TaskResultStatus,
                task,
                task_backends,
            )
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskError
            from django_tasks.exceptions import (
                InvalidTaskError as InvalidTask,
            )
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import (
                task_enqueued,
                task_finished,
                task_started,
            )
            from django_tasks.utils import normalize_json

            FRAMEWORK = "django_tasks"
        except ImportError:
            raise ImproperlyConfigured(
                "django_durable_scheduler.tasks needs a task framework: Django 6 (django.tasks) or, "
                "on Django 5.2, the django-tasks backport: pip install 'django-durable-scheduler[tasks]'"
            ) from None


__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def set_field(result: Any, name: str, value: Any) -> None:
    """Set a field of a frozen ``TaskResult`` (as the framework's own backends do)."""
    object.__setattr__(result, name, value)
