"""Kernel behaviour: enqueue, claim, lease, settle, cancel, history."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Job, Occurrence, OccurrenceStatus

from ..conftest import AUTHORITY, authority_for

pytestmark = pytest.mark.django_db


def enqueue(clock, key="t1", **kw):
    kw.setdefault("scheduled_for", clock())
    return scheduler.enqueue("job-a", trigger_key=key, **kw)


def test_create_job_normalizes_and_logs(job):
    assert job.revision == 1
    assert job.authority["authorizationRefs"]["grantIds"] == []
    assert job.authority["tenantId"] is None
    assert [e.event_type for e in scheduler.history(job_id="job-a")] == ["job_created"]


def test_create_job_twice_conflicts(job):
    with pytest.raises(scheduler.Conflict):
        scheduler.create_job("job-a", "x", authority=AUTHORITY)


def test_enqueue_dedupes_on_identity(job, clock):
    occ, dedup = enqueue(clock)
    again, dedup2 = enqueue(clock)
    assert (dedup, dedup2) == (False, True)
    assert again.pk == occ.pk
    expected = scheduler.derive_occurrence_identity("job-a", 1, int(clock().timestamp() * 1000), "t1")
    assert occ.occurrence_id == expected.occurrence_id
    assert occ.idempotency_key == expected.idempotency_key
    assert occ.payload == {"n": 1}  # the job's payload by default
    assert Occurrence.objects.count() == 1
    assert Event.objects.filter(event_type="occurrence_enqueued").count() == 1


def test_enqueue_payload_mismatch(job, clock):
    enqueue(clock, payload={"x": 1})
    with pytest.raises(scheduler.IdempotencyPayloadMismatch) as info:
        enqueue(clock, payload={"x": 2})
    assert info.value.code == "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH"
    assert info.value.details["trigger_key"] == "t1"
    # Same payload with other key order/float form is the same canonical payload.
    _, dedup = enqueue(clock, payload={"x": 1.0})
    assert dedup


def test_enqueue_missing_and_disabled_job(job, clock):
    with pytest.raises(scheduler.NotFound):
        scheduler.enqueue("nope", scheduled_for=clock(), trigger_key="k")
    scheduler.update_job("job-a", expected_revision=1, enabled=False)
    with pytest.raises(scheduler.JobDisabled):
        enqueue(clock)
    assert Occurrence.objects.count() == 0


def test_enqueue_once_per_trigger_across_revisions(job, clock):
    first, dedup = scheduler.enqueue_once_per_trigger("job-a", scheduled_for=clock(), trigger_key="agenda:1")
    assert not dedup
    scheduler.update_job("job-a", expected_revision=1, payload={"n": 2})
    second, dedup = scheduler.enqueue_once_per_trigger("job-a", scheduled_for=clock(), trigger_key="agenda:1")
    assert dedup and second.pk == first.pk
    # Plain enqueue at the new revision is a new identity.
    third, dedup = enqueue(clock, key="agenda:1")
    assert not dedup and third.pk != first.pk and third.job_revision == 2


def test_enqueue_inside_caller_atomic_rolls_back(job, clock):
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        enqueue(clock)
        assert Occurrence.objects.count() == 1
        raise Boom
    assert Occurrence.objects.count() == 0
    assert not Event.objects.filter(event_type="occurrence_enqueued").exists()
    with transaction.atomic():
        enqueue(clock)
    assert Occurrence.objects.count() == 1


def test_update_job_revision_conflict_details(job):
    scheduler.update_job("job-a", expected_revision=1, payload={"n": 2})
    with pytest.raises(scheduler.RevisionConflict) as info:
        scheduler.update_job("job-a", expected_revision=1, payload={"n": 3})
    assert info.value.code == "SCHEDULER_REVISION_CONFLICT"
    assert info.value.details["expected_revision"] == 1
    assert info.value.details["actual_revision"] == 2
    assert Job.objects.get().payload == {"n": 2}
    updated = [e for e in scheduler.history(job_id="job-a") if e.event_type == "job_updated"]
    assert len(updated) == 1 and updated[0].data["changed"] == ["payload"]


def test_claim_sets_lease_and_fence(job, clock):
    occ, _ = enqueue(clock)
    claimed = scheduler.claim(owner="w1", lease=30)
    assert claimed.pk == occ.pk
    assert (claimed.status, claimed.attempt, claimed.fence, claimed.lease_owner) == ("running", 1, 1, "w1")
    assert claimed.lease_expires_at == clock() + timedelta(seconds=30)
    db = Occurrence.objects.get()
    assert (db.status, db.attempt, db.fence, db.lease_owner, db.lease_expires_at) == (
        "running",
        1,
        1,
        "w1",
        claimed.lease_expires_at,
    )
    assert scheduler.claim(owner="w2", lease=30) is None


def test_claim_respects_available_at_and_order(job, clock):
    later, _ = enqueue(clock, key="later", available_at=clock() + timedelta(seconds=60))
    first, _ = enqueue(clock, key="first", scheduled_for=clock() - timedelta(seconds=5))
    second, _ = enqueue(clock, key="second")
    assert scheduler.claim(owner="w", lease=100).pk == first.pk
    assert scheduler.claim(owner="w", lease=100).pk == second.pk
    assert scheduler.claim(owner="w", lease=100) is None
    clock.advance(60)
    assert scheduler.claim(owner="w", lease=10).pk == later.pk


def test_claim_batch_and_kinds(db, clock):
    scheduler.create_job("a", "kind.a", authority=AUTHORITY)
    scheduler.create_job("b", "kind.b", authority=AUTHORITY)
    for i in range(5):
        scheduler.enqueue("a", scheduled_for=clock(), trigger_key=f"k{i}")
        scheduler.enqueue("b", scheduled_for=clock(), trigger_key=f"k{i}")
    rows = scheduler.claim_batch(owner="w", lease=10, limit=3, kinds=["kind.b"])
    assert len(rows) == 3 and {r.job_id for r in rows} == {"b"}
    rows = scheduler.claim_batch(owner="w", lease=10, limit=100)
    assert len(rows) == 7


def test_claim_is_fair_across_principals(db, clock):
    scheduler.create_job("big", "k", authority=authority_for("big"))
    scheduler.create_job("small", "k", authority=authority_for("small"))
    for i in range(50):
        scheduler.enqueue("big", scheduled_for=clock() - timedelta(seconds=100 - i), trigger_key=f"b{i}")
    for i in range(3):
        scheduler.enqueue("small", scheduled_for=clock(), trigger_key=f"s{i}")
    rows = scheduler.claim_batch(owner="w", lease=10, limit=6)
    assert [r.job_id for r in rows].count("small") == 3


def test_disabled_job_is_not_claimed(job, clock):
    enqueue(clock)
    scheduler.update_job("job-a", expected_revision=1, enabled=False)
    assert scheduler.claim(owner="w", lease=10) is None
    scheduler.update_job("job-a", expected_revision=2, enabled=True)
    assert scheduler.claim(owner="w", lease=10) is not None


def test_settle_success(job, clock):
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=10)
    done = scheduler.settle(occ.pk, owner="w", fence=1, outcome="succeeded", result={"sent": 12})
    assert (done.status, done.result, done.lease_owner, done.settled_at) == (
        "succeeded",
        {"sent": 12},
        None,
        clock(),
    )
    assert Occurrence.objects.get().status == "succeeded"


def test_lease_lost_wrong_owner_fence_and_expiry(job, clock):
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=10)
    with pytest.raises(scheduler.LeaseLost) as info:
        scheduler.settle(occ.pk, owner="other", fence=1, outcome="succeeded")
    assert info.value.code == "SCHEDULER_LEASE_LOST" and info.value.details["reason"] == "wrong_owner"
    with pytest.raises(scheduler.LeaseLost) as info:
        scheduler.settle(occ.pk, owner="w", fence=2, outcome="succeeded")
    assert info.value.details["reason"] == "wrong_fence"
    with pytest.raises(scheduler.LeaseLost):
        scheduler.renew(occ.pk, owner="other", fence=1, lease=10)
    clock.advance(10)  # expiry counts at lease_expires_at <= now
    with pytest.raises(scheduler.LeaseLost) as info:
        scheduler.settle(occ.pk, owner="w", fence=1, outcome="succeeded")
    assert info.value.details["reason"] == "lease_expired"
    with pytest.raises(scheduler.LeaseLost):
        scheduler.renew(occ.pk, owner="w", fence=1, lease=10)
    assert Occurrence.objects.get().status == "running"


def test_renew_extends_never_shortens(job, clock):
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=60)
    clock.advance(5)
    renewed = scheduler.renew(occ.pk, owner="w", fence=1, lease=10)
    assert renewed.lease_expires_at == occ.lease_expires_at  # 60 s lease not shortened to 15
    renewed = scheduler.renew(occ.pk, owner="w", fence=1, lease=120)
    assert renewed.lease_expires_at == clock() + timedelta(seconds=120)
    assert scheduler.history(occurrence_id=occ.pk)[0].event_type == "occurrence_renewed"


def test_reclaim_after_expiry_bumps_attempt_and_fence(job, clock):
    enqueue(clock)
    first = scheduler.claim(owner="w1", lease=10)
    clock.advance(10)
    second = scheduler.claim(owner="w2", lease=10)
    assert second.pk == first.pk
    assert (second.attempt, second.fence, second.lease_owner) == (2, 2, "w2")
    with pytest.raises(scheduler.LeaseLost):
        scheduler.settle(first.pk, owner="w1", fence=1, outcome="succeeded", result="stale")
    scheduler.settle(first.pk, owner="w2", fence=2, outcome="succeeded", result="fresh")
    assert Occurrence.objects.get().result == "fresh"
    event = scheduler.history(occurrence_id=first.pk)[1]
    assert event.event_type == "occurrence_reclaimed" and event.data["previousOwner"] == "w1"


def test_retry_wait_not_claimable_before_its_time(job, clock):
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=10)
    retry_at = clock() + timedelta(seconds=30)
    waiting = scheduler.settle(occ.pk, owner="w", fence=1, outcome="failed", error="boom", retry_at=retry_at)
    assert (waiting.status, waiting.available_at, waiting.last_error["message"]) == (
        "retry_wait",
        retry_at,
        "boom",
    )
    clock.advance(29.999)
    assert scheduler.claim(owner="w", lease=10) is None
    clock.advance(0.001)
    again = scheduler.claim(owner="w", lease=10)
    assert (again.pk, again.attempt, again.fence) == (occ.pk, 2, 2)


def test_retry_backoff_without_retry_at(job, clock, settings):
    settings.DURABLE_SCHEDULER_RETRY_JITTER = 0
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=10)
    waiting = scheduler.settle(occ.pk, owner="w", fence=1, outcome="failed", error="x")
    assert waiting.available_at == clock() + timedelta(seconds=10)
    clock.advance(10)
    occ = scheduler.claim(owner="w", lease=10)
    waiting = scheduler.settle(occ.pk, owner="w", fence=2, outcome="failed", error="x")
    assert waiting.available_at == clock() + timedelta(seconds=20)


def test_dead_letter_after_max_attempts(job, clock):
    enqueue(clock)
    for attempt in (1, 2, 3):
        occ = scheduler.claim(owner="w", lease=10)
        assert occ.attempt == attempt
        result = scheduler.settle(
            occ.pk, owner="w", fence=attempt, outcome="failed", error="x", retry_at=clock()
        )
    assert result.status == "dead_letter" and result.settled_at == clock()
    assert scheduler.claim(owner="w", lease=10) is None
    assert scheduler.history(occurrence_id=occ.pk)[0].data["reason"] == "max_attempts"


def test_not_retryable_failure_dead_letters_at_once(job, clock):
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=10)
    result = scheduler.settle(occ.pk, owner="w", fence=1, outcome="failed", error="bad", retryable=False)
    assert result.status == "dead_letter" and result.attempt == 1


def test_expired_final_attempt_dead_letters(job, clock):
    scheduler.update_job("job-a", expected_revision=1, max_attempts=1)
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=10)
    clock.advance(10)
    assert scheduler.claim(owner="w2", lease=10) is None
    dead = Occurrence.objects.get()
    assert (dead.status, dead.lease_owner, dead.last_error["code"]) == (
        "dead_letter",
        None,
        "SCHEDULER_LEASE_EXPIRED",
    )
    event = scheduler.history(occurrence_id=occ.pk)[0]
    assert event.event_type == "occurrence_dead_lettered" and event.data["reason"] == "lease_expired"
    with pytest.raises(scheduler.LeaseLost):
        scheduler.settle(occ.pk, owner="w", fence=1, outcome="succeeded")


def test_expiry_sweep_under_a_lowered_max_claim_batch(job, clock, settings):
    """The workers' sweep passes no limit: it takes MAX_CLAIM_BATCH, whatever it is set to,
    rather than a fixed default the setting's own bound would refuse."""
    settings.DURABLE_SCHEDULER_MAX_CLAIM_BATCH = 100
    scheduler.update_job("job-a", expected_revision=1, max_attempts=1)
    enqueue(clock)
    scheduler.claim(owner="w", lease=10)
    clock.advance(10)
    assert scheduler.dead_letter_expired() == 1


