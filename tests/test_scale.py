"""Scale and fairness with real ``runscheduler`` processes: several workers drain one pool
exactly once, and one principal's backlog does not starve another's."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence

from .conftest import authority_for
from .procs.runner import Workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_MS = 1_700_000_000_000


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def enqueue_many(job_id, n, *, start_ms=BASE_MS):
    with transaction.atomic():
        return [
            scheduler.enqueue(job_id, scheduled_for=start_ms + i, trigger_key=f"t{i}")[0].pk for i in range(n)
        ]


WORKERS = 3
OCCURRENCES = 1000


def test_three_workers_drain_a_pool_exactly_once(workers):
    for p in range(5):
        scheduler.create_job(f"scale-{p}", "test.ok", authority=authority_for(f"p{p}"))
    ids = []
    for p in range(5):
        ids += enqueue_many(f"scale-{p}", OCCURRENCES // 5)
    started = time.monotonic()
    procs = [
        workers.start("--worker-id", f"s{i}", "--burst", "--concurrency", "4", verbosity=0)
        for i in range(WORKERS)
    ]
    for proc in procs:
        assert proc.wait(300) == 0, proc.output()
    elapsed = time.monotonic() - started

    assert Occurrence.objects.filter(status="succeeded", attempt=1, fence=1).count() == OCCURRENCES
    claims = Counter(
        Event.objects.filter(event_type="occurrence_claimed").values_list("occurrence_id", flat=True)
    )
    assert set(claims) == set(ids) and max(claims.values()) == 1
    assert not Event.objects.filter(
        event_type__in=["occurrence_reclaimed", "occurrence_released", "occurrence_retry_scheduled"]
    ).exists()
    successes = Event.objects.filter(event_type="occurrence_succeeded")
    assert successes.count() == OCCURRENCES
    per_worker = Counter(successes.values_list("owner_id", flat=True))
    print(f"\n[scale] {OCCURRENCES} in {elapsed:.1f} s; per worker {dict(sorted(per_worker.items()))}")
    assert set(per_worker) == {f"s{i}" for i in range(WORKERS)}, "a worker processed nothing"
    # A claim and its success are by the same worker.
    claimed_by = dict(
        Event.objects.filter(event_type="occurrence_claimed").values_list("occurrence_id", "owner_id")
    )
    assert all(claimed_by[pk] == owner for pk, owner in successes.values_list("occurrence_id", "owner_id"))


BACKLOG = 1000
LATECOMER = 10
FIRST = 60


def test_a_backlog_does_not_starve_another_principal(workers):
    scheduler.create_job("backlog", "test.sleep", authority=authority_for("A"), payload={"seconds": 0.005})
    scheduler.create_job("latecomer", "test.sleep", authority=authority_for("B"), payload={"seconds": 0.005})
    enqueue_many("backlog", BACKLOG)
    # Due later than every one of A's: plain due-time order would run them last.
    late_ids = set(enqueue_many("latecomer", LATECOMER, start_ms=BASE_MS + 3_600_000))
    proc = workers.start(
        "--worker-id", "fair", "--concurrency", "2", "--max-occurrences", str(FIRST), verbosity=0
    )
    assert proc.wait(120) == 0, proc.output()

    order = list(
        Event.objects.filter(event_type="occurrence_succeeded")
        .order_by("event_id")
        .values_list("occurrence_id", flat=True)
    )
    assert len(order) == FIRST
    positions = [i for i, pk in enumerate(order) if pk in late_ids]
    print(f"\n[fairness] B's occurrences finished at positions {positions} of the first {FIRST}")
    assert len(positions) == LATECOMER, "B was starved behind A's backlog"
    # Claims alternate between the principals while both have work: B's are all done early.
    assert max(positions) < 3 * LATECOMER
    assert Occurrence.objects.filter(pk__in=late_ids, status="succeeded").count() == LATECOMER
