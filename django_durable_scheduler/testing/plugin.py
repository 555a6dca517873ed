"""The pytest plugin (entry point ``pytest11``, active wherever this app is installed):
fixtures for the scheduler's clock and the drain, with pytest-django.

It imports nothing of Django or of the app when pytest loads it, so that a project whose
tests do not configure Django loses nothing; each fixture imports what it needs when a test
asks for it. The fixtures' names start with ``scheduler_``, beside pytest-django's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

DATABASE_FIXTURES = ("db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback")


def _database_access(request: pytest.FixtureRequest) -> None:
    """Give the test database access, as pytest-django's ``db`` does, unless it asked for
    it already (a ``django_db`` mark, ``transactional_db``...): its choice stands."""
    if request.node.get_closest_marker("django_db") is None and not any(
        name in request.fixturenames for name in DATABASE_FIXTURES
    ):
        request.getfixturevalue("db")


@pytest.fixture
def scheduler_clock() -> Iterator[Any]:
    """The scheduler's clock (``testing.clock()``), frozen at the real time now until the
    test moves it: ``scheduler_clock.advance(hours=1)``, ``.set(dt)``, ``.now``."""
    from django_durable_scheduler.testing import clock

    with clock() as frozen:
        yield frozen


@pytest.fixture
def scheduler_drain(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``testing.drain``, with database access: ``runs = scheduler_drain()``."""
    _database_access(request)
    from django_durable_scheduler.testing import drain

    return drain


@pytest.fixture
def scheduler_testing(request: pytest.FixtureRequest) -> ModuleType:
    """The ``django_durable_scheduler.testing`` module, with database access:
    ``scheduler_testing.assert_enqueued(job="invoices")``."""
    _database_access(request)
    from django_durable_scheduler import testing

    return testing
