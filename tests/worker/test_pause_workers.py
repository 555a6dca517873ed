"""Pausing a kind with real ``runscheduler`` processes: two workers both stop claiming it from
the pause's commit on (any claim planned after it leaves the kind alone, so a worker obeys at
its next poll), go on claiming other kinds, let its running work finish, and both take its
work again once it is resumed."""

from __future__ import annotations

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler import conf
from django_durable_scheduler.housekeeping import ops
from django_durable_scheduler.models import Event, Occurrence

from ..procs.runner import Workers, granted, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_MS = 1_700_000_000_000
POLL = "0.5"
PAUSED, OTHER = "test.sleep", "test.ok"


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def enqueue(job_id: str, first: int, n: int) -> list[str]:
    with transaction.atomic():
        return [
            scheduler.enqueue(job_id, scheduled_for=BASE_MS + i, trigger_key=f"t{i}")[0].pk
            for i in range(first, first + n)
        ]


def claims(kind: str):
    return Event.objects.filter(event_type="occurrence_claimed", job__kind=kind)


def owners(events) -> set[str]:
    return {owner.split(":")[0] for owner in events.values_list("owner_id", flat=True)}


def test_two_workers_stop_claiming_a_paused_kind_and_take_it_again_once_resumed(workers):
    authority = granted("pauser")
    scheduler.create_job("slow", PAUSED, authority=authority, payload={"seconds": 0.3})
    scheduler.create_job("quick", OTHER, authority=authority)
    started = [
        workers.start("--worker-id", name, "--concurrency", "1", "--poll-interval", POLL)
        for name in ("wa", "wb")
    ]
    assert wait_for(lambda: all(w.in_loop() for w in started), timeout=60)
    enqueue("slow", 0, 8)
    assert wait_for(lambda: owners(claims(PAUSED)) == {"wa", "wb"}, timeout=60), [w.output() for w in started]

    scheduler.pause(PAUSED, by="test")
    committed = conf.now()  # every claim planned from here on reads the pause
    held = enqueue("slow", 8, 4)
    quick = enqueue("quick", 0, 6)
    # The workers keep claiming the other kind.
    assert wait_for(
        lambda: Occurrence.objects.filter(pk__in=quick, status="succeeded").count() == 6, timeout=60
    )
    # What was running when the pause came finishes; nothing of the kind is claimed after it.
    assert wait_for(
        lambda: not Occurrence.objects.filter(job_id="slow", status="running").exists(), timeout=60
    )
    assert not claims(PAUSED).filter(occurred_at__gt=committed).exists()
    assert set(Occurrence.objects.filter(pk__in=held).values_list("status", flat=True)) == {"queued"}
    status = ops.collect_status()
    (paused,) = status.paused
    assert (paused.kind, paused.due) == (PAUSED, paused.waiting) and paused.waiting >= 4
    assert status.due == 0 and status.healthy, status.problems

    scheduler.resume(PAUSED)
    resumed = conf.now()
    assert wait_for(lambda: not Occurrence.objects.filter(job_id="slow").exclude(status="succeeded").exists())
    assert owners(claims(PAUSED).filter(occurred_at__gte=resumed)) == {"wa", "wb"}
    assert all(w.alive() for w in started)
