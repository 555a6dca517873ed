"""A worker stopped (SIGSTOP) past its lease, then continued (SIGCONT), with real
``runscheduler`` processes: it must not start what it held when it stopped (those leases ended
while it was stopped), it reclaims its own rows and keeps renewing the new attempts, and each
occurrence still succeeds exactly once (docs/design.md, "Stranded work and second runs")."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from datetime import datetime

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence

from ..procs.runner import Workers, granted, wait_for
from .test_crash import assert_each_succeeded_exactly_once

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_MS = 1_700_000_000_000
OCCURRENCES = 250
CONCURRENCY = 2
LEASE = 1  # seconds
STOPPED = 2.5  # seconds: every lease the worker holds ends while it is stopped


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def executions(log) -> list[tuple[float, str, int]]:
    """Every handler execution: (when it started, occurrence id, fence)."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        at, pk, fence = line.split()
        found.append((float(at), pk, int(fence)))
    return found


def test_a_worker_stopped_past_its_lease_runs_nothing_it_held_again(workers, tmp_path):
    log = tmp_path / "executions.log"
    payload = {"log": str(log), "seconds": 0.005}  # fast: the worker claims ahead, holding many
    scheduler.create_job("stall", "test.counted", authority=granted("stall"), payload=payload, max_attempts=5)
    with transaction.atomic():
        ids = [
            scheduler.enqueue("stall", scheduled_for=BASE_MS + i, trigger_key=f"t{i}")[0].pk
            for i in range(OCCURRENCES)
        ]
    worker = workers.start("--worker-id", "A", "--lease", str(LEASE), "--concurrency", str(CONCURRENCY))
    held = Occurrence.objects.filter(status="running", lease_owner="A")
    # Stop it while it holds more than its threads run: runs queued for a thread, not started.
    assert wait_for(lambda: held.count() > 3 * CONCURRENCY, 30), worker.output()
    os.kill(worker.pid, signal.SIGSTOP)
    time.sleep(0.2)
    stopped = time.time()  # the worker has stopped by now: what starts later, starts after SIGCONT
    time.sleep(STOPPED - 0.2)
    held_at_stop = held.count()
    os.kill(worker.pid, signal.SIGCONT)
    done = Occurrence.objects.filter(pk__in=ids, status="succeeded")
    assert wait_for(lambda: done.count() == OCCURRENCES, 60), worker.output()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()

    assert_each_succeeded_exactly_once(ids)
    ran = executions(log)
    # When each lease was taken: a claim stamps its lease when it writes it (its expiry less
    # the lease), which may be after the stop for a claim the stop found under way.
    claimed_at = {
        (pk, fence): datetime.fromisoformat(data["leaseExpiresAt"]).timestamp() - LEASE
        for pk, fence, data in Event.objects.filter(
            event_type__in=["occurrence_claimed", "occurrence_reclaimed"]
        ).values_list("occurrence_id", "fence", "data")
    }
    # What started after the worker continued ran on a lease taken after that: none of what it
    # held when stopped (each of those leases had ended) started then.
    stale = [(pk, fence) for at, pk, fence in ran if at > stopped and claimed_at[pk, fence] < stopped]
    runs = Counter(pk for _, pk, _ in ran)
    twice = sorted(pk for pk, n in runs.items() if n > 1)
    summary = f"held at the stop {held_at_stop}, ran twice {len(twice)}, stale starts {len(stale)}"
    assert not stale, summary + "\n" + worker.output()
    # So only what had started before the stop may have run again (a handler in progress, or
    # finished, when the lease ended: its outcome is refused by the fence).
    first_start = {}
    for at, pk, _ in sorted(ran):
        first_start.setdefault(pk, at)
    assert all(first_start[pk] < stopped for pk in twice), summary
    assert max(runs.values()) <= 2, summary
    assert set(runs) == set(ids)
    print(f"\n[stall] {summary}")
