"""Testing code that uses the scheduler, the way Django tests it (docs/testing.md).

    from django_durable_scheduler import testing

    testing.drain()                      # run what is due, in this thread, as the worker does
    testing.assert_enqueued(job="invoices", payload_contains={"order": 42})
    with testing.clock(at) as clock:     # the scheduler's time, frozen and moved
        clock.advance(hours=1)
    testing.run_handler("invoices.send", {"order": 42})
    testing.grant("team:billing", "invoices.send")

Everything runs on the test's own connection, in its thread, so it works inside a
``TestCase`` (whose transaction never commits) as in a ``TransactionTestCase``. The names
are loaded on first use, so that the pytest plugin (:mod:`.plugin`) imports this package
before Django is set up.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import assert_enqueued, assert_not_enqueued, enqueued
    from .authority import grant
    from .cases import SchedulerTestMixin
    from .clocks import Clock, clock
    from .draining import DrainedRun, drain
    from .handlers import HandlerCall, HandlerContext, run_handler
    from .jobs import sync_declared_jobs

_EXPORTS = {
    "drain": "draining",
    "DrainedRun": "draining",
    "enqueued": "assertions",
    "assert_enqueued": "assertions",
    "assert_not_enqueued": "assertions",
    "clock": "clocks",
    "Clock": "clocks",
    "run_handler": "handlers",
    "HandlerCall": "handlers",
    "HandlerContext": "handlers",
    "grant": "authority",
    "sync_declared_jobs": "jobs",
    "SchedulerTestMixin": "cases",
}

__all__ = [
    "Clock",
    "DrainedRun",
    "HandlerCall",
    "HandlerContext",
    "SchedulerTestMixin",
    "assert_enqueued",
    "assert_not_enqueued",
    "clock",
    "drain",
    "enqueued",
    "grant",
    "run_handler",
    "sync_declared_jobs",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_durable_scheduler.testing' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
