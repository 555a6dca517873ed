"""The batch forms of settle and authorize that the worker uses: one transaction for many
occurrences, each item judged on its own, and bad input refused before anything is written."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import AuthorityReservation, AuthorityUsage, Event, Occurrence

from ..conftest import authority_for, snapshot

pytestmark = pytest.mark.django_db
OWNER = "w-batch"


def claimed_batch(clock, n, *, job_id="job-b", principal="bob", max_attempts=3):
    scheduler.create_job(
        job_id, "reports.send", authority=authority_for(principal, "reports.send"), max_attempts=max_attempts
    )
    for i in range(n):
        scheduler.enqueue(job_id, scheduled_for=clock() - timedelta(seconds=n - i), trigger_key=f"k{i}")
    rows = scheduler.claim_batch(owner=OWNER, lease=60, limit=n)
    assert len(rows) == n
    return rows


def test_settle_many_mixed_outcomes_in_one_go(clock):
    rows = claimed_batch(clock, 4)
    items = [
        {"occurrence_id": rows[0].pk, "fence": 1, "outcome": "succeeded", "result": {"n": 0}},
        {"occurrence_id": rows[1].pk, "fence": 1, "outcome": "succeeded"},
        {"occurrence_id": rows[2].pk, "fence": 1, "outcome": "failed", "error": "flaky"},
        {"occurrence_id": rows[3].pk, "fence": 1, "outcome": "failed", "error": "no", "retryable": False},
    ]
    out = scheduler.settle_many(items, owner=OWNER)
    assert [o.status for o in out] == ["succeeded", "succeeded", "retry_wait", "dead_letter"]
    stored = {o.pk: o for o in Occurrence.objects.all()}
    assert stored[rows[0].pk].result == {"n": 0} and stored[rows[1].pk].result is None
    assert stored[rows[2].pk].available_at > clock() and stored[rows[2].pk].last_error == {"message": "flaky"}
    assert stored[rows[3].pk].settled_at == clock() and stored[rows[3].pk].lease_owner is None
    kinds = Event.objects.filter(owner_id=OWNER).exclude(event_type="occurrence_claimed")
    assert sorted(kinds.values_list("event_type", flat=True)) == [
        "occurrence_dead_lettered",
        "occurrence_retry_scheduled",
        "occurrence_succeeded",
        "occurrence_succeeded",
    ]


def test_settle_many_refuses_items_whose_lease_is_gone_and_settles_the_rest(clock):
    rows = claimed_batch(clock, 3)
    scheduler.settle(rows[1].pk, owner=OWNER, fence=1, outcome="succeeded")
    out = scheduler.settle_many(
        [
            {"occurrence_id": rows[0].pk, "fence": 1, "outcome": "succeeded"},
            {"occurrence_id": rows[1].pk, "fence": 1, "outcome": "succeeded"},  # settled already
            {"occurrence_id": rows[2].pk, "fence": 2, "outcome": "succeeded"},  # wrong fence
        ],
        owner=OWNER,
    )
    assert out[0].status == "succeeded"
    assert isinstance(out[1], scheduler.LeaseLost) and out[1].details["reason"] == "not_running"
    assert isinstance(out[2], scheduler.LeaseLost) and out[2].details["reason"] == "wrong_fence"
    assert Occurrence.objects.get(pk=rows[2].pk).status == "running"
    assert Event.objects.filter(event_type="occurrence_succeeded").count() == 2


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ("nope", "items"),
        ([1], "items[0]"),
        ([{"occurrence_id": "x", "fence": 1, "outcome": "succeeded", "extra": 1}], "items[0].extra"),
        ([{"fence": 1, "outcome": "succeeded"}], "items[0].occurrence_id"),
        ([{"occurrence_id": "x", "fence": 0, "outcome": "succeeded"}], "items[0].fence"),
        ([{"occurrence_id": "x", "fence": 1, "outcome": "maybe"}], "items[0].outcome"),
        ([{"occurrence_id": "x", "fence": 1, "outcome": "succeeded", "result": {1, 2}}], "items[0].result"),
        ([{"occurrence_id": "x", "fence": 1, "outcome": "failed", "error": 5}], "items[0].error"),
        ([{"occurrence_id": "x", "fence": 1, "outcome": "failed", "retry_at": "soon"}], "items[0].retry_at"),
    ],
)
def test_settle_many_bad_input_names_the_item_and_writes_nothing(clock, items, field):
    rows = claimed_batch(clock, 1)
    good = {"occurrence_id": rows[0].pk, "fence": 1, "outcome": "succeeded"}
    before = snapshot()
    payload = items if isinstance(items, str) else [good, *items]
    if not isinstance(items, str):
        field = field.replace("items[0]", "items[1]")
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.settle_many(payload, owner=OWNER)
    assert info.value.details["field"] == field
    assert snapshot() == before


def test_settle_many_refuses_an_occurrence_twice(clock):
    rows = claimed_batch(clock, 1)
    item = {"occurrence_id": rows[0].pk, "fence": 1, "outcome": "succeeded"}
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.settle_many([item, dict(item)], owner=OWNER)
    assert info.value.details["field"] == "items[1].occurrence_id"
    assert Occurrence.objects.get().status == "running"


def test_authorize_many_charges_until_the_budget_is_spent_then_defers(clock):
    scheduler.set_policy("user", "bob", capabilities=["reports.send"], window=3600, max_runs=3, max_units=100)
    rows = claimed_batch(clock, 5)
    verdicts = scheduler.authorize_many([(row, 1) for row in rows], owner=OWNER)
    assert verdicts == ["reserved", "reserved", "reserved", "deferred", "deferred"]
    assert sorted(AuthorityReservation.objects.values_list("occurrence_id", flat=True)) == sorted(
        row.pk for row in rows[:3]
    )
    assert list(AuthorityUsage.objects.values_list("runs", "units")) == [(3, 3)]
    deferred = Occurrence.objects.filter(pk__in=[rows[3].pk, rows[4].pk])
    assert {(o.status, o.attempt) for o in deferred} == {("queued", 0)}
    assert Event.objects.filter(event_type="authority_deferred").count() == 2


def test_authorize_many_charges_several_principals_in_one_batch(clock):
    """Three principals in one batch, two with usage rows from an earlier batch (updated in
    place), one whose usage row was tampered with (all of its items refused with
    budget_state_invalid, the others charged as usual, each against its own budget)."""
    for name, runs in (("ann", 10), ("bea", 2), ("cid", 10)):
        scheduler.set_policy(
            "user", name, capabilities=["reports.send"], window=3600, max_runs=runs, max_units=100
        )
        scheduler.create_job(f"job-{name}", "reports.send", authority=authority_for(name, "reports.send"))

    def claim(tag):
        for name in ("ann", "bea", "cid"):
            for i in range(2):
                scheduler.enqueue(f"job-{name}", scheduled_for=clock(), trigger_key=f"{tag}{i}")
        rows = scheduler.claim_batch(owner=OWNER, lease=60, limit=6)
        assert len(rows) == 6
        return rows

    first = claim("a")
    assert scheduler.authorize_many([(row, 1) for row in first], owner=OWNER) == ["reserved"] * 6
    usage = dict(AuthorityUsage.objects.values_list("principal_id", "runs"))
    assert usage == {"ann": 2, "bea": 2, "cid": 2}
    AuthorityUsage.objects.filter(principal_id="cid").update(runs=5)  # tampered
    audited = {check.principal_id: check.matches for check in scheduler.audit_budgets()}
    assert audited == {"ann": True, "bea": True, "cid": False}

    second = claim("b")
    by_principal = {}
    verdicts = scheduler.authorize_many([(row, 2) for row in second], owner=OWNER)
    for row, verdict in zip(second, verdicts, strict=True):
        by_principal.setdefault(row.authority["principal"]["id"], []).append(verdict)
    assert by_principal == {
        "ann": ["reserved", "reserved"],
        "bea": ["deferred", "deferred"],  # max_runs 2, spent by the first batch
        "cid": ["denied", "denied"],
    }
    assert sorted(AuthorityUsage.objects.values_list("principal_id", "runs", "units")) == [
        ("ann", 4, 6),
        ("bea", 2, 2),
        ("cid", 5, 2),
    ]
    reservations = AuthorityReservation.objects.filter(occurrence_id__in=[row.pk for row in second])
    assert sorted(reservations.values_list("principal_id", "units")) == [("ann", 2), ("ann", 2)]
    denied = Occurrence.objects.filter(authority__principal__id="cid", status="dead_letter")
    assert {o.last_error["reason"] for o in denied} == {"budget_state_invalid"} and denied.count() == 2


def test_authorize_many_denies_per_item(clock):
    scheduler.set_policy("user", "bob", capabilities=["reports.send"], window=3600, max_runs=10, max_units=10)
    ok = claimed_batch(clock, 1)
    scheduler.create_job("job-c", "reports.send", authority=authority_for("carol", "reports.send"))
    scheduler.enqueue("job-c", scheduled_for=clock(), trigger_key="c")
    (no_policy,) = scheduler.claim_batch(owner=OWNER, lease=60, limit=1)
    verdicts = scheduler.authorize_many([(ok[0], 1), (no_policy, 1)], owner=OWNER)
    assert verdicts == ["reserved", "denied"]
    denied = Occurrence.objects.get(pk=no_policy.pk)
    assert denied.status == "dead_letter" and denied.last_error["reason"] == "policy_required"


def test_authorize_many_lease_lost_item_writes_nothing_for_it(clock):
    scheduler.set_policy("user", "bob", capabilities=["reports.send"], window=3600, max_runs=10, max_units=10)
    rows = claimed_batch(clock, 2)
    scheduler.release(rows[1].pk, owner=OWNER, fence=1)
    verdicts = scheduler.authorize_many([(rows[0], 1), (rows[1], 1)], owner=OWNER)
    assert verdicts == ["reserved", "lease_lost"]
    assert list(AuthorityReservation.objects.values_list("occurrence_id", flat=True)) == [rows[0].pk]


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ("nope", "items"),
        ([("x", 1)], "items[0][0]"),
        ([1], "items[0]"),
        (["pair"], "items[0]"),
    ],
)
def test_authorize_many_bad_input(clock, items, field):
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.authorize_many(items, owner=OWNER)
    assert info.value.details["field"] == field


def test_authorize_many_bad_units_and_duplicates(clock):
    scheduler.set_policy("user", "bob", capabilities=["reports.send"], window=3600, max_runs=10, max_units=10)
    rows = claimed_batch(clock, 1)
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.authorize_many([(rows[0], 0)], owner=OWNER)
    assert info.value.details["field"] == "items[0][1]"
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.authorize_many([(rows[0], 1), (rows[0], 1)], owner=OWNER)
    assert info.value.details["field"] == "items"
    assert snapshot() == before
