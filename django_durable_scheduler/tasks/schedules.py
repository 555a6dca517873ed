"""Cron (and interval, one-off) schedules for tasks: ``schedule(my_task, cron=...)``.

A schedule is a job declared in code (``declare_job``): ``runscheduler`` creates or updates
it when it starts (``scheduler_sync``), and its slots become occurrences of the task with
every guarantee a job's have (once per slot across any number of schedulers, the DST rules,
misfire and overlap policies). Each occurrence runs like an enqueued task, and its id is a
``TaskResult`` id. The admin makes the same jobs (``admin.TaskScheduleAdmin``) through
:func:`schedule_settings`.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from ..exceptions import InvalidArgument
from ..handlers.declared import DeclaredJob, declare_job
from ..models import TASK_SCHEDULE_PREFIX
from ..rules.validation import normalize_identifier
from .backend import DurableBackend
from .framework import Task, task_backends
from .options import KEY_FIELD, THROTTLE_FIELD, options_for, task_concurrency_key, task_throttle_key

if TYPE_CHECKING:
    from .framework import AnyTask


def schedule(
    task: AnyTask,
    *,
    cron: str | None = None,
    every: float | None = None,
    at: Any = None,
    timezone: str | None = None,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    enabled: bool = True,
    **trigger_options: Any,
) -> DeclaredJob:
    """Run ``task`` on a schedule: one of ``cron`` (with ``timezone``), ``every`` (seconds) or
    ``at``, and the trigger's other keys (``misfire``, ``catchup_window``, ``overlap``,
    ``start_at``, ``end_at``, ``anchor``) as keyword arguments; ``args`` and ``kwargs`` are
    given to each run. Call it at import time of a module runscheduler imports (an app's
    ``tasks.py``)::

        schedule(send_report, cron="0 9 * * 1-5", timezone="Europe/Berlin", kwargs={"to": "team"})

    The job is ``task-schedule:<backend alias>:<name>`` (``name``: default the task's module
    path; give one to schedule a task twice). Its runs take the task's queue, ``@durable``
    options and principal; priority does not apply to them.
    """
    backend = durable_backend_of(task)
    given = [key for key, value in (("cron", cron), ("every", every), ("at", at)) if value is not None]
    if len(given) != 1:
        raise InvalidArgument("trigger", "give exactly one of cron, every and at")
    trigger: dict[str, Any] = {given[0]: {"cron": cron, "every": every, "at": at}[given[0]]}
    if timezone is not None:
        trigger["timezone"] = timezone
    trigger.update(trigger_options)
    job_id = schedule_job_id(backend, task.module_path if name is None else name)
    caller = sys._getframe(1).f_globals.get("__name__")  # its app owns the schedule
    return declare_job(
        job_id,
        **schedule_settings(task, trigger, args, kwargs),
        enabled=enabled,
        module=caller if isinstance(caller, str) else None,
    )


def durable_backend_of(task: Any) -> DurableBackend:
    """The backend of ``task``, which must be a task on a :class:`DurableBackend`."""
    if not isinstance(task, Task):
        raise InvalidArgument("task", "must be a task (decorated with @task)")
    backend = task_backends[task.backend]
    if not isinstance(backend, DurableBackend):
        raise InvalidArgument("task", f"runs on backend {task.backend!r}, which is not a DurableBackend")
    return backend


def task_at(path: str) -> AnyTask:
    """The task at the dotted ``path`` (as the admin names one), checked as :func:`schedule` checks it."""
    path = normalize_identifier(path, "task")
    try:
        task = import_string(path)
    except ImportError as exc:
        raise InvalidArgument("task", f"nothing to import at {path!r} ({exc})") from None
    except Exception as exc:  # the module itself is broken: say so on the field, not as a 500
        raise InvalidArgument("task", f"importing {path!r} failed: {type(exc).__name__}: {exc}") from None
    durable_backend_of(task)
    found: AnyTask = task
    return found


def schedule_job_id(backend: DurableBackend, name: str) -> str:
    """The id of the job behind the schedule ``name`` of one of ``backend``'s tasks."""
    return normalize_identifier(
        f"{TASK_SCHEDULE_PREFIX}{backend.alias}:{normalize_identifier(name, 'name')}", "name"
    )


def schedule_settings(task: AnyTask, trigger: Any, args: Any = (), kwargs: Any = None) -> dict[str, Any]:
    """The job attributes (``create_job``'s arguments but the id) of a schedule of ``task``:
    its trigger, a payload naming the task with ``args`` and ``kwargs`` (JSON, checked now),
    and the queue's kind, options and principal of the task's own job."""
    backend = durable_backend_of(task)
    if isinstance(args, tuple):
        args = list(args)
    if not isinstance(args, list):
        raise InvalidArgument("args", "must be a list or tuple")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise InvalidArgument("kwargs", "must be a dict")
    payload = {
        "task": task.module_path,
        "args": backend.json_value(args, "args"),
        "kwargs": backend.json_value(kwargs, "kwargs"),
        "backend": backend.alias,
    }
    wanted, authority = backend.job_settings(task)
    options = options_for(task.module_path).merged_over(backend.defaults)
    key_spec = options.concurrency_key
    if key_spec is not None:  # the arguments are the same every run: so is the key
        payload[KEY_FIELD] = task_concurrency_key(key_spec, payload["args"], payload["kwargs"])
    throttle_key = task_throttle_key(options.throttle, payload["kwargs"])
    if throttle_key is not None:
        payload[THROTTLE_FIELD] = throttle_key
    timeout_ms = wanted["timeout_ms"]
    return {
        "kind": wanted["kind"],
        "authority": authority,
        "trigger": trigger,
        "payload": payload,
        "max_attempts": wanted["max_attempts"],
        "retry_base_delay": timedelta(milliseconds=wanted["retry_base_delay_ms"]),
        "retry_max_delay": timedelta(milliseconds=wanted["retry_max_delay_ms"]),
        "timeout": None if timeout_ms is None else timedelta(milliseconds=timeout_ms),
        "concurrency": wanted["concurrency"],
        "concurrency_key": wanted["concurrency_key"],
        "throttle": wanted["throttle"],
    }
