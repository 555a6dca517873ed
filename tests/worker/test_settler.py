"""Settling beside the claim (worker/settler.py): on PostgreSQL the outcomes are settled on a
thread of their own, with its own connection, while the loop claims; elsewhere in the loop."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection

from django_durable_scheduler import signals
from django_durable_scheduler.models import Event, Occurrence
from django_durable_scheduler.worker import outcomes

from .test_worker import burst, make

pytestmark = pytest.mark.django_db(transaction=True)

BESIDE = connection.vendor == "postgresql"


def settle_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("dsch-settle")]


def all_ran_once(n: int) -> None:
    assert Occurrence.objects.filter(status="succeeded", attempt=1).count() == n
    assert Event.objects.filter(event_type="occurrence_succeeded").count() == n


def test_outcomes_are_settled_beside_the_claim_where_the_database_allows():
    make("test.ok", 40)
    seen: set[str] = set()

    def finished(sender, **kwargs):
        seen.add(threading.current_thread().name)

    signals.occurrence_finished.connect(finished, weak=False)
    try:
        assert burst(concurrency=4) == 0
    finally:
        signals.occurrence_finished.disconnect(finished)
    all_ran_once(40)
    # The settle reports (logs, signals) on the thread that settled.
    if BESIDE:
        assert seen and all(name.startswith("dsch-settle") for name in seen), seen
    else:
        assert seen == {threading.current_thread().name}
    assert settle_threads() == []  # ended, with its connection, when the worker stopped


def test_a_settle_the_database_refuses_is_tried_again_by_the_next_turn(monkeypatch, caplog):
    make("test.ok", 5)
    calls: list[str] = []
    settle_many = outcomes.kernel.settle_many

    def refused_once(*args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return settle_many(*args, **kwargs)

    monkeypatch.setattr(outcomes.kernel, "settle_many", refused_once)
    # An outage: the outcomes stay pending, and the error reaches the loop.
    monkeypatch.setattr(outcomes, "database_answers", lambda using: False)
    assert burst(concurrency=2) == 0
    all_ran_once(5)
    assert len(calls) >= 2
    assert "database error in the scheduler loop" in caplog.text
    if BESIDE:
        assert all(name.startswith("dsch-settle") for name in calls), calls
    assert settle_threads() == []
