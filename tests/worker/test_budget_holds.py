"""A principal held at its budget: the worker logs one WARNING per window naming the
principal and the window's end, however many of its claims the budget defers."""

from __future__ import annotations

import logging

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.kernel.authority import budgets
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.rules.validation import iso_ms
from django_durable_scheduler.worker import Worker
from django_durable_scheduler.worker.holds import BudgetHolds

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def handlers():
    registry.autodiscover()


def held_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and "held at its budget" in r.message]


def test_a_spent_budget_is_one_warning_per_window(caplog):
    scheduler.set_policy("user", "alice", capabilities=["test.ok"], window=3600, max_runs=1)
    scheduler.create_job("capped", "test.ok", authority={**AUTHORITY, "requestedCapabilities": ["test.ok"]})
    for i in range(4):
        scheduler.enqueue("capped", scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")
    caplog.set_level(logging.INFO, logger="django_durable_scheduler")
    # One occurrence per claim, so that three claims are deferred one after another.
    assert Worker(worker_id="w-test", burst=True, concurrency=1, poll_interval=0.05).run() == 0
    statuses = sorted(Occurrence.objects.values_list("status", flat=True))
    assert statuses == ["queued", "queued", "queued", "succeeded"]
    deferred = [r for r in caplog.records if " deferred " in r.getMessage()]
    assert len(deferred) == 3
    (warning,) = held_warnings(caplog)
    window_end = budgets.current_usage(scheduler.get_policy("user", "alice")).window_ends_at
    assert "user:alice" in warning.getMessage() and iso_ms(window_end) in warning.getMessage()


def test_the_next_window_warns_again(caplog):
    holds = BudgetHolds()
    caplog.set_level(logging.WARNING, logger="django_durable_scheduler")
    first = {"windowEndsAt": "2026-01-01T01:00:00.000Z", "usedRuns": 1, "maxRuns": 1, "usedUnits": 1}
    assert holds.deferred("user:alice", first) is True
    assert holds.deferred("user:alice", first) is False
    assert holds.deferred("user:bob", first) is True
    assert holds.deferred("user:alice", {**first, "windowEndsAt": "2026-01-01T02:00:00.000Z"}) is True
    assert [r.getMessage().split(" is held")[0] for r in held_warnings(caplog)] == [
        "principal user:alice",
        "principal user:bob",
        "principal user:alice",
    ]