def test_history_newest_first(job, clock):
    occ, _ = enqueue(clock)
    scheduler.claim(owner="w", lease=10)
    scheduler.settle(occ.pk, owner="w", fence=1, outcome="succeeded")
    types = [e.event_type for e in scheduler.history(occurrence_id=occ.pk)]
    assert types == ["occurrence_succeeded", "occurrence_claimed", "occurrence_enqueued"]
    assert [e.event_type for e in scheduler.history(job_id="job-a", limit=2)] == types[:2]
    ids = [e.event_id for e in scheduler.history()]
    assert ids == sorted(ids, reverse=True)


def test_cancel_queued_or_retry_wait_at_once_and_ask_a_running_one(job, clock):
    queued, _ = enqueue(clock, key="q")
    cancelled = scheduler.cancel(queued.pk, reason="not needed")
    assert (cancelled.status, cancelled.settled_at) == ("cancelled", clock())
    assert scheduler.history(occurrence_id=queued.pk)[0].data["reason"] == "not needed"
    enqueue(clock, key="r")
    running = scheduler.claim(owner="w", lease=10)
    asked = scheduler.cancel(running.pk)  # asked to stop: still running until its worker ends it
    assert asked.status == "running" and asked.cancel_requested_fence == running.fence
    ended = scheduler.settle(
        running.pk, owner="w", fence=1, outcome="failed", error="x", retry_at=clock() + timedelta(hours=1)
    )
    assert ended.status == "cancelled"  # not retried
    enqueue(clock, key="s")
    waiting = scheduler.claim(owner="w", lease=10)
    scheduler.settle(
        waiting.pk, owner="w", fence=1, outcome="failed", error="x", retry_at=clock() + timedelta(hours=1)
    )
    assert scheduler.cancel(waiting.pk).status == "cancelled"
    with pytest.raises(scheduler.InvalidState):
        scheduler.cancel(running.pk)  # already terminal
    with pytest.raises(scheduler.NotFound):
        scheduler.cancel("occ_missing")


