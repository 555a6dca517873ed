"""The values that cross the API are typed and still what they were: an enqueue's
``Enqueued`` is a tuple, the outcome statuses and verdicts are their strings, the envelope and
the causes a handler reads are the dicts the kernel stores, with exactly the keys their types
name."""

from __future__ import annotations

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Occurrence, OccurrenceStatus
from django_durable_scheduler.rules.authority import normalize_authority
from django_durable_scheduler.worker.context import ExecutionContext

from ..conftest import AUTHORITY, CLOCK_START, authority_for, snapshot

pytestmark = pytest.mark.django_db(transaction=True)
OWNER = "w-typed"


def _keys(typed: type) -> tuple[set[str], set[str]]:
    """A TypedDict's (required, optional) keys."""
    return set(typed.__required_keys__), set(typed.__optional_keys__)  # type: ignore[attr-defined]


def test_every_enqueue_returns_enqueued_which_unpacks_as_before(job, clock):
    result = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t1")
    occurrence, deduplicated = result
    assert isinstance(result, scheduler.Enqueued) and isinstance(result, tuple)
    assert (result.occurrence, result.deduplicated) == (occurrence, deduplicated) == (occurrence, False)
    assert scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t1") == (occurrence, True)
    many = scheduler.enqueue_many(
        "job-a", [{"scheduled_for": clock(), "trigger_key": k} for k in ("t1", "t2")]
    )
    assert [type(item) for item in many] == [scheduler.Enqueued] * 2
    assert [item.deduplicated for item in many] == [True, False]
    once = scheduler.enqueue_once_per_trigger("job-a", scheduled_for=clock(), trigger_key="t1")
    assert isinstance(once, scheduler.Enqueued) and once.deduplicated


@pytest.mark.parametrize("outcome", ["succeeded", scheduler.OutcomeStatus.SUCCEEDED])
def test_settle_takes_the_outcome_as_a_string_or_a_member(job, clock, outcome):
    scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t1")
    held = scheduler.claim(owner=OWNER, lease=10)
    done = scheduler.settle(held.pk, owner=OWNER, fence=held.fence, outcome=outcome)
    assert done.status == OccurrenceStatus.SUCCEEDED == scheduler.OutcomeStatus.SUCCEEDED


@pytest.mark.parametrize("outcome", ["SUCCEEDED", "dead_letter", None, ["failed"], 1])
def test_any_other_outcome_is_refused_naming_the_field_and_writes_nothing(job, clock, outcome):
    scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t1")
    held = scheduler.claim(owner=OWNER, lease=10)
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.settle(held.pk, owner=OWNER, fence=held.fence, outcome=outcome)
    assert info.value.details["field"] == "outcome"
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.settle_many(
            [{"occurrence_id": held.pk, "fence": held.fence, "outcome": outcome}], owner=OWNER
        )
    assert info.value.details["field"] == "items[0].outcome"
    assert snapshot() == before


def test_authorize_gives_a_verdict_which_is_its_string(job, clock):
    scheduler.ensure_policy(AUTHORITY, max_runs=10, max_units=10)  # a budget: charged, reserved
    for key in ("t1", "t2"):
        scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key=key)
    held = scheduler.claim(owner=OWNER, lease=10)
    verdict = scheduler.authorize(held, owner=OWNER)
    assert verdict is scheduler.Verdict.RESERVED and verdict == "reserved"
    other = scheduler.claim(owner=OWNER, lease=10)
    assert scheduler.authorize_many([(other, 1)], owner=OWNER) == [scheduler.Verdict.RESERVED]
    assert {str(v) for v in scheduler.Verdict} == {
        "reserved",
        "reused",
        "authorized",
        "denied",
        "deferred",
        "lease_lost",
    }


def test_the_stored_envelope_has_exactly_the_keys_of_its_types(job):
    stored = job.authority
    required, optional = _keys(scheduler.Envelope)
    assert set(stored) == required and not optional
    assert set(stored["principal"]) == _keys(scheduler.EnvelopePrincipal)[0]
    required, optional = _keys(scheduler.AuthorizationRefs)
    assert optional == {"schedulerPolicyRevision"}
    unbound = normalize_authority(authority_for("nobody", "x"))
    assert set(unbound["authorizationRefs"]) == required
    # Bound: the policy revision is the one optional key, there once a policy exists.
    scheduler.ensure_policy(AUTHORITY)
    bound = scheduler.bind_to_current_policy(AUTHORITY)
    assert set(bound["authorizationRefs"]) == required | optional
    assert bound["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:1"


def _context(cause) -> ExecutionContext:
    return ExecutionContext(
        occurrence_id="o",
        job_id="j",
        kind="k",
        attempt=1,
        max_attempts=1,
        fence=1,
        scheduled_for=CLOCK_START,
        payload=None,
        authority=normalize_authority(AUTHORITY),
        cause=cause,
    )


def test_a_follow_up_reads_its_predecessor_with_the_keys_of_predecessor(clock):
    kernel.create_job("export", "reports.export", authority=authority_for("alice", "reports.export"))
    kernel.create_job("report", "reports.send", authority=authority_for("bob", "reports.send"))
    kernel.enqueue("export", scheduled_for=clock(), trigger_key="t1", then="report")
    held = kernel.claim(owner=OWNER, lease=10)
    kernel.settle(held.pk, owner=OWNER, fence=held.fence, outcome="succeeded", result=7)
    cause = Occurrence.objects.get(job_id="report").cause
    required, optional = _keys(scheduler.Predecessor)
    assert set(cause) == required | {"result"} and optional == {"result", "error"}
    assert cause["result"] == 7
    ctx = _context(cause)
    assert ctx.predecessor == cause and ctx.batch is None


def test_a_batch_callback_reads_the_keys_of_batch_summary(clock):
    kernel.create_job("export", "reports.export", authority=authority_for("alice", "reports.export"))
    kernel.create_job("report", "reports.send", authority=authority_for("bob", "reports.send"))
    kernel.enqueue_batch("export", [{"scheduled_for": clock(), "trigger_key": "k"}], callback="report")
    held = kernel.claim(owner=OWNER, lease=10)
    kernel.settle(held.pk, owner=OWNER, fence=held.fence, outcome="succeeded")
    cause = Occurrence.objects.get(job_id="report").cause
    assert set(cause) == _keys(scheduler.BatchSummary)[0]
    ctx = _context(cause)
    assert ctx.batch == cause and ctx.predecessor is None
