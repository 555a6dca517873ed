"""``SchedulerTestMixin``: the toolkit as methods, for unittest-style suites
(``django.test.TestCase``, ``TransactionTestCase``, ``SimpleTestCase`` with databases)."""

from __future__ import annotations

import unittest
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..models import AuthorityPolicy, Occurrence
from . import assertions, authority, clocks, draining, handlers, jobs

# The mixin's methods call TestCase's (enterContext); mypy is told so, Python's MRO does it.
if TYPE_CHECKING:
    _Base = unittest.TestCase
else:
    _Base = object


class SchedulerTestMixin(_Base):
    """Mix into a ``TestCase``: ``self.drain()``, ``self.assertEnqueued(...)``,
    ``self.assertNotEnqueued(...)``, ``self.enqueued(...)``, ``self.freeze_clock(at)``,
    ``self.run_handler(kind, payload)``, ``self.grant(principal, *capabilities)`` and
    ``self.sync_declared_jobs()``, each the function of ``django_durable_scheduler.testing``
    of that name."""

    def drain(
        self, *, max_runs: int | None = None, kinds: Iterable[str] | None = None, **options: Any
    ) -> list[draining.DrainedRun]:
        return draining.drain(max_runs=max_runs, kinds=kinds, **options)

    def enqueued(self, **filters: Any) -> list[Occurrence]:
        return assertions.enqueued(**filters)

    def assertEnqueued(self, *, count: int | None = None, **filters: Any) -> list[Occurrence]:  # noqa: N802
        return assertions.assert_enqueued(count=count, **filters)

    def assertNotEnqueued(self, **filters: Any) -> None:  # noqa: N802
        assertions.assert_not_enqueued(**filters)

    def freeze_clock(self, at: datetime | None = None) -> clocks.Clock:
        """Freeze the scheduler's clock at ``at`` (default: now) until the test ends."""
        return self.enterContext(clocks.clock(at))

    def run_handler(self, kind: str, payload: Any = None, **options: Any) -> handlers.HandlerCall:
        return handlers.run_handler(kind, payload, **options)

    def grant(self, principal: Any, *capabilities: str, **budget: Any) -> AuthorityPolicy:
        return authority.grant(principal, *capabilities, **budget)

    def sync_declared_jobs(self) -> dict[str, list[str]]:
        return jobs.sync_declared_jobs()
