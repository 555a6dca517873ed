"""Chains in the kernel: follow-ups written with their predecessor's terminal transition,
exactly once, with their own job's principal, the predecessor's outcome, and their cause in the
audit trail; job-level chains; and bad chains refused with nothing written."""

from __future__ import annotations

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.exceptions import InvalidArgument, NotFound
from django_durable_scheduler.models import Event, Job, Occurrence, OccurrenceStatus
from django_durable_scheduler.worker.runs import Run

from ..conftest import CLOCK_START, authority_for, snapshot

pytestmark = pytest.mark.django_db
OWNER = "w-chain"


@pytest.fixture
def jobs(clock):
    kernel.create_job("export", "reports.export", authority=authority_for("alice", "reports.export"))
    kernel.create_job(
        "report", "reports.send", authority=authority_for("bob", "reports.send"), payload={"to": "ops"}
    )
    kernel.create_job("alert", "ops.page", authority=authority_for("carol", "ops.page"), max_attempts=1)


def _run(job_id: str | None = None, *, outcome: str = "succeeded", **settle):
    rows = kernel.claim_batch(owner=OWNER, lease=60, limit=1, sweep_expired=False)
    (row,) = rows
    if job_id is not None:
        assert row.job_id == job_id
    return kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome=outcome, **settle)


def test_a_follow_up_is_enqueued_with_the_success_and_sees_the_result(jobs, clock):
    first, _ = kernel.enqueue(
        "export", scheduled_for=CLOCK_START, trigger_key="t1", then=["report"], on_dead_letter="alert"
    )
    assert first.follow_ups == {"then": [{"job_id": "report"}], "on_dead_letter": [{"job_id": "alert"}]}
    settled = _run("export", result={"rows": 7})
    assert settled.status == OccurrenceStatus.SUCCEEDED
    (follow,) = Occurrence.objects.filter(caused_by=first.pk)
    assert follow.job_id == "report" and follow.status == OccurrenceStatus.QUEUED
    assert follow.payload == {"to": "ops"}  # the follow-up job's own payload
    assert follow.authority["principal"]["id"] == "bob"
    assert follow.cause == {
        "occurrence_id": first.pk,
        "job_id": "export",
        "status": "succeeded",
        "result": {"rows": 7},
    }
    assert follow.trigger_key == f"after:{first.pk}:then:0"
    (event,) = Event.objects.filter(occurrence_id=follow.pk, event_type="occurrence_enqueued")
    assert event.data["causedBy"] == first.pk
    (enqueued,) = Event.objects.filter(occurrence_id=first.pk, event_type="occurrence_enqueued")
    assert enqueued.data["followUps"] == first.follow_ups
    # The follow-up runs like any occurrence; it names nothing further.
    clock.advance(1)
    _run("report")
    assert Occurrence.objects.count() == 2


def test_a_claimed_follow_up_hands_its_cause_to_the_handler_without_reading_its_row_again(
    jobs, clock, django_assert_num_queries
):
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", then=["report"])
    _run("export", result={"rows": 7})
    clock.advance(1)
    (row,) = kernel.claim_batch(owner=OWNER, lease=60, limit=1, sweep_expired=False)
    # The worker builds each run's context from the claimed row: a field the claim did not
    # read would cost one more query per run.
    with django_assert_num_queries(0):
        run = Run.of(row, owner=OWNER, using=None, default_timeout=None)
    assert run.context.predecessor == {
        "occurrence_id": first.pk,
        "job_id": "export",
        "status": "succeeded",
        "result": {"rows": 7},
    }


def test_a_dead_letter_enqueues_the_on_dead_letter_follow_up_only(jobs, clock):
    first, _ = kernel.enqueue(
        "export", scheduled_for=CLOCK_START, trigger_key="t1", then="report", on_dead_letter=["alert"]
    )
    _run("export", outcome="failed", error="disk full", retryable=False)
    (follow,) = Occurrence.objects.filter(caused_by=first.pk)
    assert follow.job_id == "alert"
    assert follow.cause["status"] == "dead_letter" and follow.cause["error"]["message"] == "disk full"


def test_a_retry_or_a_cancel_enqueues_nothing(jobs, clock):
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", then="report")
    _run("export", outcome="failed", error="flaky")  # retry_wait: not terminal
    assert not Occurrence.objects.filter(caused_by=first.pk).exists()
    kernel.cancel(first.pk, reason="no longer needed")
    assert not Occurrence.objects.filter(caused_by=first.pk).exists()


def test_nested_steps_and_payloads_given_at_enqueue(jobs, clock):
    first, _ = kernel.enqueue(
        "export",
        scheduled_for=CLOCK_START,
        trigger_key="t1",
        then=[{"job_id": "report", "payload": {"to": "cfo"}, "then": ["alert"]}],
    )
    _run("export", result=1)
    (second,) = Occurrence.objects.filter(caused_by=first.pk)
    assert second.payload == {"to": "cfo"} and second.follow_ups == {"then": [{"job_id": "alert"}]}
    clock.advance(1)
    _run("report", result=2)
    (third,) = Occurrence.objects.filter(caused_by=second.pk)
    assert third.job_id == "alert" and third.cause["result"] == 2


