"""``testing.grant()``: a principal's capabilities and budget in one line, on the policy API."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import testing

pytestmark = pytest.mark.django_db


def test_grant_creates_then_widens_a_policy(frozen):
    policy = testing.grant("team:billing", "invoices.send")
    assert (policy.principal_type, policy.principal_id, policy.capabilities) == (
        "team",
        "billing",
        ["invoices.send"],
    )
    assert (policy.max_runs, policy.max_units, policy.window_ms) == (None, None, 86_400_000)  # no budget
    wider = testing.grant(("team", "billing"), "invoices.void", runs=5, window=timedelta(hours=1))
    assert sorted(wider.capabilities) == ["invoices.send", "invoices.void"]
    assert (wider.max_runs, wider.window_ms, wider.revision) == (5, 3_600_000, 2)
    same = testing.grant({"type": "team", "id": "billing"}, "invoices.send", max_running=2)
    assert (same.max_runs, same.max_running) == (5, 2)  # what was not given stays
    envelope = {"principal": {"type": "team", "id": "billing"}, "requestedCapabilities": []}
    assert testing.grant(envelope, "invoices.send").revision == 4
    assert scheduler.get_policy("team", "billing").max_running == 2
