"""kernel.abandon: the leases of an owner whose process is known to have ended end at once,
so its occurrences are reclaimed now (each as an attempt) rather than when the leases expire;
nobody else's lease, and nothing already expired or settled, is touched."""

from __future__ import annotations

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Event, Occurrence

pytestmark = pytest.mark.django_db


def claimed(clock, owner: str, keys: list[str]) -> list[Occurrence]:
    scheduler.enqueue_many("job-a", [{"scheduled_for": clock(), "trigger_key": key} for key in keys])
    return kernel.claim_batch(owner=owner, lease=60, limit=len(keys))


def test_the_dead_owners_leases_end_now_and_come_back_as_reclaims(job, clock):
    dead = claimed(clock, "dead", ["a", "b", "c"])
    alive = claimed(clock, "alive", ["d"])
    kernel.settle(dead[2].pk, owner="dead", fence=dead[2].fence, outcome="succeeded")
    clock.advance(5)
    assert kernel.abandon("dead") == 2
    ended = Occurrence.objects.filter(pk__in=[dead[0].pk, dead[1].pk])
    assert {(o.status, o.lease_owner, o.lease_expires_at) for o in ended} == {("running", "dead", clock())}
    assert Occurrence.objects.get(pk=alive[0].pk).lease_expires_at > clock()
    events = Event.objects.filter(event_type="occurrence_abandoned")
    assert sorted(events.values_list("occurrence_id", "owner_id", "fence")) == sorted(
        (o.pk, "dead", o.fence) for o in dead[:2]
    )
    # Reclaimed at once by another worker, on the next attempt and fence; again, nothing.
    again = kernel.claim_batch(owner="next", lease=60, limit=10)
    assert {(o.pk, o.attempt, o.fence) for o in again} == {(o.pk, 2, 2) for o in dead[:2]}
    assert kernel.abandon("dead") == 0


def test_an_expired_lease_is_left_to_the_claim_and_the_sweep(job, clock):
    claimed(clock, "dead", ["a"])
    clock.advance(61)
    assert kernel.abandon("dead") == 0
    assert not Event.objects.filter(event_type="occurrence_abandoned").exists()


@pytest.mark.parametrize("owner", ["", None, 7, "x" * 300])
def test_a_bad_owner_is_refused_by_name(job, clock, owner):
    claimed(clock, "dead", ["a"])
    with pytest.raises(scheduler.InvalidArgument, match="owner"):
        kernel.abandon(owner)
    assert not Event.objects.filter(event_type="occurrence_abandoned").exists()
