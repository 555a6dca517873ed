"""Handler registration: ``@scheduler.handler("kind")`` and autodiscovery of handler modules."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from importlib import import_module
from typing import Any

from ..exceptions import InvalidArgument
from ..kernel import concurrency as _limits
from ..kernel import throttles as _throttles
from ..rules.authority import MAX_BUDGET
from ..rules.throttles import Throttle, normalize_throttle
from ..rules.validation import normalize_identifier, normalize_int, normalize_limit, timeout_ms
from .declared import add_declaration, declaration_from_handler, forget_kind

HandlerFunc = Callable[[Any], Any]


@dataclass(frozen=True)
class Handler:
    kind: str
    func: HandlerFunc
    units: int | Callable[[Any], int] = 1
    timeout_ms: int | None = None
    concurrency: int | None = None
    concurrency_key: _limits.KeySpec | None = None
    throttle: Throttle | None = None


_handlers: dict[str, Handler] = {}
_lock = threading.Lock()


def handler(
    kind: str,
    *,
    units: int | Callable[[Any], int] = 1,
    timeout: float | timedelta | None = None,
    job: dict[str, Any] | None = None,
    concurrency: int | None = None,
    concurrency_key: _limits.KeySpec | None = None,
    throttle: dict[str, Any] | None = None,
) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated function as the handler of ``kind``.

    ``units``: what one run costs against its principal's unit budget (an int in
    1..1,000,000, or a callable taking the claimed Occurrence). ``timeout``: how long one run
    may take (seconds or a timedelta; a job's own ``timeout`` overrides it, and without
    either ``DURABLE_SCHEDULER_HANDLER_TIMEOUT`` applies): past it the worker fails the run
    as ``HandlerTimeout`` (retried under the job's policy). ``job``: optionally declare a job for
    this handler in code, created or updated by ``manage.py scheduler_sync``::

        @scheduler.handler("reports.send-daily", job={
            "trigger": {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"},
            "authority": {"principal": {"type": "service", "id": "reports"}},
        })

    The dict takes ``job_id`` (default: the kind) and every attribute
    :func:`~django_durable_scheduler.kernel.create_job` takes, validated as it validates them:
    ``authority`` (optional: without it the job runs as the default principal), ``trigger``,
    ``payload``, ``enabled``, ``max_attempts``, ``retry_base_delay``, ``retry_max_delay``,
    ``timeout``, ``concurrency``, ``concurrency_key`` (a template: the job's own limit),
    ``then`` and ``on_dead_letter``. ``concurrency``: how many
    runs of this kind may run at once across every worker (1..10,000; None: no cap), per
    ``concurrency_key`` when given: a template on the payload (``"{customer}"``) or a
    function of the payload, computed at enqueue (a job's own ``concurrency_key`` wins).
    ``throttle``: how fast runs of this kind may start across every worker, ``{"limit": 100,
    "period": 5, "burst": 20, "key": "{account}"}`` (``key``: a template on the payload,
    computed at enqueue; a job's own throttle key wins); work over the rate waits in the queue.
    Every worker should register the same limits and throttles. See also
    :func:`~django_durable_scheduler.handlers.declared.declare_job` for several jobs of one kind.
    """
    kind = normalize_identifier(kind, "kind", max_length=128)
    if not callable(units):
        normalize_int(units, "units", minimum=1, maximum=MAX_BUDGET)  # what one reservation may take
    limit_ms = timeout_ms(timeout, "timeout")
    at_once = normalize_limit(concurrency, "concurrency")
    key_spec = _limits.normalize_key_spec(concurrency_key, "concurrency_key")
    rate = normalize_throttle(throttle, "throttle")
    declaration = None
    if job is not None:
        # Validated now, so a bad declaration fails where it is written (at import).
        declaration = declaration_from_handler(kind, job)

    def register(func: HandlerFunc) -> HandlerFunc:
        if not callable(func):
            raise InvalidArgument("handler", "must be callable")
        with _lock:
            existing = _handlers.get(kind)
            if existing is not None and existing.func is not func:
                qualname = getattr(existing.func, "__qualname__", existing.func)
                raise InvalidArgument("kind", f"{kind!r} already has a handler ({qualname})")
            if declaration is not None:
                # Before the handler: a conflict leaves neither. The handler's app owns the job.
                add_declaration(replace(declaration, module=getattr(func, "__module__", None)))
            _handlers[kind] = Handler(kind, func, units, limit_ms, at_once, key_spec, rate)
            _limits.register_kind(kind, at_once, key_spec)
            _throttles.register_kind(kind, rate)
        return func

    return register


def get_handler(kind: str) -> Handler | None:
    return _handlers.get(kind)


def registered_kinds() -> list[str]:
    return sorted(_handlers)


def registered_handlers() -> list[Handler]:
    """Every registered handler, by kind."""
    with _lock:
        return [_handlers[kind] for kind in sorted(_handlers)]


def unregister(kind: str) -> None:
    """Forget the handler of ``kind`` and the jobs declared in code for it."""
    with _lock:
        _handlers.pop(kind, None)
        _limits.forget_kind(kind)
        _throttles.forget_kind(kind)
    forget_kind(kind)


# The handler modules whose import failed in this process, with their error.
_failed: dict[str, BaseException] = {}


def import_handler_modules(name: str) -> list[tuple[str, str, BaseException]]:
    """Import the module ``name`` of every installed app that has one; returns ``(app label,
    module, error)`` of each that fails. A module imported once is not imported again, nor
    is one that failed: running it again would report the handlers it registered before it
    failed as registered twice, instead of its own error."""
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    failures: list[tuple[str, str, BaseException]] = []
    for app_config in apps.get_app_configs():
        module = f"{app_config.name}.{name}"
        error = _failed.get(module)
        if error is None:
            try:
                if not module_has_submodule(app_config.module, name):
                    continue
                import_module(module)
                continue
            except Exception as exc:
                error = _failed[module] = exc
        failures.append((app_config.label, module, error))
    return failures


def autodiscover() -> None:
    """Import the handler module (``DURABLE_SCHEDULER_HANDLER_MODULE``) of every installed
    app; the first that fails to import raises its error."""
    from ..conf import settings

    for _, _, error in import_handler_modules(settings.HANDLER_MODULE):
        raise error
