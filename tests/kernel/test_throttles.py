"""Throttles in the claim (docs/design.md, "Throttles"): a job's, a kind's and a principal's,
per throttle key, on the database the suite runs on. Work over the rate is given its own later
start (no attempt used, no event); other keys are claimed meanwhile."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.kernel import claiming
from django_durable_scheduler.models import Event, Occurrence, ThrottleBucket, ThrottlePlace

from ..procs.runner import granted

BASE_MS = 1_700_000_000_000


def make(job_id: str, payloads: list[dict], principal: str = "thr", kind: str = "k", **job) -> list[str]:
    scheduler.create_job(job_id, kind, authority=granted(principal), **{"max_attempts": 5, **job})
    with transaction.atomic():
        return [
            scheduler.enqueue(job_id, scheduled_for=BASE_MS + i, trigger_key=f"t{i}", payload=p)[0].pk
            for i, p in enumerate(payloads)
        ]


def claim(limit: int = 50) -> list[Occurrence]:
    return scheduler.claim_batch(owner="w", lease=60, limit=limit)


def keys(rows) -> list[str]:
    return sorted(row.payload["account"] for row in rows)


@pytest.mark.django_db
def test_a_job_throttle_lets_limit_plus_burst_through_then_one_per_interval(clock):
    # 2 per second, 1 more at once: 2 start now, then one every 0.5 s.
    make("j", [{"account": "a"}] * 6, throttle={"limit": 2, "period": 1, "burst": 1, "key": "{account}"})
    assert len(claim()) == 2
    waiting = Occurrence.objects.filter(status="queued").order_by("available_at")
    assert [row.available_at - clock.current for row in waiting] == [
        timedelta(seconds=0.5 * n) for n in range(1, 5)
    ]
    assert {row.attempt for row in waiting} == {0}
    places = dict(ThrottlePlace.objects.values_list("pk", "slot"))
    assert all(places[row.pk] == row.available_at for row in waiting)
    assert not Event.objects.exclude(
        event_type__in=["occurrence_enqueued", "occurrence_claimed", "job_created"]
    )
    assert claim() == []  # nothing is due before its place
    clock.advance(0.499)
    assert claim() == []
    clock.advance(0.001)
    assert len(claim()) == 1
    clock.advance(10)  # every place has come, and the bucket is full again: 1 + burst start
    assert len(claim()) == 2
    assert Occurrence.objects.filter(status="queued").count() == 1


@pytest.mark.django_db
def test_other_keys_are_claimed_while_one_waits(clock):
    throttle = {"limit": 1, "period": 10, "key": "{account}"}
    make("j", [{"account": "a"}] * 5 + [{"account": "b"}, {"account": "c"}], throttle=throttle)
    claim(limit=2)  # a's backlog fills the first pool: one starts, the rest get later places
    claim(limit=10)
    assert keys(Occurrence.objects.filter(status="running")) == ["a", "b", "c"]


@pytest.mark.django_db
def test_new_work_waits_behind_the_work_placed_before_it(clock):
    throttle = {"limit": 1, "period": 1, "key": "{account}"}
    make("j", [{"account": "a"}] * 3, throttle=throttle)
    assert len(claim()) == 1
    placed = list(Occurrence.objects.filter(status="queued").order_by("available_at"))
    assert [row.available_at - clock.current for row in placed] == [
        timedelta(seconds=1),
        timedelta(seconds=2),
    ]
    (late,) = make("j2", [{"account": "a"}], throttle=throttle)
    claim()  # another job, another bucket: it starts
    assert Occurrence.objects.get(pk=late).status == "running"
    (newer,) = [
        scheduler.enqueue("j", scheduled_for=BASE_MS + 99, trigger_key="late", payload={"account": "a"})[0].pk
    ]
    clock.advance(1)
    (first,) = claim()
    assert first.pk == placed[0].pk
    assert (
        Occurrence.objects.get(pk=newer).available_at
        == clock.current + timedelta(seconds=1) * 2 - timedelta(seconds=1)
        or Occurrence.objects.get(pk=newer).available_at > placed[1].available_at
    )


@pytest.mark.django_db
def test_a_kind_throttle_and_a_principal_throttle(clock):
    registry.handler("thr.kind", throttle={"limit": 1, "period": 60})(lambda ctx: None)
    try:
        make("j", [{}, {}], kind="thr.kind")
        assert len(claim()) == 1
        assert ThrottleBucket.objects.get().scope == ["kind", "thr.kind", ""]
    finally:
        registry.unregister("thr.kind")
    scheduler.set_policy(
        "user",
        "slow",
        capabilities=["tests.run"],
        window=timedelta(hours=1),
        max_runs=1000,
        max_units=1000,
        throttle={"limit": 1, "period": 60},
    )
    make("p", [{}, {}], principal="slow")
    assert len(claim()) == 1


@pytest.mark.django_db
def test_the_worker_claim_reports_when_to_wake(clock):
    make("j", [{"account": "a"}] * 2, throttle={"limit": 1, "period": 2, "key": "{account}"})
    batch = claiming.claim_authorized(owner="w", lease=60, limit=10)
    assert len(batch.claimed) == 1
    assert batch.throttled_until == clock.current + timedelta(seconds=2)


@pytest.mark.django_db
def test_a_clock_that_goes_back_lets_nothing_more_start(clock):
    make("j", [{"account": "a"}] * 4, throttle={"limit": 1, "period": 1, "key": "{account}"})
    assert len(claim()) == 1
    clock.advance(-3600)
    assert claim() == []
    bucket = ThrottleBucket.objects.get()
    assert bucket.tat > clock.current


@pytest.mark.django_db
def test_a_missing_key_field_is_refused_at_enqueue_and_nothing_is_written(clock):
    make("j", [], throttle={"limit": 1, "period": 1, "key": "{account}"})
    with pytest.raises(scheduler.InvalidArgument) as caught:
        scheduler.enqueue("j", scheduled_for=BASE_MS, trigger_key="x", payload={"other": 1})
    assert caught.value.details["field"] == "throttle.key"
    assert "account" in str(caught.value)
    assert not Occurrence.objects.exists()
