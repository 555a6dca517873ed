"""What this app adds to a task: its attempts, backoff, timeout, principal and concurrency
limit (``@durable``), its unique key and debounce, and the handler kind its queue maps to.
Imports no task framework."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured

from ..exceptions import InvalidArgument
from ..kernel.concurrency import render_key
from ..kernel.unique import MAX_DEBOUNCE_MS, UNIQUE_WHILE, max_wait
from ..rules.authority import EnvelopePrincipal, normalize_principal
from ..rules.identity import canonical_json
from ..rules.throttles import render_key as throttle_key
from ..rules.throttles import stored_throttle
from ..rules.validation import (
    MAX_ATTEMPTS_LIMIT,
    key_label,
    normalize_identifier,
    normalize_int,
    normalize_limit,
    normalize_template,
    retry_delays_ms,
    timeout_ms,
    to_duration_ms,
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


# The concurrency key template of a task's job: each occurrence's payload carries its key,
# computed at enqueue from the call's arguments (``task_concurrency_key``).
KEY_FIELD = "concurrencyKey"
# Likewise the throttle key of a task with a keyed throttle (``task_throttle_key``).
THROTTLE_FIELD = "throttleKey"
THROTTLE_KEY_TEMPLATE = "{" + THROTTLE_FIELD + "}"
JOB_KEY_TEMPLATE = "{" + KEY_FIELD + "}"


@dataclass(frozen=True)
class TaskOptions:
    """A task's attempts, backoff, timeout and concurrency limit (as a job's) and the
    principal it runs as. None: the backend's ``OPTIONS`` decide (and then this app's
    defaults). ``concurrency_key``: a template naming the task's keyword arguments, or a
    callable taking the call's arguments."""

    max_attempts: int | None = None
    retry_base_delay_ms: int | None = None
    retry_max_delay_ms: int | None = None
    principal: EnvelopePrincipal | None = None
    timeout_ms: int | None = None
    concurrency: int | None = None
    concurrency_key: str | Callable[..., Any] | None = None
    # How fast its runs may start ({"limit", "period_ms", "burst", "key"}: the key a template
    # naming the task's keyword arguments, computed at enqueue into the payload's THROTTLE_FIELD).
    throttle: dict[str, Any] | None = None

    def merged_over(self, base: TaskOptions) -> TaskOptions:
        """These options, each one unset taken from ``base``."""
        return TaskOptions(
            **{
                name: base_value if (value := getattr(self, name)) is None else value
                for name, base_value in vars(base).items()
            }
        )


OPTION_KEYS = (
    "max_attempts",
    "retry_base_delay",
    "retry_max_delay",
    "principal",
    "timeout",
    "concurrency",
    "concurrency_key",
    "throttle",
)


def parse_options(values: dict[str, Any], field: str) -> TaskOptions:
    """``TaskOptions`` from ``max_attempts``, ``retry_base_delay``, ``retry_max_delay`` and
    ``timeout`` (seconds or timedelta), ``principal`` (``{"type", "id"}``), ``concurrency``,
    ``concurrency_key`` and ``throttle``; bad input names the field."""
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
        concurrency=normalize_limit(values.get("concurrency"), f"{field}.concurrency"),
        concurrency_key=_key_spec(values.get("concurrency_key"), f"{field}.concurrency_key"),
        throttle=stored_throttle(values.get("throttle"), f"{field}.throttle"),
    )
    return options


def _key_spec(value: Any, field: str) -> str | Callable[..., Any] | None:
    """A task's concurrency key: a callable, or a template naming keyword arguments."""
    if callable(value):
        function: Callable[..., Any] = value
        return function
    return normalize_template(value, field)


def task_concurrency_key(spec: str | Callable[..., Any], args: Any, kwargs: Any) -> str:
    """The concurrency key of one call: ``spec`` (a template) filled from the keyword
    arguments, or called with the arguments; refused as a job's key is (``concurrency_key``),
    and also when it computes None (a task's runs each have a key, or the task none)."""
    if callable(spec):
        function = spec
        key = render_key(lambda _payload: function(*args, **kwargs), None)
    else:
        key = render_key(spec, kwargs)
    if key is None:
        raise InvalidArgument("concurrency_key", "must compute a string (or an int), not None")
    return key


def task_throttle_key(
    throttle: dict[str, Any] | None, kwargs: Any, field: str = "throttle.key"
) -> str | None:
    """The throttle key of one call: the task's throttle key template filled from its keyword
    arguments (a missing one is refused, nothing written); None when it has none."""
    if throttle is None or throttle.get("key") is None:
        return None
    return throttle_key(str(throttle["key"]), kwargs if isinstance(kwargs, dict) else {}, field)


def job_throttle(throttle: dict[str, Any] | None) -> dict[str, Any] | None:
    """The throttle a task's job holds: the task's, keyed on the key each payload carries."""
    if throttle is None or throttle.get("key") is None:
        return throttle
    return {**throttle, "key": THROTTLE_KEY_TEMPLATE}


@dataclass(frozen=True)
class TaskUnique:
    """A task's unique key and debounce (``@durable``): ``key`` is True (the call's arguments
    make the key), a string (one key for every call) or a callable (called with the call's
    arguments; its string is the key, None: this call has none)."""

    key: Any
    unique_while: str | None = None
    debounce_ms: int | None = None
    max_wait_ms: int | None = None  # debounce_max_wait

    def key_of(self, args: Any, kwargs: Any) -> Any:
        """This call's key, for ``kernel.enqueue`` to check (None: no key)."""
        if self.key is True:
            digest = hashlib.sha256(canonical_json([args, kwargs], "args").encode()).hexdigest()
            return f"args:{digest}"
        if isinstance(self.key, str):
            return self.key
        return self.key(*args, **kwargs)