def test_run_now_makes_a_waiting_occurrence_due(job, clock):
    later, _ = enqueue(clock, key="later", available_at=clock() + timedelta(hours=2))
    assert scheduler.claim(owner="w", lease=10) is None  # not due yet
    clock.advance(60)
    made = scheduler.run_now(later.pk, reason="operator")
    assert (made.status, made.available_at) == ("queued", clock())
    (event,) = [e for e in scheduler.history(occurrence_id=later.pk) if e.event_type == "occurrence_made_due"]
    assert event.data == {
        "reason": "operator",
        "previousAvailableAt": "2026-01-05T14:00:00.000Z",
        "status": "queued",
    }
    # Already due: nothing to change, nothing recorded.
    before = len(scheduler.history(occurrence_id=later.pk))
    assert scheduler.run_now(later.pk).available_at == clock()
    assert len(scheduler.history(occurrence_id=later.pk)) == before
    running = scheduler.claim(owner="w", lease=10)
    assert running.pk == later.pk
    with pytest.raises(scheduler.InvalidState):
        scheduler.run_now(running.pk)
    # A retry waiting for its backoff runs at once, keeping its attempt count.
    scheduler.settle(
        running.pk, owner="w", fence=1, outcome="failed", error="x", retry_at=clock() + timedelta(hours=1)
    )
    made = scheduler.run_now(running.pk)
    assert (made.status, made.attempt, made.available_at) == ("retry_wait", 1, clock())
    assert scheduler.claim(owner="w", lease=10).pk == running.pk
    with pytest.raises(scheduler.NotFound):
        scheduler.run_now("occ_missing")


