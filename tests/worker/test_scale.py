"""Scale and fairness with real ``runscheduler`` processes: several workers drain one pool
exactly once, and one principal's backlog does not starve another's."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence, WorkerHeartbeat

from ..procs.runner import Workers, granted, wait_for

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
OCCURRENCES = 3000


def test_three_workers_drain_a_pool_exactly_once(workers, request):
    """Three workers share one pool. They are started first and the pool is written once all three
    are in their loop: a worker that is slow to start (Python start-up on a busy machine) would
    otherwise find the pool already drained, which says nothing about sharing. The pool lasts
    several poll intervals: with claim-ahead, 1,000 rows were drained by two workers in 1.5 s
    while the third was between polls. (That --burst never leaves while work is due is the
    subject of the burst tests below.)"""
    for p in range(5):
        scheduler.create_job(
            f"scale-{p}", "test.sleep", authority=granted(f"p{p}"), payload={"seconds": 0.002}
        )
    procs = [workers.start("--worker-id", f"s{i}", "--concurrency", "4") for i in range(WORKERS)]
    names = {f"s{i}" for i in range(WORKERS)}
    assert wait_for(
        lambda: (
            set(WorkerHeartbeat.objects.filter(worker_id__in=names).values_list("worker_id", flat=True))
            == names
        ),
        timeout=60,
    ), [proc.output() for proc in procs]
    started = time.monotonic()
    ids = []
    for p in range(5):
        ids += enqueue_many(f"scale-{p}", OCCURRENCES // 5)
    done = wait_for(
        lambda: Occurrence.objects.filter(status="succeeded").count() == OCCURRENCES,
        timeout=300,
        interval=0.1,
    )
    elapsed = time.monotonic() - started
    for proc in procs:
        proc.proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(30) == 0, proc.output()
    assert done, Counter(Occurrence.objects.values_list("status", flat=True))

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
    assert set(per_worker) == names, "a worker processed nothing"
    # A claim and its success are by the same worker.
    claimed_by = dict(
        Event.objects.filter(event_type="occurrence_claimed").values_list("occurrence_id", "owner_id")
    )
    assert all(claimed_by[pk] == owner for pk, owner in successes.values_list("occurrence_id", "owner_id"))


BACKLOG = 1000
LATECOMER = 10
FIRST = 60


def test_a_backlog_does_not_starve_another_principal(workers):
    scheduler.create_job("backlog", "test.sleep", authority=granted("A"), payload={"seconds": 0.005})
    scheduler.create_job("latecomer", "test.sleep", authority=granted("B"), payload={"seconds": 0.005})
    enqueue_many("backlog", BACKLOG)
    # Due later than every one of A's: plain due-time order would run them last.
    late_ids = set(enqueue_many("latecomer", LATECOMER, start_ms=BASE_MS + 3_600_000))
    proc = workers.start(
        "--worker-id", "fair", "--concurrency", "2", "--max-occurrences", str(FIRST), verbosity=0
    )
    assert proc.wait(120) == 0, proc.output()

    def order(event_type):
        return list(
            Event.objects.filter(event_type=event_type)
            .order_by("event_id")
            .values_list("occurrence_id", flat=True)
        )

    assert len(order("occurrence_succeeded")) == FIRST
    # Claims alternate between the principals while both have work: B's are all claimed
    # early. (The claim order is the scheduler's decision; the order in which handler
    # threads finish is the operating system's.)
    positions = [i for i, pk in enumerate(order("occurrence_claimed")) if pk in late_ids]
    print(f"\n[fairness] B's occurrences were claimed at positions {positions} of the first {FIRST}")
    assert len(positions) == LATECOMER, "B was starved behind A's backlog"
    assert max(positions) < 3 * LATECOMER
    assert Occurrence.objects.filter(pk__in=late_ids, status="succeeded").count() == LATECOMER


HELD = 4
POOL = 200


def test_burst_worker_is_not_turned_away_by_rows_another_claimer_holds(workers, request):
    """Another claimer's open claim transaction holds a few rows; a --burst worker that starts
    meanwhile must not mistake "these rows are locked" (SKIP LOCKED) for "nothing is due"."""
    scheduler.create_job("held", "test.ok", authority=granted("held"))
    ids = enqueue_many("held", POOL)
    with transaction.atomic():
        # SQLite: this holds the database write lock, so the worker simply waits for it.
        held = scheduler.claim_batch(owner="holder", lease=600, limit=HELD)
        proc = workers.start("--worker-id", "burst", "--burst", "--concurrency", "4")
        wait_for(lambda: not proc.alive(), 3)
    assert proc.wait(120) == 0, proc.output()
    done = Occurrence.objects.filter(status="succeeded").count()
    print(f"\n[held rows] the burst worker finished {done} of {POOL - HELD} claimable")
    assert done == POOL - HELD, "the burst worker left while work was due"
    assert set(Occurrence.objects.filter(status="running").values_list("pk", flat=True)) == {
        o.pk for o in held
    }
    assert len(ids) == POOL


SINGLE_SLOT = 200


def test_burst_worker_with_one_slot_drains_the_pool(workers):
    """--burst runs until nothing is due. With one slot, the loop wakes (poll interval) while the
    handler runs, finds no free slot, does not claim; the handler ending just then must not be
    taken for 'nothing due'."""
    scheduler.create_job("one-slot", "test.echo", authority=granted("one-slot"), payload={"seconds": 0.005})
    enqueue_many("one-slot", SINGLE_SLOT)
    proc = workers.start("--burst", "--concurrency", "1", "--poll-interval", "0.01", verbosity=0)
    assert proc.wait(120) == 0, proc.output()
    done = Occurrence.objects.filter(status="succeeded").count()
    print(f"\n[one slot] the burst worker finished {done} of {SINGLE_SLOT} and exited")
    assert done == SINGLE_SLOT
