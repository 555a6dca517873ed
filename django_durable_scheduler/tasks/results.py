"""A task's ``TaskResult``, read back from its occurrence and its claim events: what
``get_result`` returns from any process, and what a running task's signals carry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from ..models import Event, Occurrence, OccurrenceStatus
from ..rules.events import OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED
from ..rules.validation import from_ms
from .display import TASK_STATUS, recorded_errors, task_errors
from .framework import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus, set_field
from .options import queue_of

if TYPE_CHECKING:
    from .framework import AnyResult, AnyTask

STATUS = {status: TaskResultStatus(word) for status, word in TASK_STATUS.items()}
CLAIMS = (OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED)


def new_result(
    backend_alias: str, task: AnyTask, result_id: str, status: Any, args: Any, kwargs: Any
) -> AnyResult:
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
        backend=backend_alias,
        errors=[],
        worker_ids=[],
    )


def found_result(backend_alias: str, task: AnyTask, occurrence: Occurrence) -> AnyResult:
    """The result of the occurrence an enqueue found by its unique key: its arguments, not
    the call's."""
    payload = occurrence.payload if isinstance(occurrence.payload, dict) else {}
    status = STATUS[OccurrenceStatus(occurrence.status)]
    result = new_result(
        backend_alias, task, occurrence.pk, status, payload.get("args", []), payload.get("kwargs", {})
    )
    set_field(result, "enqueued_at", occurrence.created_at)
    return result


def read_result(backend_alias: str, using: str, result_id: str) -> AnyResult:
    """The task's current state, read from its occurrence and its claim events."""
    if not isinstance(result_id, str) or not result_id.startswith("occ_") or len(result_id) > 68:
        raise TaskResultDoesNotExist(result_id)
    occurrence = Occurrence.objects.using(using).select_related("job").filter(pk=result_id).first()
    payload = occurrence.payload if occurrence is not None else None
    if (
        occurrence is None
        or queue_of(occurrence.job.kind) is None
        or not isinstance(payload, dict)
        or payload.get("backend") != backend_alias
        or not isinstance(payload.get("task"), str)
    ):
        raise TaskResultDoesNotExist(result_id)
    claims = list(
        Event.objects.using(using)
        .filter(occurrence_id=result_id, event_type__in=CLAIMS)
        .order_by("event_id")
        .values_list("occurred_at", "owner_id")
    )
    status = STATUS[OccurrenceStatus(occurrence.status)]
    result = _result(
        backend_alias,
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


def running_result(backend_alias: str, using: str, ctx: Any) -> AnyResult:
    """What ``read_result`` reads for the occurrence ``ctx`` holds. A first claim (fence 1)
    is all in the context: one claim, by this worker, and no error recorded yet. A later
    one reads its claims, joined to the columns the context lacks, in one query."""
    payload = ctx.payload
    if (
        queue_of(ctx.kind) is None
        or not isinstance(payload, dict)
        or not isinstance(payload.get("task"), str)
    ):
        return read_result(backend_alias, using, ctx.occurrence_id)  # which says why there is no result
    if ctx.fence == 1 and ctx.enqueued_at is not None and ctx.claimed_at is not None:
        return _result(
            backend_alias,
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
        Event.objects.using(using)
        .filter(occurrence_id=ctx.occurrence_id, event_type__in=CLAIMS)
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
        return read_result(backend_alias, using, ctx.occurrence_id)  # which says why there is no result
    _, _, created_at, priority, metadata = claims[0]
    return _result(
        backend_alias,
        ctx.occurrence_id,
        payload,
        ctx.kind,
        priority,
        TaskResultStatus.RUNNING,
        created_at,
        [(at, owner) for at, owner, *_ in claims],
        recorded_errors(metadata),  # a running occurrence has no final error yet
    )


def _result(
    backend_alias: str,
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
    result = new_result(
        backend_alias,
        _task_of(backend_alias, payload, result_id, kind, priority),
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


def _task_of(
    backend_alias: str, payload: dict[str, Any], result_id: str, kind: str, priority: int
) -> AnyTask:
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
        backend=backend_alias,
    )