def test_release_gives_lease_back(job, clock):
    enqueue(clock)
    occ = scheduler.claim(owner="w", lease=10)
    released = scheduler.release(occ.pk, owner="w", fence=1)
    assert (released.status, released.attempt, released.fence) == ("queued", 0, 1)
    again = scheduler.claim(owner="w2", lease=10)
    assert (again.attempt, again.fence) == (1, 2)


def test_trigger_edit_supersedes_materialized_only(job, clock):
    explicit, _ = enqueue(clock, key="manual")
    slot, _ = enqueue(clock, key="schedule:2026-01-05T12:00:00.000Z")
    scheduler.update_job("job-a", expected_revision=1, trigger={"every": 60})
    assert Occurrence.objects.get(pk=slot.pk).status == OccurrenceStatus.CANCELLED
    assert Occurrence.objects.get(pk=slot.pk).last_error["message"] == "superseded"
    assert Occurrence.objects.get(pk=explicit.pk).status == OccurrenceStatus.QUEUED


def test_enqueue_many_bulk_and_dedupe(job, clock):
    first, _ = enqueue(clock, key="k0")
    items = [{"scheduled_for": clock(), "trigger_key": f"k{i}"} for i in range(5)]
    items.append({"scheduled_for": clock(), "trigger_key": "k1"})  # a duplicate within the batch
    results = scheduler.enqueue_many("job-a", items)
    assert [dedup for _, dedup in results] == [True, False, False, False, False, True]
    assert results[0][0].pk == first.pk and results[5][0].pk == results[1][0].pk
    assert Occurrence.objects.count() == 5
    assert Event.objects.filter(event_type="occurrence_enqueued").count() == 5
    single, _ = enqueue(clock, key="k3")
    assert single.pk == results[3][0].pk  # same identity as a one-by-one enqueue


