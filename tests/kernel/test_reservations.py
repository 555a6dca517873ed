"""Authority reservations: reserve_authority, authorize (every denial reason, deferral on an
exhausted budget, reuse on retry) and settlement on every terminal path (``docs/design.md``,
"Budgets and reservations")."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import (
    AuthorityPolicy,
    AuthorityReservation,
    AuthorityUsage,
    Event,
    Job,
    Occurrence,
)
from django_durable_scheduler.rules.authority import bind, bound_revision
from django_durable_scheduler.worker import Worker

from ..conftest import authority_for, snapshot
from ..procs.runner import queue_race, start_racers

pytestmark = pytest.mark.django_db

HOUR = 3600
OWNER = "w1"


def setup(pid="alice", caps=("reports.send",), *, job_id="job-a", requested=None, **policy):
    """A job of ``pid`` requesting ``requested`` (default: ``caps``), then its policy (which
    binds the job). Returns the policy."""
    scheduler.create_job(
        job_id, "reports.send", authority=authority_for(pid, *(requested or caps)), max_attempts=3
    )
    policy.setdefault("window", HOUR)
    policy.setdefault("max_runs", 100)
    policy.setdefault("max_units", 1000)
    return scheduler.set_policy("user", pid, capabilities=list(caps), **policy)


def claimed(clock, key="t1", job_id="job-a"):
    occ, _ = scheduler.enqueue(job_id, scheduled_for=clock(), trigger_key=key)
    row = scheduler.claim(owner=OWNER, lease=60)
    assert row is not None and row.pk == occ.pk
    return row


def usage_rows():
    return list(
        AuthorityUsage.objects.order_by("window_started_at").values_list("policy_revision", "runs", "units")
    )


def ref_of(row):
    return bound_revision(row.authority)


def denied_event(occ):
    (event,) = Event.objects.filter(occurrence_id=occ.pk, event_type="authority_denied")
    return event


def assert_denied(occ, reason, code):
    occ.refresh_from_db()
    assert occ.status == "dead_letter" and occ.settled_at is not None and occ.lease_owner is None
    assert occ.last_error["reason"] == reason
    assert occ.last_error["code"] == code
    event = denied_event(occ)
    assert event.data["reason"] == reason and event.data["code"] == code
    assert event.data["details"] == occ.last_error["details"]
    assert event.owner_id == OWNER and event.fence == occ.fence
    return occ.last_error["details"]


# --------------------------------------------------------------------------- reserve_authority


def test_reserve_writes_usage_and_reservation_then_dedupes(clock):
    setup()
    occ = claimed(clock)
    res = scheduler.reserve_authority(occ.pk, policy_revision=1, units=3)
    assert res.deduplicated is False
    stored = AuthorityReservation.objects.get()
    assert (stored.occurrence_id, stored.job_id, stored.principal_type, stored.principal_id) == (
        occ.pk,
        "job-a",
        "user",
        "alice",
    )
    assert (stored.policy_revision, stored.units, stored.status, stored.outcome, stored.settled_at) == (
        1,
        3,
        "reserved",
        None,
        None,
    )
    assert stored.window_started_at == datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    assert stored.created_at == clock()
    assert usage_rows() == [(1, 1, 3)]
    again = scheduler.reserve_authority(occ.pk, policy_revision=1, units=3)
    assert again.deduplicated is True and again.pk == occ.pk
    assert usage_rows() == [(1, 1, 3)]
    before = snapshot()
    for kwargs in ({"policy_revision": 1, "units": 4}, {"policy_revision": 2, "units": 3}):
        with pytest.raises(scheduler.AuthorityReservationMismatch) as info:
            scheduler.reserve_authority(occ.pk, **kwargs)
        assert info.value.code == "SCHEDULER_AUTHORITY_RESERVATION_MISMATCH"
        assert info.value.details["reservation"]["units"] == 3
    assert snapshot() == before
    assert scheduler.get_reservation(occ.pk).units == 3


def test_reserve_refusals(clock):
    setup(caps=("reports.send",), requested=("reports.send", "mail.send", "audit.read"))
    queued, _ = scheduler.enqueue("job-a", scheduled_for=clock() + timedelta(hours=2), trigger_key="later")
    occ = claimed(clock)
    before = snapshot()
    with pytest.raises(scheduler.NotFound):
        scheduler.reserve_authority("occ_missing", policy_revision=1)
    with pytest.raises(scheduler.AuthorityOccurrenceNotRunning) as info:
        scheduler.reserve_authority(queued.pk, policy_revision=1)
    assert info.value.code == "SCHEDULER_AUTHORITY_OCCURRENCE_NOT_RUNNING"
    assert info.value.details["status"] == "queued"
    with pytest.raises(scheduler.AuthorityPolicyStale) as info:
        scheduler.reserve_authority(occ.pk, policy_revision=2)
    assert info.value.code == "SCHEDULER_AUTHORITY_POLICY_STALE"
    assert (info.value.details["expected_revision"], info.value.details["actual_revision"]) == (2, 1)
    with pytest.raises(scheduler.AuthorityPermissionDenied) as info:
        scheduler.reserve_authority(occ.pk, policy_revision=1)
    assert info.value.code == "SCHEDULER_AUTHORITY_PERMISSION_DENIED"
    assert info.value.details == {
        "principal": {"type": "user", "id": "alice"},
        "policy_revision": 1,
        "denied": ["audit.read", "mail.send"],
    }
    assert snapshot() == before
    AuthorityPolicy.objects.update(enabled=False)
    with pytest.raises(scheduler.AuthorityPolicyRequired) as info:
        scheduler.reserve_authority(occ.pk, policy_revision=1)
    assert info.value.details["policy"] == "disabled"
    AuthorityPolicy.objects.all().delete()
    with pytest.raises(scheduler.AuthorityPolicyRequired) as info:
        scheduler.reserve_authority(occ.pk, policy_revision=1)
    assert info.value.code == "SCHEDULER_AUTHORITY_POLICY_REQUIRED"
    assert info.value.details == {"principal": {"type": "user", "id": "alice"}, "policy": "missing"}
    assert not AuthorityReservation.objects.exists() and not AuthorityUsage.objects.exists()


def test_reserve_budget_exhausted_details(clock):
    setup(max_runs=2, max_units=1000)
    scheduler.reserve_authority(claimed(clock, "a").pk, policy_revision=1, units=10)
    scheduler.reserve_authority(claimed(clock, "b").pk, policy_revision=1, units=20)
    occ = claimed(clock, "c")
    with pytest.raises(scheduler.AuthorityBudgetExhausted) as info:
        scheduler.reserve_authority(occ.pk, policy_revision=1, units=5)
    assert info.value.code == "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED"
    assert info.value.details == {
        "windowStartedAt": "2026-01-05T12:00:00.000Z",
        "windowEndsAt": "2026-01-05T13:00:00.000Z",
        "usedRuns": 2,
        "usedUnits": 30,
        "requestedUnits": 5,
        "maxRuns": 2,
        "maxUnits": 1000,
    }
    assert usage_rows() == [(1, 2, 30)]
    assert AuthorityReservation.objects.count() == 2


def test_reserve_unit_budget_boundary(clock):
    setup(max_units=10)
    scheduler.reserve_authority(claimed(clock, "a").pk, policy_revision=1, units=6)
    occ = claimed(clock, "b")
    with pytest.raises(scheduler.AuthorityBudgetExhausted) as info:
        scheduler.reserve_authority(occ.pk, policy_revision=1, units=5)
    assert (info.value.details["usedUnits"], info.value.details["requestedUnits"]) == (6, 5)
    assert scheduler.reserve_authority(occ.pk, policy_revision=1, units=4).units == 4  # exactly the max
    assert usage_rows() == [(1, 2, 10)]


def test_reserve_budget_state_invalid_after_tampering(clock):
    """A claim trusts the usage row; the audit recounts, marks the window, and from then on
    it is refused."""
    setup()
    scheduler.reserve_authority(claimed(clock, "a").pk, policy_revision=1, units=2)
    AuthorityUsage.objects.filter(principal_id="alice").update(runs=5)
    (check,) = scheduler.audit_budgets()
    assert (check.usage, check.reservations, check.matches) == ((5, 2), (1, 2), False)
    occ = claimed(clock, "b")
    before = snapshot()
    with pytest.raises(scheduler.AuthorityBudgetStateInvalid) as info:
        scheduler.reserve_authority(occ.pk, policy_revision=1)
    assert info.value.code == "SCHEDULER_AUTHORITY_BUDGET_STATE_INVALID"
    assert info.value.details["usage"] == {"runs": 5, "units": 2}
    assert info.value.details["reservations"] == {"runs": 1, "units": 2}
    assert snapshot() == before


def test_reserve_inside_caller_transaction_rolls_back(clock):
    setup()
    occ = claimed(clock)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        scheduler.reserve_authority(occ.pk, policy_revision=1)
        raise Boom
    assert not AuthorityReservation.objects.exists() and not AuthorityUsage.objects.exists()


# --------------------------------------------------------------------------- authorize: denials


def test_authorize_reserves(clock):
    setup()
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=2, owner=OWNER) == "reserved"
    res = AuthorityReservation.objects.get()
    assert (res.occurrence_id, res.units, res.policy_revision, res.status) == (occ.pk, 2, 1, "reserved")
    assert usage_rows() == [(1, 1, 2)]
    occ.refresh_from_db()
    assert occ.status == "running" and occ.attempt == 1


def test_authorize_units_function_of_the_occurrence(clock):
    setup()
    occ = claimed(clock)
    seen = []

    def units(o):
        seen.append(o.pk)
        return len(o.payload or []) + 4

    assert scheduler.authorize(occ, units=units, owner=OWNER) == "reserved"
    assert seen == [occ.pk] and AuthorityReservation.objects.get().units == 4


def test_denied_policy_required_missing(clock):
    scheduler.create_job("job-a", "reports.send", authority=authority_for("alice", "reports.send"))
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    details = assert_denied(occ, "policy_required", "SCHEDULER_AUTHORITY_POLICY_REQUIRED")
    assert details == {"principal": {"type": "user", "id": "alice"}, "policy": "missing"}
    assert denied_event(occ).data["attempt"] == 1
    assert not AuthorityReservation.objects.exists() and not AuthorityUsage.objects.exists()
    # No retry: it stays dead-lettered.
    clock.advance(3600)
    assert scheduler.claim(owner=OWNER, lease=60) is None


def test_denied_policy_required_disabled(clock):
    setup()
    occ = claimed(clock)
    AuthorityPolicy.objects.update(enabled=False)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    assert (
        assert_denied(occ, "policy_required", "SCHEDULER_AUTHORITY_POLICY_REQUIRED")["policy"] == "disabled"
    )


def test_denied_policy_unbound(clock):
    setup()
    occ = claimed(clock)
    authority = dict(occ.authority)
    authority["authorizationRefs"] = {
        k: v for k, v in authority["authorizationRefs"].items() if k != "schedulerPolicyRevision"
    }
    Occurrence.objects.filter(pk=occ.pk).update(authority=authority)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    details = assert_denied(occ, "policy_unbound", "SCHEDULER_AUTHORITY_POLICY_UNBOUND")
    assert details == {"principal": {"type": "user", "id": "alice"}, "expected": "scheduler-authority:1"}
    assert not AuthorityReservation.objects.exists()


def test_denied_policy_stale(clock):
    setup()
    occ = claimed(clock)
    Occurrence.objects.filter(pk=occ.pk).update(authority=bind(occ.authority, 7))
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    details = assert_denied(occ, "policy_stale", "SCHEDULER_AUTHORITY_POLICY_STALE")
    assert (details["expected_revision"], details["actual_revision"]) == (7, 1)


def test_denied_policy_stale_after_a_narrowing_change(clock):
    setup(caps=("reports.send", "mail.send"), requested=("reports.send", "mail.send"))
    scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t")
    scheduler.set_policy("user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=9, max_units=9)
    row = scheduler.claim(owner=OWNER, lease=60)
    assert scheduler.authorize(row, units=1, owner=OWNER) == "denied"
    details = assert_denied(row, "policy_stale", "SCHEDULER_AUTHORITY_POLICY_STALE")
    assert (details["expected_revision"], details["actual_revision"]) == (1, 2)
    # What the change took away is named too.
    assert details["denied"] == ["mail.send"] and details["principal"] == {"type": "user", "id": "alice"}
    assert row.last_error["message"].endswith("is at revision 2, not 1; it does not grant mail.send")


def test_denied_permission(clock):
    setup(caps=("reports.send",))
    occ = claimed(clock)
    # The envelope asks for more than the policy grants (bound to the current revision).
    authority = {**occ.authority, "requestedCapabilities": ["audit.read", "reports.send", "z.write"]}
    Occurrence.objects.filter(pk=occ.pk).update(authority=authority)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    details = assert_denied(occ, "permission_denied", "SCHEDULER_AUTHORITY_PERMISSION_DENIED")
    assert details == {
        "principal": {"type": "user", "id": "alice"},
        "policy_revision": 1,
        "denied": ["audit.read", "z.write"],
    }
    assert occ.last_error["message"] == (
        "authority denied: permission_denied: authority policy of user:alice (revision 1)"
        " does not grant audit.read, z.write"
    )


def test_a_capability_the_policy_lacks_is_denied_by_name_then_runs_once_granted(clock):
    """The policy exists but lacks a capability the job asks for: the job is bound to it
    all the same, so the denial is permission_denied with the missing list (not
    policy_unbound); granting it rebinds the job and its next occurrence runs."""
    scheduler.set_policy("user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=9, max_units=9)
    job = scheduler.create_job("job-a", "k", authority=authority_for("alice", "reports.send", "mail.send"))
    assert ref_of(job) == 1  # bound although not covered
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    details = assert_denied(occ, "permission_denied", "SCHEDULER_AUTHORITY_PERMISSION_DENIED")
    assert details == {
        "principal": {"type": "user", "id": "alice"},
        "policy_revision": 1,
        "denied": ["mail.send"],
    }
    assert "does not grant mail.send" in occ.last_error["message"]
    assert "does not grant mail.send" in denied_event(occ).data["message"]
    policy = scheduler.set_policy(
        "user", "alice", capabilities=["mail.send", "reports.send"], window=HOUR, max_runs=9, max_units=9
    )
    assert policy.change.rebound_jobs == 1
    again = claimed(clock, "t2")
    assert scheduler.authorize(again, units=1, owner=OWNER) == "reserved"


def test_a_job_created_before_any_policy_is_denied_by_name_not_unbound(clock):
    """No policy when the job and its first occurrence are made: policy_required while
    there is none; once a policy exists that lacks a capability, the envelopes are bound to
    it and denied permission_denied, also after a change that does not grant it either
    (never granted, so not stale); granting it lets the next occurrence run."""
    scheduler.create_job("job-a", "k", authority=authority_for("carol", "x.run", "y.run"))
    first = claimed(clock, "t1")
    assert scheduler.authorize(first, units=1, owner=OWNER) == "denied"
    assert_denied(first, "policy_required", "SCHEDULER_AUTHORITY_POLICY_REQUIRED")
    waiting, _ = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t2")
    change = scheduler.change_policy(
        "user", "carol", capabilities=["x.run"], window=HOUR, max_runs=9, max_units=9
    )
    assert (change.stale_jobs, change.stale_occurrences) == (1, 1)  # counted: they will be denied
    waiting.refresh_from_db()
    assert ref_of(Job.objects.get(pk="job-a")) == 1 and ref_of(waiting) == 1
    row = scheduler.claim(owner=OWNER, lease=60)
    assert row.pk == waiting.pk
    assert scheduler.authorize(row, units=1, owner=OWNER) == "denied"
    details = assert_denied(row, "permission_denied", "SCHEDULER_AUTHORITY_PERMISSION_DENIED")
    assert (details["principal"], details["denied"]) == ({"type": "user", "id": "carol"}, ["y.run"])
    # A change that still does not grant y.run (a budget change): still permission_denied.
    scheduler.set_policy("user", "carol", capabilities=["x.run"], window=HOUR, max_runs=5, max_units=5)
    assert ref_of(Job.objects.get(pk="job-a")) == 2
    third = claimed(clock, "t3")
    assert scheduler.authorize(third, units=1, owner=OWNER) == "denied"
    details = assert_denied(third, "permission_denied", "SCHEDULER_AUTHORITY_PERMISSION_DENIED")
    assert (details["policy_revision"], details["denied"]) == (2, ["y.run"])
    scheduler.set_policy(
        "user", "carol", capabilities=["x.run", "y.run"], window=HOUR, max_runs=5, max_units=5
    )
    fourth = claimed(clock, "t4")
    assert scheduler.authorize(fourth, units=1, owner=OWNER) == "reserved"


def test_a_revoked_capability_stays_stale_after_further_changes(clock):
    """A job whose grant a change took away keeps its old binding through later changes
    that do not grant it back (policy_stale, naming what is missing), and a change that
    grants it back rebinds it."""
    setup(caps=("reports.send", "mail.send"), requested=("reports.send", "mail.send"))
    for max_runs in (8, 7):
        scheduler.set_policy(
            "user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=max_runs, max_units=9
        )
    assert ref_of(Job.objects.get(pk="job-a")) == 1
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    details = assert_denied(occ, "policy_stale", "SCHEDULER_AUTHORITY_POLICY_STALE")
    assert (details["expected_revision"], details["actual_revision"], details["denied"]) == (
        1,
        3,
        ["mail.send"],
    )
    scheduler.set_policy(
        "user", "alice", capabilities=["mail.send", "reports.send"], window=HOUR, max_runs=9, max_units=9
    )
    assert ref_of(Job.objects.get(pk="job-a")) == 4
    assert scheduler.authorize(claimed(clock, "t2"), units=1, owner=OWNER) == "reserved"


def test_deny_stores_a_bounded_message_and_refuses_a_bad_one(clock):
    from django_durable_scheduler import kernel

    setup()
    occ = claimed(clock)
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as info:
        kernel.deny(occ.pk, owner=OWNER, fence=1, code="SCHEDULER_X", reason="x", message=5)
    assert info.value.details["field"] == "message"
    assert snapshot() == before
    kernel.deny(occ.pk, owner=OWNER, fence=1, code="SCHEDULER_X", reason="x", message="y" * 10_000)
    occ.refresh_from_db()
    assert occ.last_error["message"].startswith("authority denied: x: yyy")
    assert len(occ.last_error["message"]) == 4096 and occ.last_error["message_truncated"] is True
    assert denied_event(occ).data["message"] == occ.last_error["message"]


def test_denied_budget_state_invalid(clock):
    setup()
    first = claimed(clock, "a")
    assert scheduler.authorize(first, units=3, owner=OWNER) == "reserved"
    AuthorityUsage.objects.filter(principal_type="user", principal_id="alice").update(runs=0, units=0)
    scheduler.audit_budgets()
    occ = claimed(clock, "b")
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    details = assert_denied(occ, "budget_state_invalid", "SCHEDULER_AUTHORITY_BUDGET_STATE_INVALID")
    assert details["usage"] == {"runs": 0, "units": 0}
    assert details["reservations"] == {"runs": 1, "units": 3}
    assert details["windowStartedAt"] == "2026-01-05T12:00:00.000Z" and details["policy_revision"] == 1
    assert AuthorityReservation.objects.count() == 1  # nothing charged for the denied one


def test_checks_run_in_the_spec_order(clock):
    """policy_required before policy_unbound before policy_stale before permission_denied."""
    setup()
    occ = claimed(clock)
    unbound = dict(occ.authority)
    unbound["authorizationRefs"] = {
        k: v for k, v in unbound["authorizationRefs"].items() if k != "schedulerPolicyRevision"
    }
    unbound["requestedCapabilities"] = ["nope"]
    Occurrence.objects.filter(pk=occ.pk).update(authority=unbound)
    AuthorityPolicy.objects.update(enabled=False)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "denied"
    assert assert_denied(occ, "policy_required", "SCHEDULER_AUTHORITY_POLICY_REQUIRED")
    # unbound wins over permission denied
    occ2 = claimed(clock, "b")
    AuthorityPolicy.objects.update(enabled=True)
    Occurrence.objects.filter(pk=occ2.pk).update(authority=unbound)
    assert scheduler.authorize(occ2, units=1, owner=OWNER) == "denied"
    assert_denied(occ2, "policy_unbound", "SCHEDULER_AUTHORITY_POLICY_UNBOUND")
    # stale wins over permission denied
    occ3 = claimed(clock, "c")
    Occurrence.objects.filter(pk=occ3.pk).update(authority={**bind(unbound, 9)})
    assert scheduler.authorize(occ3, units=1, owner=OWNER) == "denied"
    assert_denied(occ3, "policy_stale", "SCHEDULER_AUTHORITY_POLICY_STALE")


# --------------------------------------------------------------------------- authorize: budget


def test_budget_exhausted_defers_without_burning_an_attempt_then_runs_next_window(clock):
    setup(max_runs=2)
    for key in ("a", "b"):
        row = claimed(clock, key)
        assert scheduler.authorize(row, units=1, owner=OWNER) == "reserved"
        scheduler.settle(row.pk, owner=OWNER, fence=row.fence, outcome="succeeded")
    occ = claimed(clock, "c")
    assert occ.attempt == 1
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "deferred"
    occ.refresh_from_db()
    assert (occ.status, occ.attempt, occ.lease_owner, occ.settled_at) == ("queued", 0, None, None)
    assert occ.available_at == datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    (event,) = Event.objects.filter(occurrence_id=occ.pk, event_type="authority_deferred")
    assert event.data["until"] == "2026-01-05T13:00:00.000Z"
    assert event.data["details"] == {
        "windowStartedAt": "2026-01-05T12:00:00.000Z",
        "windowEndsAt": "2026-01-05T13:00:00.000Z",
        "usedRuns": 2,
        "usedUnits": 2,
        "requestedUnits": 1,
        "maxRuns": 2,
        "maxUnits": 1000,
    }
    assert not AuthorityReservation.objects.filter(pk=occ.pk).exists()
    assert not Event.objects.filter(event_type="authority_denied").exists()
    # Not due before the window ends.
    clock.set(datetime(2026, 1, 5, 12, 59, 59, 999000, tzinfo=UTC))
    assert scheduler.claim(owner=OWNER, lease=60) is None
    clock.set(datetime(2026, 1, 5, 13, 0, tzinfo=UTC))
    again = scheduler.claim(owner=OWNER, lease=60)
    assert again.pk == occ.pk and again.attempt == 1
    assert scheduler.authorize(again, units=1, owner=OWNER) == "reserved"
    res = AuthorityReservation.objects.get(pk=occ.pk)
    assert res.window_started_at == datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    assert usage_rows() == [(1, 2, 2), (1, 1, 1)]


def test_unit_budget_exhausted_defers(clock):
    setup(max_units=10)
    assert scheduler.authorize(claimed(clock, "a"), units=6, owner=OWNER) == "reserved"
    occ = claimed(clock, "b")
    assert scheduler.authorize(occ, units=lambda o: 5, owner=OWNER) == "deferred"
    (event,) = Event.objects.filter(occurrence_id=occ.pk, event_type="authority_deferred")
    assert (event.data["details"]["usedUnits"], event.data["details"]["requestedUnits"]) == (6, 5)


def test_new_policy_revision_has_its_own_usage(clock):
    setup(max_runs=1)
    first = claimed(clock, "a")
    assert scheduler.authorize(first, units=1, owner=OWNER) == "reserved"
    scheduler.settle(first.pk, owner=OWNER, fence=1, outcome="succeeded")
    assert scheduler.authorize(claimed(clock, "b"), units=1, owner=OWNER) == "deferred"
    scheduler.set_policy("user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=1, max_units=9)
    # The deferred occurrence was rebound to revision 2 and waits for the window's end.
    clock.advance(HOUR)
    occ = scheduler.claim(owner=OWNER, lease=60)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "reserved"
    assert AuthorityReservation.objects.get(pk=occ.pk).policy_revision == 2
    assert sorted(usage_rows()) == [(1, 1, 1), (2, 1, 1)]


# --------------------------------------------------------------------------- retries and settlement


def test_retry_reuses_its_reservation_then_success_settles_it(clock):
    setup()
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=2, owner=OWNER) == "reserved"
    scheduler.settle(occ.pk, owner=OWNER, fence=1, outcome="failed", error="boom", retry_at=clock())
    res = AuthorityReservation.objects.get()
    assert (res.status, res.outcome, res.settled_at) == ("reserved", None, None)
    again = scheduler.claim(owner=OWNER, lease=60)
    assert again.pk == occ.pk and again.attempt == 2 and again.fence == 2
    assert scheduler.authorize(again, units=2, owner=OWNER) == "reused"
    assert usage_rows() == [(1, 1, 2)]  # no second charge
    assert scheduler.reserve_authority(occ.pk, policy_revision=1, units=2).deduplicated is True
    clock.advance(1)
    scheduler.settle(occ.pk, owner=OWNER, fence=2, outcome="succeeded", result={"sent": 3})
    res.refresh_from_db()
    assert (res.status, res.settled_at) == ("succeeded", clock())
    assert res.outcome == {"status": "succeeded", "result": {"sent": 3}}
    (event,) = Event.objects.filter(occurrence_id=occ.pk, event_type="occurrence_succeeded")
    assert (event.data["authorityPolicyRevision"], event.data["authorityUnits"]) == (1, 2)
    assert usage_rows() == [(1, 1, 2)]


def test_retry_after_a_covering_policy_change_reuses(clock):
    setup()
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "reserved"
    scheduler.settle(occ.pk, owner=OWNER, fence=1, outcome="failed", error="x", retry_at=clock())
    change = scheduler.change_policy(
        "user", "alice", capabilities=["reports.send", "x"], window=HOUR, max_runs=5, max_units=5
    )
    assert change.rebound_occurrences == 1
    again = scheduler.claim(owner=OWNER, lease=60)
    assert scheduler.authorize(again, units=1, owner=OWNER) == "reused"
    assert AuthorityReservation.objects.get().policy_revision == 1 and usage_rows() == [(1, 1, 1)]


def test_retry_after_a_narrowing_change_is_denied_and_settles_failed(clock):
    setup(caps=("reports.send", "mail.send"), requested=("reports.send", "mail.send"))
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "reserved"
    scheduler.settle(occ.pk, owner=OWNER, fence=1, outcome="failed", error="x", retry_at=clock())
    scheduler.set_policy("user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=5, max_units=5)
    again = scheduler.claim(owner=OWNER, lease=60)
    assert scheduler.authorize(again, units=1, owner=OWNER) == "denied"
    assert_denied(again, "policy_stale", "SCHEDULER_AUTHORITY_POLICY_STALE")
    res = AuthorityReservation.objects.get()
    assert res.status == "failed" and res.settled_at == clock()
    assert res.outcome["status"] == "dead_letter" and res.outcome["error"]["reason"] == "policy_stale"
    assert denied_event(again).data["authorityPolicyRevision"] == 1


def test_dead_letter_after_max_attempts_settles_failed(clock):
    setup()
    Job.objects.update(max_attempts=2)
    occ, _ = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t")
    assert occ.max_attempts == 2
    for attempt in (1, 2):
        row = scheduler.claim(owner=OWNER, lease=60)
        assert row.attempt == attempt
        assert scheduler.authorize(row, units=1, owner=OWNER) == ("reserved" if attempt == 1 else "reused")
        scheduler.settle(
            row.pk, owner=OWNER, fence=row.fence, outcome="failed", error="boom", retry_at=clock()
        )
    occ.refresh_from_db()
    assert occ.status == "dead_letter"
    res = AuthorityReservation.objects.get()
    assert res.status == "failed" and res.settled_at == clock()
    assert res.outcome == {"status": "dead_letter", "error": {"message": "boom"}}
    assert usage_rows() == [(1, 1, 1)]


def test_not_retryable_failure_settles_failed(clock):
    setup()
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "reserved"
    scheduler.settle(occ.pk, owner=OWNER, fence=1, outcome="failed", error="perm", retryable=False)
    assert AuthorityReservation.objects.get().status == "failed"


def test_lease_expiry_dead_letter_settles_failed(clock):
    setup()
    Job.objects.update(max_attempts=1)
    scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t")
    occ = scheduler.claim(owner=OWNER, lease=10)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "reserved"
    clock.advance(10)
    assert scheduler.dead_letter_expired() == 1
    occ.refresh_from_db()
    assert occ.status == "dead_letter" and occ.last_error["code"] == "SCHEDULER_LEASE_EXPIRED"
    res = AuthorityReservation.objects.get()
    assert (res.status, res.settled_at) == ("failed", clock())
    assert (
        res.outcome["status"] == "dead_letter" and res.outcome["error"]["code"] == "SCHEDULER_LEASE_EXPIRED"
    )


def test_reclaim_after_lease_expiry_reuses(clock):
    setup()
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "reserved"
    clock.advance(61)
    again = scheduler.claim(owner="w2", lease=60)
    assert again.pk == occ.pk and again.fence == 2
    assert scheduler.authorize(again, units=1, owner="w2") == "reused"
    assert usage_rows() == [(1, 1, 1)]


# --------------------------------------------------------------------------- authorize: refusals


def test_authorize_needs_the_lease(clock):
    setup()
    occ = claimed(clock)
    before = snapshot()
    with pytest.raises(scheduler.LeaseLost):
        scheduler.authorize(occ, units=1, owner="someone-else")
    clock.advance(61)
    with pytest.raises(scheduler.LeaseLost):
        scheduler.authorize(occ, units=1, owner=OWNER)
    assert snapshot() == before


def _boom(o):
    raise RuntimeError("no units today")


BAD_UNITS = [
    ("zero", 0),
    ("too-big", 1_000_001),
    ("float", 1.0),
    ("string", "1"),
    ("bool", True),
    ("none", None),
    ("fn-zero", lambda o: 0),
    ("fn-str", lambda o: "2"),
    ("fn-raises", _boom),
]


@pytest.mark.parametrize(("label", "units"), BAD_UNITS, ids=[label for label, _ in BAD_UNITS])
def test_authorize_bad_units(clock, label, units):
    setup()
    occ = claimed(clock)
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.authorize(occ, units=units, owner=OWNER)
    assert info.value.details["field"] == "units" and "units" in str(info.value)
    assert snapshot() == before


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"owner": ""}, "owner"),
        ({"owner": None}, "owner"),
        ({"owner": "a\x00"}, "owner"),
        ({"occurrence": "occ_x"}, "occurrence"),
        ({"occurrence": None}, "occurrence"),
    ],
)
def test_authorize_bad_arguments(clock, kwargs, field):
    setup()
    occ = claimed(clock)
    before = snapshot()
    args = {"occurrence": occ, "units": 1, "owner": OWNER, **kwargs}
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.authorize(args.pop("occurrence"), **args)
    assert info.value.details["field"] == field
    assert snapshot() == before


BAD_RESERVE: list[tuple[str, dict[str, Any]]] = [
    ("occurrence_id", {"occurrence_id": ""}),
    ("occurrence_id", {"occurrence_id": None}),
    ("occurrence_id", {"occurrence_id": "x" * 257}),
    ("occurrence_id", {"occurrence_id": "a\x1fb"}),
    ("policy_revision", {"policy_revision": 0}),
    ("policy_revision", {"policy_revision": -1}),
    ("policy_revision", {"policy_revision": "1"}),
    ("policy_revision", {"policy_revision": True}),
    ("policy_revision", {"policy_revision": 1.0}),
    ("policy_revision", {"policy_revision": None}),
    ("units", {"units": 0}),
    ("units", {"units": 1_000_001}),
    ("units", {"units": 2.5}),
    ("units", {"units": "3"}),
    ("units", {"units": False}),
]


@pytest.mark.parametrize(
    ("field", "kwargs"), BAD_RESERVE, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_RESERVE)]
)
def test_reserve_bad_input(clock, field, kwargs):
    setup()
    occ = claimed(clock)
    before = snapshot()
    args = {"occurrence_id": occ.pk, "policy_revision": 1, "units": 1, **kwargs}
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.reserve_authority(args.pop("occurrence_id"), **args)
    assert info.value.details["field"] == field and field in str(info.value)
    assert snapshot() == before


def test_get_reservation_bad_input(db):
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.get_reservation("")
    assert info.value.details["field"] == "occurrence_id"
    assert scheduler.get_reservation("occ_none") is None


def test_reserve_units_at_the_limit(clock):
    setup(max_units=1_000_000)
    occ = claimed(clock)
    assert scheduler.reserve_authority(occ.pk, policy_revision=1, units=1_000_000).units == 1_000_000
    assert usage_rows() == [(1, 1, 1_000_000)]


# --------------------------------------------------------------------------- race

RACERS = 4
QUEUED = 100
BUDGET = 25


def _race(mode: str, settings) -> list[list[str]]:
    policy = queue_race(settings, QUEUED, BUDGET)
    procs = start_racers(RACERS, mode, policy.revision)
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outputs.append([line.split() for line in out.splitlines() if line.strip()])
    return outputs


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_racing_reservations_never_overspend(settings):
    outputs = _race("reserve", settings)
    lines = [line for out in outputs for line in out]
    results = Counter(kind for kind, _ in lines)
    assert results == {"reserved": BUDGET, "exhausted": QUEUED - BUDGET}, results
    assert len({pk for _, pk in lines}) == QUEUED  # each occurrence decided once
    assert AuthorityReservation.objects.count() == BUDGET
    assert AuthorityReservation.objects.filter(status="reserved").count() == BUDGET
    (usage,) = AuthorityUsage.objects.all()
    assert (usage.runs, usage.units) == (BUDGET, BUDGET)
    reserved = {pk for kind, pk in lines if kind == "reserved"}
    assert set(AuthorityReservation.objects.values_list("pk", flat=True)) == reserved
    assert Occurrence.objects.filter(status="running").count() == BUDGET
    assert Occurrence.objects.filter(status="queued", attempt=0).count() == QUEUED - BUDGET
    print("\n[budget race] per-process reservations:", [sum(k == "reserved" for k, _ in o) for o in outputs])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["authorize", "claim_authorized"])
def test_racing_workers_authorize_within_budget(settings, mode):
    outputs = _race(mode, settings)
    lines = [line for out in outputs for line in out]
    results = Counter(kind for kind, _ in lines)
    assert results == {"reserved": BUDGET, "deferred": QUEUED - BUDGET}, results
    assert Occurrence.objects.filter(status="succeeded").count() == BUDGET
    assert Occurrence.objects.filter(status="queued", attempt=0).count() == QUEUED - BUDGET
    assert AuthorityReservation.objects.filter(status="succeeded").count() == BUDGET
    assert AuthorityReservation.objects.count() == BUDGET
    (usage,) = AuthorityUsage.objects.all()
    assert usage.runs == BUDGET
    assert Event.objects.filter(event_type="authority_deferred").count() == QUEUED - BUDGET
    assert not Event.objects.filter(event_type="authority_denied").exists()


# --------------------------------------------------------------------------- the worker


def _burst() -> int:
    # One at a time: occurrences are authorized in claim order.
    return Worker(worker_id="w-authz", concurrency=1, poll_interval=0.05, burst=True).run()


@pytest.mark.django_db(transaction=True)
def test_worker_denies_without_running_the_handler(clock, registered):
    calls = registered("authz.none")
    scheduler.create_job("j", "authz.none", authority=authority_for("nobody", "x.run"))
    occ, _ = scheduler.enqueue("j", scheduled_for=clock(), trigger_key="t")
    assert _burst() == 0
    occ.refresh_from_db()
    assert occ.status == "dead_letter" and occ.last_error["reason"] == "policy_required"
    assert calls == []


@pytest.mark.django_db(transaction=True)
def test_worker_names_the_missing_capability_then_runs_once_granted(clock, registered, caplog):
    calls = registered("authz.caps")
    scheduler.set_policy("user", "dana", capabilities=["x.run"], window=HOUR, max_runs=9, max_units=9)
    scheduler.create_job("j", "authz.caps", authority=authority_for("dana", "x.run", "y.write"))
    occ, _ = scheduler.enqueue("j", scheduled_for=clock(), trigger_key="t1")
    with caplog.at_level("INFO", logger="django_durable_scheduler"):
        assert _burst() == 0
    occ.refresh_from_db()
    assert occ.status == "dead_letter" and calls == []
    assert (occ.last_error["reason"], occ.last_error["details"]["denied"]) == (
        "permission_denied",
        ["y.write"],
    )
    event = denied_event(occ)
    assert (event.data["reason"], event.data["details"]["denied"]) == ("permission_denied", ["y.write"])
    (line,) = [r.getMessage() for r in caplog.records if occ.pk in r.getMessage()]
    assert "permission_denied" in line and "user:dana" in line and "y.write" in line, line
    scheduler.set_policy(
        "user", "dana", capabilities=["x.run", "y.write"], window=HOUR, max_runs=9, max_units=9
    )
    second, _ = scheduler.enqueue("j", scheduled_for=clock(), trigger_key="t2")
    assert _burst() == 0
    second.refresh_from_db()
    assert second.status == "succeeded" and calls == [second.pk]


@pytest.mark.django_db(transaction=True)
def test_worker_defers_over_budget_and_charges_registered_units(clock, registered):
    calls = registered("authz.cost", units=lambda occ: occ.payload["cost"])
    scheduler.ensure_policy(authority_for("payer", "x.run"), window=HOUR, max_runs=2, max_units=1000)
    scheduler.create_job("j", "authz.cost", authority=authority_for("payer", "x.run"))
    for n in range(3):
        scheduled = clock() - timedelta(seconds=3 - n)  # claimed in this order
        scheduler.enqueue("j", scheduled_for=scheduled, trigger_key=f"t{n}", payload={"cost": 10 + n})
    assert _burst() == 0
    assert len(calls) == 2
    assert Occurrence.objects.filter(status="succeeded").count() == 2
    (deferred,) = Occurrence.objects.filter(status="queued")
    assert (
        deferred.trigger_key == "t2"
        and deferred.attempt == 0
        and deferred.available_at == datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    )
    assert deferred.pk not in calls
    assert sorted(AuthorityReservation.objects.values_list("units", "status")) == [
        (10, "succeeded"),
        (11, "succeeded"),
    ]
    assert usage_rows() == [(1, 2, 21)]


def test_cancelling_a_retry_settles_its_reservation_failed(clock):
    setup()
    occ = claimed(clock)
    assert scheduler.authorize(occ, units=1, owner=OWNER) == "reserved"
    scheduler.settle(
        occ.pk, owner=OWNER, fence=1, outcome="failed", error="x", retry_at=clock() + timedelta(hours=1)
    )
    scheduler.cancel(occ.pk, reason="no longer needed")
    res = AuthorityReservation.objects.get()
    assert (res.status, res.settled_at) == ("failed", clock())
    assert res.outcome == {"status": "cancelled", "reason": "no longer needed"}
    assert usage_rows() == [(1, 1, 1)]  # the run stays counted in its window


def test_a_lease_that_runs_out_inside_the_claim_is_lost_not_an_error(clock, monkeypatch):
    """A claim transaction that outlives its lease, on a spent budget: the deferral finds the
    lease expired and the occurrence is turned away as lease-lost (it stays running until
    it is reclaimed), instead of the LeaseLost escaping the claim and the worker."""
    from django_durable_scheduler.kernel import claiming
    from django_durable_scheduler.kernel.authority import reservations

    setup(max_runs=1)
    first = claimed(clock, "a")
    assert scheduler.authorize(first, units=1, owner=OWNER) == "reserved"
    scheduler.settle(first.pk, owner=OWNER, fence=first.fence, outcome="succeeded")
    occ, _ = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="b")
    charge = reservations.budgets.charge

    def charge_slowly(*args: Any, **kwargs: Any) -> Any:
        clock.advance(61)  # the transaction outlives the 60-second lease
        return charge(*args, **kwargs)

    monkeypatch.setattr(reservations.budgets, "charge", charge_slowly)
    result = claiming.claim_authorized(owner=OWNER, lease=60, limit=5)
    assert [o.pk for o in result.claimed] == [occ.pk] and result.runnable == []
    assert [(o.pk, verdict.verdict) for o, verdict in result.refused] == [(occ.pk, "lease_lost")]
    occ.refresh_from_db()
    assert (occ.status, occ.lease_owner, occ.attempt) == ("running", OWNER, 1)
    assert not Event.objects.filter(occurrence_id=occ.pk, event_type="authority_deferred").exists()
