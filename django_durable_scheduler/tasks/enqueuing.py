"""A task's enqueue as an occurrence of its job, written through ``kernel.enqueue`` in the
caller's transaction, with the task's ``@durable`` unique key and debounce."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .. import conf, kernel
from ..exceptions import NotFound
from ..rules.validation import normalize_identifier, to_ms
from .jobs import ensure_job, forget_job, job_id_for
from .options import (
    KEY_FIELD,
    THROTTLE_FIELD,
    TaskOptions,
    options_for,
    task_concurrency_key,
    task_throttle_key,
    unique_for,
)

if TYPE_CHECKING:
    from .framework import AnyTask


def enqueue(
    task: AnyTask, args: Any, kwargs: Any, *, backend_alias: str, defaults: TaskOptions, using: str
) -> kernel.Enqueued:
    """The task's occurrence (its arguments already JSON), and whether it was found instead:
    the waiting (or running) task of the same unique key, no task enqueued."""
    payload: dict[str, Any] = {
        "task": task.module_path,
        "args": args,
        "kwargs": kwargs,
        "backend": backend_alias,
    }
    if task.run_after is not None:
        payload["runAfter"] = to_ms(task.run_after, "run_after")
    # Computed now, before the task's job is made or brought up to date: a bad key writes nothing.
    options = options_for(task.module_path).merged_over(defaults)
    key_spec = options.concurrency_key
    if key_spec is not None:
        payload[KEY_FIELD] = task_concurrency_key(key_spec, args, kwargs)
    if options.throttle is not None and options.throttle.get("key") is not None:
        payload[THROTTLE_FIELD] = task_throttle_key(options.throttle, kwargs)
    unique = unique_args(task, args, kwargs)
    try:
        return _enqueue(task, payload, unique, backend_alias, defaults, using)
    except NotFound:
        # The job this process confirmed is gone (deleted in the admin, a flushed
        # database): make it again, once.
        forget_job(using, job_id_for(backend_alias, task))
        return _enqueue(task, payload, unique, backend_alias, defaults, using)


def _enqueue(
    task: AnyTask,
    payload: dict[str, Any],
    unique: dict[str, Any],
    backend_alias: str,
    defaults: TaskOptions,
    using: str,
) -> kernel.Enqueued:
    job_id = ensure_job(task, backend_alias, defaults, using)
    return kernel.enqueue(
        job_id,
        scheduled_for=conf.now(),
        trigger_key=f"task:{uuid.uuid4().hex}",
        available_at=None if "debounce" in unique else task.run_after,
        payload=payload,
        priority=task.priority,
        using=using,
        **unique,
    )


def unique_args(task: AnyTask, args: Any, kwargs: Any) -> dict[str, Any]:
    """The task's ``@durable`` unique key and debounce (and its cap) as ``kernel.enqueue``'s
    arguments for this call (none: the call has no key). A debounced task's ``run_after`` is
    its debounced start."""
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
    if unique.max_wait_ms is None:
        return {"unique_key": key, "debounce": delay}
    # A run_after past the cap is held to it, as the cap holds every later call.
    cap = timedelta(milliseconds=unique.max_wait_ms)
    return {"unique_key": key, "debounce": min(delay, cap), "debounce_max_wait": cap}