def test_enqueue_many_is_all_or_nothing(job, clock):
    enqueue(clock, key="k1", payload={"a": 1})
    items = [
        {"scheduled_for": clock(), "trigger_key": "k0"},
        {"scheduled_for": clock(), "trigger_key": "k1", "payload": {"a": 2}},
    ]
    with pytest.raises(scheduler.IdempotencyPayloadMismatch):
        scheduler.enqueue_many("job-a", items)
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.enqueue_many("job-a", [{"scheduled_for": clock(), "trigger_key": "x", "when": 1}])
    assert info.value.details["field"] == "items[0].when"
    assert Occurrence.objects.count() == 1


def test_claim_reaches_principals_behind_many_with_other_kinds_only(clock):
    # Seven principals whose work is of a kind this claimer does not run come first in the
    # rotation; a claim of one must still find the eighth principal's occurrence.
    for i in range(7):
        scheduler.create_job(f"other-{i}", "kind.b", authority=authority_for(f"a{i}", "reports.send"))
        scheduler.enqueue(f"other-{i}", scheduled_for=clock(), trigger_key="t")
    scheduler.create_job("mine", "kind.a", authority=authority_for("zz", "reports.send"))
    (wanted, _) = scheduler.enqueue("mine", scheduled_for=clock(), trigger_key="t")
    # A worker's claim (with a round-robin cursor) reads the principals a few at a time.
    got = scheduler.claim_batch(owner="w", lease=30, limit=1, kinds=["kind.a"], after_principal="")
    assert [row.pk for row in got] == [wanted.pk]
    assert Occurrence.objects.filter(status="queued").count() == 7
