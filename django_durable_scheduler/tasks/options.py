"""What this app adds to a task: its attempts, backoff and principal (``@durable``), and
the handler kind its queue maps to. Imports no task framework."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from ..authority import normalize_principal
from ..exceptions import InvalidArgument
from ..identity import (
    MAX_ATTEMPTS_LIMIT,
    key_label,
    normalize_identifier,
    normalize_int,
    retry_delays_ms,
    timeout_ms,
)

# Each queue of a DurableBackend is one handler kind: ``runscheduler --queues`` claims only
# those kinds, and the kind is the capability that a task's principal must hold.
KIND_PREFIX = "django.tasks:"
MAX_QUEUE_NAME = 128 - len(KIND_PREFIX)

F = TypeVar("F")


def queue_kind(queue_name: str) -> str:
    """The handler kind of the tasks of queue ``queue_name``."""
    return KIND_PREFIX + queue_name


def queue_of(kind: str) -> str | None:
    """The queue of a task kind, or None for a kind that is not a task queue's."""
    return kind[len(KIND_PREFIX) :] if kind.startswith(KIND_PREFIX) else None


@dataclass(frozen=True)
class TaskOptions:
    """A task's attempts and backoff (as a job's) and the principal it runs as. None: the
    backend's ``OPTIONS`` decide (and then this app's defaults)."""

    max_attempts: int | None = None
    retry_base_delay_ms: int | None = None
    retry_max_delay_ms: int | None = None
    principal: dict[str, Any] | None = None
    timeout_ms: int | None = None

    def merged_over(self, base: TaskOptions) -> TaskOptions:
        """These options, each one unset taken from ``base``."""
        return TaskOptions(
            max_attempts=self.max_attempts if self.max_attempts is not None else base.max_attempts,
            retry_base_delay_ms=(
                self.retry_base_delay_ms if self.retry_base_delay_ms is not None else base.retry_base_delay_ms
            ),
            retry_max_delay_ms=(
                self.retry_max_delay_ms if self.retry_max_delay_ms is not None else base.retry_max_delay_ms
            ),
            principal=self.principal if self.principal is not None else base.principal,
            timeout_ms=self.timeout_ms if self.timeout_ms is not None else base.timeout_ms,
        )


OPTION_KEYS = ("max_attempts", "retry_base_delay", "retry_max_delay", "principal", "timeout")


def parse_options(values: dict[str, Any], field: str) -> TaskOptions:
    """``TaskOptions`` from ``max_attempts``, ``retry_base_delay``, ``retry_max_delay`` and
    ``timeout`` (seconds or timedelta) and ``principal`` (``{"type", "id"}``); bad input names
    the field."""
    if not isinstance(values, dict):
        raise InvalidArgument(field, "must be a dict")
    unknown = sorted(key_label(key) for key in values if key not in OPTION_KEYS)
    if unknown:
        raise InvalidArgument(
            f"{field}.{unknown[0]}", f"is not a task option (known: {', '.join(OPTION_KEYS)})"
        )
    attempts = values.get("max_attempts")
    principal = values.get("principal")
    base_ms, max_ms = retry_delays_ms(
        values.get("retry_base_delay"), values.get("retry_max_delay"), f"{field}."
    )
    options = TaskOptions(
        max_attempts=(
            None
            if attempts is None
            else normalize_int(attempts, f"{field}.max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
        ),
        retry_base_delay_ms=base_ms,
        retry_max_delay_ms=max_ms,
        principal=None if principal is None else normalize_principal(principal, f"{field}.principal"),
        timeout_ms=timeout_ms(values.get("timeout"), f"{field}.timeout"),
    )
    return options


_options: dict[str, TaskOptions] = {}
_lock = threading.Lock()


def _module_path(target: Any) -> str:
    # A Task (either framework) knows its path; a plain function is named as Django names it.
    path = getattr(target, "module_path", None)
    if isinstance(path, str):
        return path
    if not callable(target):
        raise InvalidArgument("durable", "decorates a task or its function")
    return f"{target.__module__}.{target.__qualname__}"


def durable(
    *,
    max_attempts: int | None = None,
    retry_base_delay: float | timedelta | None = None,
    retry_max_delay: float | timedelta | None = None,
    principal: dict[str, Any] | None = None,
    timeout: float | timedelta | None = None,
) -> Callable[[F], F]:
    """This app's options for one task, above or below ``@task``::

        @task(priority=10)
        @durable(max_attempts=5, retry_base_delay=30, principal={"type": "team", "id": "billing"})
        def send_invoice(invoice_id): ...

    ``max_attempts`` (1..32) and the backoff (``retry_base_delay`` doubling up to
    ``retry_max_delay``, seconds or timedelta) are those of a job; ``principal`` is who the
    task runs as (its policy must grant the queue's kind, ``django.tasks:<queue>``);
    ``timeout`` is how long a run may take (as a job's ``timeout``).
    """
    values = {
        key: value
        for key, value in (
            ("max_attempts", max_attempts),
            ("retry_base_delay", retry_base_delay),
            ("retry_max_delay", retry_max_delay),
            ("timeout", timeout),
            ("principal", principal),
        )
        if value is not None
    }
    options = parse_options(values, "durable")

    def decorate(target: F) -> F:
        with _lock:
            _options[_module_path(target)] = options
        return target

    return decorate


def options_for(module_path: str) -> TaskOptions:
    """The ``@durable`` options of the task at ``module_path`` (none set: all None)."""
    return _options.get(module_path, TaskOptions())


def validate_queue(name: Any, field: str) -> str:
    """A queue name that makes a valid kind."""
    if not isinstance(name, str) or name != name.strip() or not name:
        raise InvalidArgument(field, "must be a non-empty string without surrounding spaces")
    return normalize_identifier(name, field, max_length=MAX_QUEUE_NAME)
