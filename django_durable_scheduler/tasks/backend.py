"""``DurableBackend``: Django's task API on this app's kernel.

A task is run by a job of this app: one job per (backend alias, queue, task path), created
(or brought up to date with the task's options) by the first enqueue that needs it. Its
kind is the queue's (``django.tasks:<queue>``), so ``runscheduler --queues`` selects work by
kind and a principal's policy grants queues. Each ``enqueue`` is one occurrence of that
job, written through ``kernel.enqueue`` in the caller's transaction; its id is the
``TaskResult``'s id, and everything a ``TaskResult`` shows is read back from it and from its
claim events.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
import uuid
from datetime import timedelta
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils.module_loading import import_string

from .. import conf, kernel
from ..db.dialect import alias_for
from ..exceptions import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermanentFailure,
    RevisionConflict,
    SchedulerError,
)
from ..models import Event, Job, Occurrence, OccurrenceStatus
from ..rules.events import OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED
from ..rules.identity import canonical_json, normalize_json
from ..rules.validation import from_ms, normalize_identifier, to_ms
from .display import ERRORS_KEY, TASK_STATUS, recorded_errors, task_errors
from .framework import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    set_field,
    task_enqueued,
    task_finished,
    task_started,
)
from .framework import normalize_json as django_normalize_json
from .options import options_for, parse_options, queue_kind, queue_of, unique_for, validate_queue

STATUS = {status: TaskResultStatus(word) for status, word in TASK_STATUS.items()}
# The failed attempts' errors are kept in the occurrence's metadata (the task handler's
# record), the newest MAX_ERRORS, each traceback cut to MAX_TRACEBACK: within 64 KiB.
MAX_ERRORS = 8
MAX_TRACEBACK = 6 * 1024

if TYPE_CHECKING:  # generic in the stubs (and the backport), not in Django 6
    AnyTask = Task[Any, Any]
    AnyResult = TaskResult[Any, Any]
# (database alias, job id) -> the job settings last confirmed stored (after a commit), so
# that an enqueue reads the job row only when this process has not seen it yet.
_confirmed: dict[tuple[str, str], tuple[Any, ...]] = {}
_confirmed_lock = threading.Lock()


def _path(value: type) -> str:
    return f"{value.__module__}.{value.__qualname__}"


class DurableBackend(BaseTaskBackend):
    """Stores tasks as occurrences of this app, run by ``manage.py runscheduler``.

    ``OPTIONS``: ``max_attempts`` (default 3), ``retry_base_delay`` and ``retry_max_delay``
    (seconds; default the app's settings), ``timeout`` (seconds; default the app's
    ``HANDLER_TIMEOUT``), ``principal`` (``{"type", "id"}``; default the app's default
    principal) for every task of this backend, ``@durable`` overriding them per task;
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
        queues = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
        if isinstance(queues, str) or not queues:
            raise ImproperlyConfigured(f"{setting}['QUEUES'] must list at least one queue name")
        try:
            for index, name in enumerate(queues):
                validate_queue(name, f"{setting}['QUEUES'][{index}]")
        except InvalidArgument as exc:
            raise ImproperlyConfigured(str(exc)) from None
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

    def enqueue(self, task: AnyTask, args: Any, kwargs: Any) -> AnyResult:
        """Write the task's occurrence in the caller's transaction and return its result."""
        self.validate_task(task)
        args = self.json_value(args, "args")
        kwargs = self.json_value(kwargs, "kwargs")
        payload: dict[str, Any] = {
            "task": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
        }
        if task.run_after is not None:
            payload["runAfter"] = to_ms(task.run_after, "run_after")
        unique = self._unique_args(task, args, kwargs)
        try:
            occurrence, found = self._enqueue(task, payload, unique)
        except NotFound:
            # The job this process confirmed is gone (deleted in the admin, a flushed
            # database): make it again, once.
            with _confirmed_lock:
                _confirmed.pop((self.using_alias(), self._job_id(task)), None)
            occurrence, found = self._enqueue(task, payload, unique)
        if found:
            # The waiting (or running) task of the same key: its arguments, not this call's,
            # unless a debounce just gave it these; no task was enqueued.
            return self._found_result(task, occurrence)
        result = self._new_result(task, occurrence.pk, TaskResultStatus.READY, args, kwargs)
        set_field(result, "enqueued_at", occurrence.created_at)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _enqueue(
        self, task: AnyTask, payload: dict[str, Any], unique: dict[str, Any]
    ) -> tuple[Occurrence, bool]:
        job_id = self._ensure_job(task)
        return kernel.enqueue(
            job_id,
            scheduled_for=conf.now(),
            trigger_key=f"task:{uuid.uuid4().hex}",
            available_at=None if "debounce" in unique else task.run_after,
            payload=payload,
            priority=task.priority,
            using=self.using_alias(),
            **unique,
        )

    @staticmethod
    def _unique_args(task: AnyTask, args: Any, kwargs: Any) -> dict[str, Any]:
        """The task's ``@durable`` unique key and debounce as ``kernel.enqueue``'s arguments
        for this call (none: the call has no key). A debounced task's ``run_after`` is its
        debounced start."""
        unique = unique_for(task.module_path)
        key = None if unique is None else unique.key_of(args, kwargs)
        if unique is None or key is None:
            return {}
        # Checked now, before the task's job is made or brought up to date: a bad key writes nothing.
        key = normalize_identifier(key, "unique_key")
        if unique.debounce_ms is None:
            return {"unique_key": key, "unique_while": unique.unique_while}
        delay = timedelta(milliseconds=unique.debounce_ms)
        if task.run_after is not None:
            delay = max(task.run_after - conf.now(), timedelta(0))
        return {"unique_key": key, "debounce": delay}

    def _found_result(self, task: AnyTask, occurrence: Occurrence) -> AnyResult:
        payload = occurrence.payload if isinstance(occurrence.payload, dict) else {}
        status = STATUS[OccurrenceStatus(occurrence.status)]
        result = self._new_result(
            task, occurrence.pk, status, payload.get("args", []), payload.get("kwargs", {})
        )
        set_field(result, "enqueued_at", occurrence.created_at)
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

    def _job_id(self, task: AnyTask) -> str:
        job_id = f"task:{self.alias}:{task.queue_name}:{task.module_path}"
        if len(job_id) > 256:
            raise InvalidTask(f"task path {task.module_path!r} is too long for this backend")
        return job_id

    def job_settings(self, task: AnyTask) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """What the job of ``task`` holds, from its ``@durable`` options over this backend's
        ``OPTIONS`` over the app's defaults: ``({"kind", "max_attempts",
        "retry_base_delay_ms", "retry_max_delay_ms"}, authority or None for the default
        principal)``."""
        opts = options_for(task.module_path).merged_over(self.defaults)
        kind = queue_kind(task.queue_name)
        wanted: dict[str, Any] = {
            "kind": kind,
            "max_attempts": opts.max_attempts if opts.max_attempts is not None else 3,
            "retry_base_delay_ms": (
                opts.retry_base_delay_ms
                if opts.retry_base_delay_ms is not None
                else round(conf.settings.RETRY_BASE_DELAY * 1000)
            ),
            "retry_max_delay_ms": (
                opts.retry_max_delay_ms
                if opts.retry_max_delay_ms is not None
                else round(conf.settings.RETRY_MAX_DELAY * 1000)
            ),
            "timeout_ms": opts.timeout_ms,
        }
        authority = None
        if opts.principal is not None:
            authority = {"principal": opts.principal, "requestedCapabilities": [kind]}
        return wanted, authority

    def _ensure_job(self, task: AnyTask) -> str:
        """The id of the task's job, created or brought up to date with its options first."""
        job_id = self._job_id(task)
        wanted, authority = self.job_settings(task)
        signature = (wanted, authority)  # compared as values: no JSON encoding on every enqueue
        alias = self.using_alias()
        key = (alias, job_id)
        if _confirmed.get(key) == signature:
            return job_id
        with transaction.atomic(using=alias):
            self._sync_job(job_id, wanted, authority, alias)

        def confirm() -> None:
            with _confirmed_lock:
                _confirmed[key] = signature

        # Only once it is committed: a job made in a transaction that rolls back is gone.
        transaction.on_commit(confirm, using=alias)
        return job_id

    def _sync_job(
        self, job_id: str, wanted: dict[str, Any], authority: dict[str, Any] | None, alias: str
    ) -> None:
        for _ in range(3):  # a racing enqueue may create or update the job meanwhile
            try:
                job = kernel.get_job(job_id, using=alias)
            except NotFound:
                try:
                    with transaction.atomic(using=alias):
                        kernel.create_job(
                            job_id,
                            wanted["kind"],
                            authority=authority,
                            max_attempts=wanted["max_attempts"],
                            retry_base_delay=timedelta(milliseconds=wanted["retry_base_delay_ms"]),
                            retry_max_delay=timedelta(milliseconds=wanted["retry_max_delay_ms"]),
                            timeout=_timeout(wanted["timeout_ms"]),
                            using=alias,
                        )
                    return
                except Conflict:
                    continue
            changes = self._changes(job, wanted, authority)
            if not changes:
                return
            try:
                with transaction.atomic(using=alias):
                    kernel.update_job(job_id, expected_revision=job.revision, using=alias, **changes)
                return
            except RevisionConflict:
                continue
        raise RevisionConflict(
            f"job {job_id!r} kept changing while its task was enqueued", {"job_id": job_id}
        )

    @staticmethod
    def _changes(job: Job, wanted: dict[str, Any], authority: dict[str, Any] | None) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        if job.kind != wanted["kind"]:
            changes["kind"] = wanted["kind"]
        if job.max_attempts != wanted["max_attempts"]:
            changes["max_attempts"] = wanted["max_attempts"]
        if (job.retry_base_delay_ms, job.retry_max_delay_ms) != (
            wanted["retry_base_delay_ms"],
            wanted["retry_max_delay_ms"],
        ):
            changes["retry_base_delay"] = timedelta(milliseconds=wanted["retry_base_delay_ms"])
            changes["retry_max_delay"] = timedelta(milliseconds=wanted["retry_max_delay_ms"])
        if job.timeout_ms != wanted["timeout_ms"]:
            changes["timeout"] = _timeout(wanted["timeout_ms"])
        stored = {key: job.authority.get(key) for key in ("principal", "requestedCapabilities")}
        if authority is None:
            default = {
                "principal": conf.settings.DEFAULT_PRINCIPAL,
                "requestedCapabilities": [wanted["kind"]],
            }
            if canonical_json(stored) != canonical_json(default):
                changes["authority"] = None
        elif canonical_json(stored) != canonical_json(authority):
            changes["authority"] = authority
        return changes

    # ------------------------------------------------------------------ results

    def get_result(self, result_id: str) -> AnyResult:
        """The task's current state, read from its occurrence and its claim events."""
        if not isinstance(result_id, str) or not result_id.startswith("occ_") or len(result_id) > 68:
            raise TaskResultDoesNotExist(result_id)
        occurrence = (
            Occurrence.objects.using(self.using_alias()).select_related("job").filter(pk=result_id).first()
        )
        payload = occurrence.payload if occurrence is not None else None
        if (
            occurrence is None
            or queue_of(occurrence.job.kind) is None
            or not isinstance(payload, dict)
            or payload.get("backend") != self.alias
            or not isinstance(payload.get("task"), str)
        ):
            raise TaskResultDoesNotExist(result_id)
        claims = list(
            Event.objects.using(self.using_alias())
            .filter(occurrence_id=result_id, event_type__in=(OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED))
            .order_by("event_id")
            .values_list("occurred_at", "owner_id")
        )
        status = STATUS[OccurrenceStatus(occurrence.status)]
        result = self._result(
            result_id,
            payload,
            occurrence.job.kind,
            occurrence.priority,
            status,
            occurrence.created_at,
            claims,
            task_errors(occurrence),
        )
        set_field(result, "finished_at", occurrence.settled_at)
        if status == TaskResultStatus.SUCCESSFUL:
            set_field(result, "_return_value", occurrence.result)
        return result

    def _result(
        self,
        result_id: str,
        payload: dict[str, Any],
        kind: str,
        priority: int,
        status: Any,
        enqueued_at: Any,
        claims: list[tuple[Any, str | None]],
        errors: list[tuple[str, str]],
    ) -> AnyResult:
        """The result of an occurrence from its columns and its claims' (time, owner)."""
        result = self._new_result(
            self._task_of(payload, result_id, kind, priority),
            result_id,
            status,
            payload.get("args", []),
            payload.get("kwargs", {}),
        )
        set_field(result, "enqueued_at", enqueued_at)
        set_field(result, "started_at", claims[0][0] if claims else None)
        set_field(result, "last_attempted_at", claims[-1][0] if claims else None)
        set_field(result, "worker_ids", [owner or "" for _, owner in claims])
        set_field(result, "errors", [TaskError(exception_class_path=c, traceback=t) for c, t in errors])
        return result

    def _new_result(self, task: AnyTask, result_id: str, status: Any, args: Any, kwargs: Any) -> AnyResult:
        return TaskResult(
            task=task,
            id=result_id,
            status=status,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def _task_of(self, payload: dict[str, Any], result_id: str, kind: str, priority: int) -> AnyTask:
        """The enqueued task: the module's task with its occurrence's queue (from the job's
        ``kind``), priority and run_after (what ``.using()`` may have changed)."""
        path = payload["task"]
        try:
            found = import_string(path)
        except ImportError as exc:
            raise TaskResultDoesNotExist(
                f"task {path!r} of result {result_id!r} cannot be imported: {exc}"
            ) from exc
        if not isinstance(found, Task):
            raise TaskResultDoesNotExist(f"{path!r} of result {result_id!r} is not a task")
        run_after = payload.get("runAfter")
        return found.using(
            priority=priority,
            queue_name=queue_of(kind),
            run_after=None if run_after is None else from_ms(run_after),
            backend=self.alias,
        )

    # ------------------------------------------------------------------ the worker side

    def run(self, ctx: Any) -> Any:
        """Run the task of the claimed occurrence ``ctx`` (called by the worker's handler
        thread), sending ``task_started`` and ``task_finished``. Returns the return value;
        a failure is raised on, for the worker to retry or dead-letter as for any handler."""
        result = self._running_result(ctx)
        task = result.task
        task_started.send(type(self), task_result=result)
        try:
            args = (TaskContext(task_result=result), *result.args) if task.takes_context else result.args
            if iscoroutinefunction(task.func):  # on a loop of its own, which a cancel reaches
                value = ctx.run_coroutine(task.func(*args, **result.kwargs))
            else:
                value = task.call(*args, **result.kwargs)
        except Exception as exc:
            final = isinstance(exc, PermanentFailure) or ctx.attempt >= ctx.max_attempts
            self._failed(ctx, result, exc, final=final)
            raise
        try:
            value = self.json_value(value, "return value")
        except (TypeError, ValueError) as exc:
            self._failed(ctx, result, exc, final=True)
            raise PermanentFailure(f"the task's return value is not JSON: {exc}") from exc
        set_field(result, "status", TaskResultStatus.SUCCESSFUL)
        set_field(result, "finished_at", conf.now())
        set_field(result, "_return_value", value)
        task_finished.send(type(self), task_result=result)
        return value

    def _running_result(self, ctx: Any) -> AnyResult:
        """What ``get_result`` reads for the occurrence ``ctx`` holds. A first claim (fence 1)
        is all in the context: one claim, by this worker, and no error recorded yet. A later
        one reads its claims, joined to the columns the context lacks, in one query."""
        payload = ctx.payload
        if (
            queue_of(ctx.kind) is None
            or not isinstance(payload, dict)
            or not isinstance(payload.get("task"), str)
        ):
            return self.get_result(ctx.occurrence_id)  # which says why there is no result
        if ctx.fence == 1 and ctx.enqueued_at is not None and ctx.claimed_at is not None:
            return self._result(
                ctx.occurrence_id,
                payload,
                ctx.kind,
                ctx.priority,
                TaskResultStatus.RUNNING,
                ctx.enqueued_at,
                [(ctx.claimed_at, ctx.owner)],
                [],
            )
        claims = list(
            Event.objects.using(self.using_alias())
            .filter(
                occurrence_id=ctx.occurrence_id,
                event_type__in=(OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED),
            )
            .order_by("event_id")
            .values_list(
                "occurred_at",
                "owner_id",
                "occurrence__created_at",
                "occurrence__priority",
                "occurrence__metadata",
            )
        )
        if not claims:
            return self.get_result(ctx.occurrence_id)  # which says why there is no result
        _, _, created_at, priority, metadata = claims[0]
        return self._result(
            ctx.occurrence_id,
            payload,
            ctx.kind,
            priority,
            TaskResultStatus.RUNNING,
            created_at,
            [(at, owner) for at, owner, *_ in claims],
            recorded_errors(metadata),  # a running occurrence has no final error yet
        )

    def _failed(self, ctx: Any, result: AnyResult, exc: BaseException, *, final: bool) -> None:
        """Record a failed attempt and send ``task_finished`` (from the except block, as
        Django does, so that its log receiver sees the exception): FAILED when no attempt
        is left, else READY (it will run again)."""
        error = self._record_error(ctx, exc)
        set_field(result, "errors", [*result.errors, error])
        set_field(result, "status", TaskResultStatus.FAILED if final else TaskResultStatus.READY)
        if final:
            set_field(result, "finished_at", conf.now())
        task_finished.send(type(self), task_result=result)

    def _record_error(self, ctx: Any, exc: BaseException) -> TaskError:
        """Keep this attempt's error in the occurrence's metadata (now: a later attempt, or a
        crash after this, must not lose it) and return it."""
        text = "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:]
        error = TaskError(exception_class_path=_path(type(exc)), traceback=text)
        stored = (
            Occurrence.objects.using(self.using_alias())
            .filter(pk=ctx.occurrence_id)
            .values_list("metadata", flat=True)
        )
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


def _timeout(ms: int | None) -> timedelta | None:
    return None if ms is None else timedelta(milliseconds=ms)
