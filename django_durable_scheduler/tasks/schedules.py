"""Cron (and interval, one-off) schedules for tasks: ``schedule(my_task, cron=...)``.

A schedule is a job declared in code (``declare_job``): ``runscheduler`` creates or updates
it when it starts (``scheduler_sync``), and its slots become occurrences of the task with
every guarantee a job's have (once per slot across any number of schedulers, the DST rules,
misfire and overlap policies). Each occurrence runs like an enqueued task, and its id is a
``TaskResult`` id.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..declared import DeclaredJob, declare_job
from ..exceptions import InvalidArgument
from ..identity import normalize_identifier
from .backend import DurableBackend
from .framework import Task, task_backends

if TYPE_CHECKING:
    from .backend import AnyTask

SCHEDULE_PREFIX = "task-schedule:"


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
    if not isinstance(task, Task):
        raise InvalidArgument("task", "must be a task (decorated with @task)")
    backend = task_backends[task.backend]
    if not isinstance(backend, DurableBackend):
        raise InvalidArgument("task", f"runs on backend {task.backend!r}, which is not a DurableBackend")
    if name is not None:
        name = normalize_identifier(name, "name")
    given = [key for key, value in (("cron", cron), ("every", every), ("at", at)) if value is not None]
    if len(given) != 1:
        raise InvalidArgument("trigger", "give exactly one of cron, every and at")
    trigger: dict[str, Any] = {given[0]: {"cron": cron, "every": every, "at": at}[given[0]]}
    if timezone is not None:
        trigger["timezone"] = timezone
    trigger.update(trigger_options)
    payload = {
        "task": task.module_path,
        "args": backend.json_value(list(args) if isinstance(args, tuple) else args, "args"),
        "kwargs": backend.json_value({} if kwargs is None else kwargs, "kwargs"),
        "backend": backend.alias,
    }
    if not isinstance(payload["args"], list):
        raise InvalidArgument("args", "must be a list or tuple")
    if not isinstance(payload["kwargs"], dict):
        raise InvalidArgument("kwargs", "must be a dict")
    wanted, authority = backend.job_settings(task)
    caller = sys._getframe(1).f_globals.get("__name__")  # its app owns the schedule
    return declare_job(
        f"{SCHEDULE_PREFIX}{backend.alias}:{task.module_path if name is None else name}",
        wanted["kind"],
        authority=authority,
        trigger=trigger,
        payload=payload,
        enabled=enabled,
        max_attempts=wanted["max_attempts"],
        retry_base_delay=timedelta(milliseconds=wanted["retry_base_delay_ms"]),
        retry_max_delay=timedelta(milliseconds=wanted["retry_max_delay_ms"]),
        module=caller if isinstance(caller, str) else None,
    )
