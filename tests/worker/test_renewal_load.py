"""Short leases under load, with real ``runscheduler`` processes: the heartbeat renews all a
worker holds at once, so healthy workers on a one-second lease keep every lease they hold
while they drain a pool, and nothing they hold is reclaimed from them."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence, WorkerHeartbeat
from django_durable_scheduler.rules.events import (
    OCCURRENCE_CLAIMED,
    OCCURRENCE_DEAD_LETTERED,
    OCCURRENCE_RECLAIMED,
    OCCURRENCE_RELEASED,
    OCCURRENCE_RETRY_SCHEDULED,
    OCCURRENCE_SUCCEEDED,
)

from ..procs.runner import Workers, granted, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_MS = 1_700_000_000_000
WORKERS = 3
OCCURRENCES = 3000


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def test_three_workers_on_a_one_second_lease_drain_a_pool_and_reclaim_nothing(workers):
    scheduler.create_job("fast", "test.ok", authority=granted("fast"))
    names = [f"r{i}" for i in range(WORKERS)]
    procs = [workers.start("--worker-id", name, "--lease", "1", "--concurrency", "4") for name in names]
    assert wait_for(
        lambda: WorkerHeartbeat.objects.filter(worker_id__in=names).count() == WORKERS, timeout=60
    ), [proc.output() for proc in procs]
    with transaction.atomic():
        scheduler.enqueue_many(
            "fast", [{"scheduled_for": BASE_MS + i, "trigger_key": f"t{i}"} for i in range(OCCURRENCES)]
        )
    done = wait_for(
        lambda: not Occurrence.objects.filter(status__in=["queued", "running", "retry_wait"]).exists(),
        timeout=300,
        interval=0.2,
    )
    for proc in procs:
        proc.proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(30) == 0, proc.output()
    assert done, Counter(Occurrence.objects.values_list("status", flat=True))
    taken_back = Event.objects.filter(
        event_type__in=[
            OCCURRENCE_RECLAIMED,
            OCCURRENCE_DEAD_LETTERED,
            OCCURRENCE_RELEASED,
            OCCURRENCE_RETRY_SCHEDULED,
        ]
    )
    assert not taken_back.exists(), Counter(taken_back.values_list("event_type", "owner_id"))
    assert Occurrence.objects.filter(status="succeeded", attempt=1, fence=1).count() == OCCURRENCES
    claims = Counter(
        Event.objects.filter(event_type=OCCURRENCE_CLAIMED).values_list("occurrence_id", flat=True)
    )
    assert len(claims) == OCCURRENCES and max(claims.values()) == 1
    assert Event.objects.filter(event_type=OCCURRENCE_SUCCEEDED).count() == OCCURRENCES
    for proc in procs:
        assert "lease lost" not in proc.output(tail=10**7).lower(), proc.output()