def parse_unique(
    key: Any, unique_while: Any, debounce: Any, field: str, debounce_max_wait: Any = None
) -> TaskUnique | None:
    """``@durable``'s ``unique_key``, ``unique_while``, ``debounce`` and ``debounce_max_wait``;
    a mode without a key keys on the arguments. Bad input names the field."""
    if debounce is None and debounce_max_wait is not None:
        raise InvalidArgument(f"{field}.debounce_max_wait", "needs a debounce, which it caps")
    if key is None and unique_while is None and debounce is None:
        return None
    if key is None:
        key = True
    elif isinstance(key, str):
        key = normalize_identifier(key, f"{field}.unique_key")
    elif key is not True and not callable(key):
        raise InvalidArgument(f"{field}.unique_key", "must be True, a string or a callable")
    if unique_while is not None and (not isinstance(unique_while, str) or unique_while not in UNIQUE_WHILE):
        raise InvalidArgument(f"{field}.unique_while", "must be 'pending' or 'active'")
    debounce_ms = max_wait_ms = None
    if debounce is not None:
        debounce_ms = to_duration_ms(debounce, f"{field}.debounce", minimum_ms=0, maximum_ms=MAX_DEBOUNCE_MS)
        max_wait_ms = max_wait(debounce_max_wait, debounce_ms, f"{field}.debounce_max_wait")
        if unique_while is not None:
            raise InvalidArgument(
                f"{field}.unique_while", "must not be given with debounce, which changes only a waiting task"
            )
    return TaskUnique(key, unique_while, debounce_ms, max_wait_ms)


_options: dict[str, TaskOptions] = {}
_unique: dict[str, TaskUnique | None] = {}
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
    concurrency: int | None = None,
    concurrency_key: str | Callable[..., Any] | None = None,
    throttle: dict[str, Any] | None = None,
    unique_key: bool | str | Callable[..., str | None] | None = None,
    unique_while: str | None = None,
    debounce: float | timedelta | None = None,
    debounce_max_wait: float | timedelta | None = None,
) -> Callable[[F], F]:
    """This app's options for one task, above or below ``@task``::

        @task(priority=10)
        @durable(max_attempts=5, retry_base_delay=30, principal={"type": "team", "id": "billing"})
        def send_invoice(invoice_id): ...

    ``max_attempts`` (1..32) and the backoff (``retry_base_delay`` doubling up to
    ``retry_max_delay``, seconds or timedelta) are those of a job; ``principal`` is who the
    task runs as (its policy must grant the queue's kind, ``django.tasks:<queue>``);
    ``timeout`` is how long a run may take (as a job's ``timeout``). ``concurrency``
    (1..10,000): how many runs of the task may run at once on every worker, per
    ``concurrency_key`` when given: a template naming the task's keyword arguments
    (``"{customer_id}"``) or a callable called with the call's arguments, computed at enqueue.
    ``throttle``: how fast runs of the task may start on every worker, ``{"limit": 100,
    "period": 5, "burst": 20, "key": "{account}"}`` (the key a template naming keyword
    arguments); work over the rate waits in the queue.

    ``unique_key``: while a call of the task with the same key waits, another call returns
    its result instead of adding one (``unique_while="active"``: also while it runs). True
    keys on the call's arguments, a string is one key for every call, a callable is called
    with the arguments and returns the key (None: no key for this call). ``debounce``
    (seconds or timedelta): a call finding one waiting gives it its arguments and moves its
    start to ``debounce`` from now (``run_after``, if set, instead); keyed on the arguments
    unless ``unique_key`` says otherwise. ``debounce_max_wait`` (>= ``debounce``): the start
    never moves past the first such call plus it, however many calls keep coming.
    """
    values = {
        key: value
        for key, value in (
            ("max_attempts", max_attempts),
            ("retry_base_delay", retry_base_delay),
            ("retry_max_delay", retry_max_delay),
            ("timeout", timeout),
            ("principal", principal),
            ("concurrency", concurrency),
            ("concurrency_key", concurrency_key),
            ("throttle", throttle),
        )
        if value is not None
    }
    options = parse_options(values, "durable")
    unique = parse_unique(unique_key, unique_while, debounce, "durable", debounce_max_wait)

    def decorate(target: F) -> F:
        path = _module_path(target)
        with _lock:
            _options[path] = options
            _unique[path] = unique
        return target

    return decorate


def options_for(module_path: str) -> TaskOptions:
    """The ``@durable`` options of the task at ``module_path`` (none set: all None)."""
    return _options.get(module_path, TaskOptions())


def unique_for(module_path: str) -> TaskUnique | None:
    """The ``@durable`` unique key and debounce of the task at ``module_path`` (None: none)."""
    return _unique.get(module_path)


def validate_queue(name: Any, field: str) -> str:
    """A queue name that makes a valid kind."""
    if not isinstance(name, str) or name != name.strip() or not name:
        raise InvalidArgument(field, "must be a non-empty string without surrounding spaces")
    return normalize_identifier(name, field, max_length=MAX_QUEUE_NAME)


def configured_queues(alias: str, queues: Any) -> list[str]:
    """A DurableBackend's ``QUEUES``, each one a name that makes a kind ([]: any name), or
    ``ImproperlyConfigured`` naming the setting."""
    if isinstance(queues, str) or not isinstance(queues, list | tuple | set | frozenset):
        raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES'] must list queue names (an empty list: any)")
    try:
        return [validate_queue(q, f"TASKS[{alias!r}]['QUEUES'][{i}]") for i, q in enumerate(queues)]
    except InvalidArgument as exc:
        raise ImproperlyConfigured(str(exc)) from None
