"""Handler registration: ``@scheduler.handler("kind")`` and autodiscovery of handler modules."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .exceptions import InvalidArgument
from .identity import normalize_identifier, normalize_int

HandlerFunc = Callable[[Any], Any]


@dataclass(frozen=True)
class Handler:
    kind: str
    func: HandlerFunc
    units: int | Callable[[Any], int] = 1


_handlers: dict[str, Handler] = {}
_lock = threading.Lock()


def handler(kind: str, *, units: int | Callable[[Any], int] = 1) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated function as the handler of ``kind``."""
    kind = normalize_identifier(kind, "kind", max_length=128)
    if not callable(units):
        normalize_int(units, "units", minimum=1, maximum=1_000_000)

    def register(func: HandlerFunc) -> HandlerFunc:
        if not callable(func):
            raise InvalidArgument("handler", "must be callable")
        with _lock:
            existing = _handlers.get(kind)
            if existing is not None and existing.func is not func:
                qualname = getattr(existing.func, "__qualname__", existing.func)
                raise InvalidArgument("kind", f"{kind!r} already has a handler ({qualname})")
            _handlers[kind] = Handler(kind, func, units)
        return func

    return register


def get_handler(kind: str) -> Handler | None:
    return _handlers.get(kind)


def registered_kinds() -> list[str]:
    return sorted(_handlers)


def unregister(kind: str) -> None:
    with _lock:
        _handlers.pop(kind, None)


def autodiscover() -> None:
    """Import the handler module (``DURABLE_SCHEDULER_HANDLER_MODULE``) of every installed app."""
    from django.utils.module_loading import autodiscover_modules

    from .conf import settings

    autodiscover_modules(settings.HANDLER_MODULE)
