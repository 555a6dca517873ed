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


@pytest.fixture
def scheduler_clock() -> Iterator[Any]:
    """The scheduler's clock (``testing.clock()``), frozen at the real time now until the
    test moves it: ``scheduler_clock.advance(hours=1)``, ``.set(dt)``, ``.now``."""
    from django_durable_scheduler.testing import clock

    with clock() as frozen:
        yield frozen


# The two below ask for pytest-django's ``db``: with ``transactional_db`` or a
# ``django_db(transaction=True)`` mark beside it, pytest-django makes the test transactional.
@pytest.fixture
def scheduler_drain(db: None) -> Callable[..., Any]:
    """``testing.drain``, with database access: ``runs = scheduler_drain()``."""
    from django_durable_scheduler.testing import drain

    return drain


@pytest.fixture
def scheduler_testing(db: None) -> ModuleType:
    """The ``django_durable_scheduler.testing`` module, with database access:
    ``scheduler_testing.assert_enqueued(job="invoices")``."""
    from django_durable_scheduler import testing

    return testing
