"""``DurableBackend``: Django's task API on this app's kernel.

A task is run by a job of this app: one job per (backend alias, queue, task path), created
(or brought up to date with the task's options) by the first enqueue that needs it. Its
kind is the queue's (``django.tasks:<queue>``), so ``runscheduler --queues`` selects work by
kind and a principal's policy grants queues. Each ``enqueue`` is one occurrence of that
job, written through ``kernel.enqueue`` in the caller's transaction; its id is the
``TaskResult``'s id, and everything a ``TaskResult`` shows is read back from it and from its
claim events.

The class is the task API's surface; its parts live beside it: ``jobs`` (a task's job, made
or brought up to date), ``enqueuing`` (the occurrence an enqueue writes), ``results`` (a
``TaskResult`` read back) and ``failures`` (a failed attempt's record).
"""

from __future__ import annotations

from collections.abc import Sequence
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from .. import conf
from ..db.dialect import alias_for
from ..exceptions import InvalidArgument, PermanentFailure
from ..rules.identity import normalize_json
from . import enqueuing, failures, jobs, results
from .context import DurableTaskContext
from .framework import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    InvalidTask,
    TaskResultStatus,
    set_field,
    task_enqueued,
    task_finished,
    task_started,
)
from .framework import normalize_json as django_normalize_json
from .options import configured_queues, parse_options, validate_queue

if TYPE_CHECKING:
    from .framework import AnyResult, AnyTask


class DurableBackend(BaseTaskBackend):
    """Stores tasks as occurrences of this app, run by ``manage.py runscheduler``.

    ``OPTIONS``: ``max_attempts`` (default 3), ``retry_base_delay`` and ``retry_max_delay``
    (seconds; default the app's settings), ``timeout`` (seconds; default the app's
    ``HANDLER_TIMEOUT``), ``principal`` (``{"type", "id"}``; default the app's default
    principal), ``concurrency`` and ``concurrency_key`` (how many runs of a task at once, per
    key; default no cap) and ``throttle`` (how fast they may start, ``{"limit": 100, "period":
    5, "burst": 20, "key": "{account}"}``, the key naming keyword arguments; work over the rate
    waits in the queue; default none) for every task of this backend, ``@durable`` overriding
    them per task;
    ``database``: the database alias (default: where the routers write this app's models).
    """

    supports_defer = True
    """``run_after`` is the occurrence's due time."""

    supports_async_task = True
    """An ``async def`` task runs on the worker in its own event loop."""

    supports_get_result = True
    """Results are read back from the database, from any process."""

    supports_priority = True
    """Higher first among one principal's due tasks; principals still take turns."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        setting = f"TASKS[{alias!r}]"
        configured_queues(alias, params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME]))  # []: any name
        options = dict(self.options or {})
        self.database: str | None = options.pop("database", None)
        if self.database is not None and not isinstance(self.database, str):
            raise ImproperlyConfigured(f"{setting}['OPTIONS']['database'] must be a database alias")
        try:
            self.defaults = parse_options(options, f"{setting}['OPTIONS']")
        except InvalidArgument as exc:
            raise ImproperlyConfigured(str(exc)) from None

    def using_alias(self) -> str:
        """``OPTIONS["database"]``, else the database the routers write this app's models to
        (asked on each use: routers may depend on settings)."""
        return alias_for(self.database)

    # ------------------------------------------------------------------ enqueue

    def validate_task(self, task: AnyTask) -> None:
        """Django's checks; with ``QUEUES = []`` (any queue name, as Django documents it),
        also that the queue's name makes a handler kind (``django.tasks:<queue>``)."""
        super().validate_task(task)
        if not self.queues:
            try:
                validate_queue(task.queue_name, "queue_name")
            except InvalidArgument as exc:
                raise InvalidTask(str(exc)) from None

    def enqueue(self, task: AnyTask, args: Any, kwargs: Any) -> AnyResult:
        """Write the task's occurrence in the caller's transaction and return its result."""
        self.validate_task(task)
        args = self.json_value(args, "args")
        kwargs = self.json_value(kwargs, "kwargs")
        occurrence, found = enqueuing.enqueue(
            task, args, kwargs, backend_alias=self.alias, defaults=self.defaults, using=self.using_alias()
        )
        if found:
            # The waiting (or running) task of the same key: its arguments, not this call's,
            # unless a debounce just gave it these; no task was enqueued.
            return results.found_result(self.alias, task, occurrence)
        result = results.new_result(self.alias, task, occurrence.pk, TaskResultStatus.READY, args, kwargs)
        set_field(result, "enqueued_at", occurrence.created_at)
        task_enqueued.send(type(self), task_result=result)
        return result

    @staticmethod
    def json_value(value: Any, field: str) -> Any:
        """``value`` as the framework normalizes it (its TypeError/ValueError for what is not
        JSON), then refused with a ValueError unless it round-trips through stored JSON
        (non-string keys, NaN, NUL, nesting over 64 levels, over 1 MiB)."""
        value = django_normalize_json(value)
        try:
            normalize_json(value, field)
        except InvalidArgument as exc:
            raise ValueError(f"Unsupported value in task {field}: {exc}") from None
        return value

    def job_settings(self, task: AnyTask) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """What the job of ``task`` holds (``jobs.job_settings``): its ``@durable`` options
        over this backend's ``OPTIONS`` over the app's defaults."""
        return jobs.job_settings(task, self.defaults)

    # ------------------------------------------------------------------ results

    def get_result(self, result_id: str) -> AnyResult:
        """The task's current state, read from its occurrence and its claim events."""
        return results.read_result(self.alias, self.using_alias(), result_id)

    # ------------------------------------------------------------------ the worker side

    def run(self, ctx: Any) -> Any:
        """Run the task of the claimed occurrence ``ctx`` (called by the worker's handler
        thread), sending ``task_started`` and ``task_finished``. Returns the return value;
        a failure is raised on, for the worker to retry or dead-letter as for any handler."""
        result = results.running_result(self.alias, self.using_alias(), ctx)
        task = result.task
        task_started.send(type(self), task_result=result)
        try:
            args: Sequence[Any] = result.args
            if task.takes_context:
                args = (DurableTaskContext(task_result=result, execution=ctx), *args)
            if iscoroutinefunction(task.func):  # on a loop of its own, which a cancel reaches
                value = ctx.run_coroutine(task.func(*args, **result.kwargs))
            else:
                value = task.call(*args, **result.kwargs)
        except BaseException as exc:  # sys.exit() too: the worker fails the attempt, as Django's backends do
            final = isinstance(exc, PermanentFailure) or ctx.attempt >= ctx.max_attempts
            failures.failed(type(self), self.using_alias(), ctx, result, exc, final=final)
            raise
        try:
            value = self.json_value(value, "return value")
        except (TypeError, ValueError) as exc:
            failures.failed(type(self), self.using_alias(), ctx, result, exc, final=True)
            raise PermanentFailure(f"the task's return value is not JSON: {exc}") from exc
        set_field(result, "status", TaskResultStatus.SUCCESSFUL)
        set_field(result, "finished_at", conf.now())
        set_field(result, "_return_value", value)
        task_finished.send(type(self), task_result=result)
        return value
