"""The job that runs a backend's tasks of one path on one queue: its id, the settings it holds
(``@durable`` options over the backend's ``OPTIONS`` over the app's defaults), and making it
or bringing it up to date with them before an enqueue needs it."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import conf, kernel
from ..exceptions import Conflict, NotFound, RevisionConflict
from ..models import Job
from ..rules.identity import canonical_json
from .framework import InvalidTask
from .options import JOB_KEY_TEMPLATE, TaskOptions, job_throttle, options_for, queue_kind

if TYPE_CHECKING:
    from .framework import AnyTask

# (database alias, job id) -> the job settings last confirmed stored (after a commit), so
# that an enqueue reads the job row only when this process has not seen it yet.
_confirmed: dict[tuple[str, str], tuple[Any, ...]] = {}
_confirmed_lock = threading.Lock()


def job_id_for(backend_alias: str, task: AnyTask) -> str:
    job_id = f"task:{backend_alias}:{task.queue_name}:{task.module_path}"
    if len(job_id) > 256:
        raise InvalidTask(f"task path {task.module_path!r} is too long for this backend")
    return job_id


def job_settings(task: AnyTask, defaults: TaskOptions) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What the job of ``task`` holds, from its ``@durable`` options over ``defaults`` (the
    backend's ``OPTIONS``) over the app's defaults: ``({"kind", "max_attempts",
    "retry_base_delay_ms", "retry_max_delay_ms", "timeout_ms", "concurrency",
    "concurrency_key", "throttle"}, authority or None for the default principal)``. A task with a
    concurrency key gets a job keyed on the key each occurrence's payload carries."""
    opts = options_for(task.module_path).merged_over(defaults)
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
        "concurrency": opts.concurrency,
        "concurrency_key": None if opts.concurrency_key is None else JOB_KEY_TEMPLATE,
        "throttle": job_throttle(opts.throttle),
    }
    authority = None
    if opts.principal is not None:
        authority = {"principal": opts.principal, "requestedCapabilities": [kind]}
    return wanted, authority


def ensure_job(task: AnyTask, backend_alias: str, defaults: TaskOptions, using: str) -> str:
    """The id of the task's job, created or brought up to date with its options first."""
    job_id = job_id_for(backend_alias, task)
    wanted, authority = job_settings(task, defaults)
    signature = (wanted, authority)  # compared as values: no JSON encoding on every enqueue
    key = (using, job_id)
    if _confirmed.get(key) == signature:
        return job_id
    with transaction.atomic(using=using):
        _sync_job(job_id, wanted, authority, using)

    def confirm() -> None:
        with _confirmed_lock:
            _confirmed[key] = signature

    # Only once it is committed: a job made in a transaction that rolls back is gone.
    transaction.on_commit(confirm, using=using)
    return job_id


def forget_job(using: str, job_id: str) -> None:
    """The job this process confirmed is gone (deleted in the admin, a flushed database): the
    next ``ensure_job`` makes it again."""
    with _confirmed_lock:
        _confirmed.pop((using, job_id), None)


def _sync_job(job_id: str, wanted: dict[str, Any], authority: dict[str, Any] | None, alias: str) -> None:
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
                        concurrency=wanted["concurrency"],
                        concurrency_key=wanted["concurrency_key"],
                        throttle=wanted["throttle"],
                        using=alias,
                    )
                return
            except Conflict:
                continue
        changes = _changes(job, wanted, authority)
        if not changes:
            return
        try:
            with transaction.atomic(using=alias):
                kernel.update_job(job_id, expected_revision=job.revision, using=alias, **changes)
            return
        except RevisionConflict:
            continue
    raise RevisionConflict(f"job {job_id!r} kept changing while its task was enqueued", {"job_id": job_id})


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
    for name in ("concurrency", "concurrency_key", "throttle"):
        if getattr(job, name) != wanted[name]:
            changes[name] = wanted[name]
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


def _timeout(ms: int | None) -> timedelta | None:
    return None if ms is None else timedelta(milliseconds=ms)
