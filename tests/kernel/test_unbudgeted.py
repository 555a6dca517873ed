"""Work nobody configured a budget for: the default principal's policy has none, so its claims
are never held, charge nothing and write no reservation nor usage row; a budget, once set,
applies again (docs/authority.md, "Budgets")."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.kernel import claiming
from django_durable_scheduler.kernel.authority import budgets, reservations
from django_durable_scheduler.models import AuthorityReservation, AuthorityUsage, Occurrence

pytestmark = pytest.mark.django_db
OWNER = "w-one"
DEFAULT = ("app", "durable_scheduler")


def enqueue(clock, job_id: str, n: int) -> None:
    for i in range(n):
        scheduler.enqueue(job_id, scheduled_for=clock() - timedelta(seconds=n - i), trigger_key=f"t{i}")


def test_the_default_principal_has_no_budget(clock):
    scheduler.create_job("nightly", "reports.nightly")
    policy = scheduler.get_policy(*DEFAULT)
    assert (policy.max_runs, policy.max_units, policy.has_budget) == (None, None, False)
    usage = scheduler.current_usage(policy)
    assert (usage.remaining_runs, usage.remaining_units, usage.held) == (None, None, False)


def test_work_without_a_budget_runs_past_the_old_default_and_writes_no_reservation(clock):
    scheduler.create_job("nightly", "reports.nightly")
    policy = scheduler.get_policy(*DEFAULT)
    # A window that has seen far more than the old default of 100,000 runs: nothing reads it.
    start, _ = budgets.window_bounds(policy.window_ms, clock())
    AuthorityUsage.objects.create(
        principal_type="app",
        principal_id="durable_scheduler",
        policy_revision=policy.revision,
        window_started_at=start,
        runs=1_000_000,
        units=1_000_000,
        updated_at=clock(),
    )
    enqueue(clock, "nightly", 5)
    batch = claiming.claim_authorized(owner=OWNER, lease=60, limit=10)
    assert len(batch.runnable) == 5 and batch.refused == [] and batch.unpriced == []
    assert {row.charged_units for row in batch.runnable} == {0}
    assert scheduler.authorize(batch.runnable[0], owner=OWNER) == reservations.AUTHORIZED
    assert not AuthorityReservation.objects.exists()
    assert AuthorityUsage.objects.get().runs == 1_000_000  # untouched
    for row in batch.runnable:
        scheduler.settle(row.pk, owner=OWNER, fence=row.fence, outcome="succeeded")
    assert set(Occurrence.objects.values_list("status", flat=True)) == {"succeeded"}


def test_a_budget_set_later_holds_the_work_again(clock):
    scheduler.create_job("nightly", "reports.nightly")
    policy = scheduler.get_policy(*DEFAULT)
    scheduler.set_policy(
        *DEFAULT, capabilities=policy.capabilities, window=3600, max_runs=2, expected_revision=policy.revision
    )
    enqueue(clock, "nightly", 3)
    batch = claiming.claim_authorized(owner=OWNER, lease=60, limit=10)
    assert len(batch.runnable) == 2
    ((_, refused),) = batch.refused
    assert refused.verdict == reservations.DEFERRED
    assert refused.error["details"]["maxUnits"] is None  # runs are limited, units are not
    assert AuthorityReservation.objects.count() == 2


def test_a_policy_with_only_a_unit_limit_charges_units(clock):
    scheduler.set_policy("user", "una", capabilities=["reports.send"], window=3600, max_units=3)
    auth = {"principal": {"type": "user", "id": "una"}, "requestedCapabilities": ["reports.send"]}
    scheduler.create_job("units", "reports.send", authority=auth)
    enqueue(clock, "units", 3)
    batch = claiming.claim_authorized(owner=OWNER, lease=60, limit=10, units_of=lambda occurrence: 2)
    assert len(batch.runnable) == 1 and len(batch.refused) == 2
    usage = scheduler.current_usage(scheduler.get_policy("user", "una"))
    assert (usage.runs, usage.units, usage.remaining_runs, usage.remaining_units) == (1, 2, None, 1)


@pytest.mark.parametrize(("field", "value"), [("max_runs", 0), ("max_units", 1_000_001), ("max_runs", "x")])
def test_a_bad_limit_is_refused_and_writes_nothing(clock, field, value):
    with pytest.raises(scheduler.InvalidArgument) as caught:
        scheduler.set_policy("user", "una", capabilities=["a.b"], window=3600, **{field: value})
    assert caught.value.details["field"] == field
    assert scheduler.get_policy("user", "una") is None
