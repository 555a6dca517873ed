from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from django_durable_scheduler import testing
from django_durable_scheduler.handlers import registry

# A Monday, before the end of March's change to summer time in Europe.
START = datetime(2026, 3, 23, 12, 0, tzinfo=UTC)


@pytest.fixture
def frozen() -> Iterator[testing.Clock]:
    with testing.clock(START) as clock:
        yield clock


@pytest.fixture
def handle() -> Iterator[Callable[..., Callable[..., Any]]]:
    """``@handle(kind, **options)`` registers a handler until the test ends."""
    kinds: list[str] = []

    def register(kind: str, **options):
        def decorate(func):
            registry.handler(kind, **options)(func)
            kinds.append(kind)
            return func

        return decorate

    yield register
    for kind in kinds:
        registry.unregister(kind)