def test_a_job_declares_follow_ups_for_every_occurrence(jobs, clock):
    job = scheduler.get_job("export")
    kernel.update_job("export", expected_revision=job.revision, then=["report"])
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", then=["alert"])
    assert first.follow_ups == {"then": [{"job_id": "report"}, {"job_id": "alert"}]}
    _run("export")
    assert sorted(Occurrence.objects.filter(caused_by=first.pk).values_list("job_id", flat=True)) == [
        "alert",
        "report",
    ]


def test_a_disabled_follow_up_job_gets_its_occurrence_which_waits(jobs, clock):
    kernel.update_job("report", expected_revision=1, enabled=False)
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", then="report")
    _run("export")
    (follow,) = Occurrence.objects.filter(caused_by=first.pk)
    assert follow.status == OccurrenceStatus.QUEUED
    clock.advance(1)
    assert kernel.claim_batch(owner=OWNER, lease=60, sweep_expired=False) == []
    kernel.update_job("report", expected_revision=2, enabled=True)
    assert [row.pk for row in kernel.claim_batch(owner=OWNER, lease=60, sweep_expired=False)] == [follow.pk]


def test_a_denied_predecessor_is_a_dead_letter_for_its_chain(jobs, clock):
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", on_dead_letter="alert")
    (row,) = kernel.claim_batch(owner=OWNER, lease=60, sweep_expired=False)
    kernel.deny(
        row.pk, owner=OWNER, fence=row.fence, code="SCHEDULER_AUTHORITY_DENIED", reason="permission_denied"
    )
    (follow,) = Occurrence.objects.filter(caused_by=first.pk)
    assert follow.job_id == "alert" and follow.cause["error"]["reason"] == "permission_denied"


def test_an_expired_final_attempt_is_a_dead_letter_for_its_chain(jobs, clock):
    kernel.update_job("export", expected_revision=1, max_attempts=1)
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", on_dead_letter="alert")
    kernel.claim_batch(owner=OWNER, lease=5, sweep_expired=False)
    clock.advance(10)
    assert kernel.dead_letter_expired() == 1
    (follow,) = Occurrence.objects.filter(caused_by=first.pk)
    assert follow.cause["error"]["code"] == "SCHEDULER_LEASE_EXPIRED"


@pytest.mark.parametrize(
    ("then", "field"),
    [
        (5, "then"),
        ([{"payload": 1}], "then[0].job_id"),
        ([{"job_id": "report", "when": 1}], "then[0].when"),
        (["report", ""], "then[1]"),
        ([{"job_id": "report", "payload": {1, 2}}], "then[0].payload"),
    ],
)
def test_a_bad_chain_is_refused_naming_the_field(jobs, clock, then, field):
    before = snapshot()
    with pytest.raises(InvalidArgument) as raised:
        kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", then=then)
    assert raised.value.field == field
    assert snapshot() == before


def test_an_unknown_follow_up_job_is_refused_with_nothing_written(jobs, clock):
    before = snapshot()
    with pytest.raises(NotFound, match="'nope'"):
        kernel.enqueue(
            "export", scheduled_for=CLOCK_START, trigger_key="t1", then=[{"job_id": "report", "then": "nope"}]
        )
    with pytest.raises(NotFound, match="'nope'"):
        kernel.update_job("export", expected_revision=1, on_dead_letter=["nope"])
    assert snapshot() == before


def test_a_cycle_of_job_follow_ups_is_refused(jobs, clock):
    kernel.update_job("export", expected_revision=1, then=["report"])
    kernel.update_job("report", expected_revision=1, on_dead_letter=["alert"])
    before = snapshot()
    with pytest.raises(InvalidArgument, match="alert -> export -> report -> alert") as raised:
        kernel.update_job("alert", expected_revision=1, then=["export"])
    assert raised.value.field == "then"
    with pytest.raises(InvalidArgument, match="cycle"):
        kernel.create_job("self", "reports.send", then=["self"])
    assert snapshot() == before
    assert Job.objects.get(pk="alert").then is None


def test_the_retry_of_a_dead_letter_carries_its_chain_and_cause(jobs, clock):
    first, _ = kernel.enqueue(
        "export", scheduled_for=CLOCK_START, trigger_key="t1", then="report", on_dead_letter="alert"
    )
    _run("export", outcome="failed", error="no", retryable=False)
    (alert,) = Occurrence.objects.filter(caused_by=first.pk)
    assert alert.job_id == "alert"
    kernel.cancel(alert.pk)
    retried, _ = kernel.retry_dead_letter(first.pk)
    assert retried.follow_ups == first.follow_ups and retried.batch_id is None
    clock.advance(1)
    _run("export", result="second time")
    (follow,) = Occurrence.objects.filter(caused_by=retried.pk)
    assert follow.job_id == "report" and follow.cause["result"] == "second time"


def test_a_cycle_through_on_dead_letter_is_refused_on_that_field(jobs, clock):
    kernel.update_job("report", expected_revision=1, then=["export"])
    with pytest.raises(InvalidArgument, match="export -> report -> export") as raised:
        kernel.update_job("export", expected_revision=1, on_dead_letter=["report"])
    assert raised.value.field == "on_dead_letter"
