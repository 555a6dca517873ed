"""Retention in real ``runscheduler`` processes: of two workers, one at a time runs it and the
history goes exactly once; a SIGKILLed runner's lease runs out and another worker finishes."""

from __future__ import annotations

import json
import os
import re
import signal
from datetime import UTC, datetime, timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Event, MaintenanceLease, Occurrence

from ..conftest import AUTHORITY
from ..procs.runner import Workers, granted, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REMOVED = re.compile(r"retention by (\S+) removed (\d+) occurrences")


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def history(clock, n: int) -> None:
    """``n`` occurrences settled two days ago (the workers' clock is the real one)."""
    clock.set(datetime.now(UTC) - timedelta(days=2))
    scheduler.create_job("old", "reports.send", authority=AUTHORITY)
    for i in range(n):
        occ, _ = kernel.enqueue("old", scheduled_for=clock(), trigger_key=f"schedule:{i}")
        held = kernel.claim(owner="w", lease=60)
        assert held is not None and held.pk == occ.pk
        kernel.settle(held.pk, owner="w", fence=held.fence, outcome="succeeded")


def retention_env(**knobs) -> dict[str, str]:
    ages = {"succeeded": 3600, "dead_letter": 3600, "cancelled": 3600, "job_events": None}
    return {"DSCH_RETENTION": json.dumps({**ages, "period": 1, **knobs})}


def removed(*logs: str) -> dict[str, int]:
    """Occurrences removed per worker, from the INFO lines of their runs."""
    found: dict[str, int] = {}
    for log in logs:
        for worker, n in REMOVED.findall(log):
            found[worker] = found.get(worker, 0) + int(n)
    return found


def test_two_workers_prune_the_history_once(workers, clock):
    history(clock, 12)
    env = retention_env(batch_size=5, pause=0)
    a = workers.start("--worker-id", "A", **env)
    b = workers.start("--worker-id", "B", **env)
    assert wait_for(lambda: not Occurrence.objects.exists(), 60), a.output() + b.output()
    assert wait_for(lambda: MaintenanceLease.objects.filter(expires_at__isnull=True).exists(), 30)
    for worker in (a, b):
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
    by_worker = removed(a.output(100_000), b.output(100_000))
    assert sum(by_worker.values()) == 12, by_worker  # each row went once, by one run
    assert not Event.objects.filter(occurrence__isnull=False).exists()
    row = MaintenanceLease.objects.get(name="retention")
    assert row.owner in {"A", "B"} and row.last_result["ok"] is True


def test_a_killed_runner_is_taken_over_after_its_lease(workers, clock):
    history(clock, 16)
    # One row per batch with a pause: A is mid-run when it is killed.
    env = retention_env(batch_size=1, pause=0.2, lease=2)
    a = workers.start("--worker-id", "A", **env)
    assert wait_for(lambda: Occurrence.objects.count() <= 14, 60), a.output()
    os.kill(a.pid, signal.SIGKILL)
    assert a.wait(30) == -signal.SIGKILL
    held = MaintenanceLease.objects.get(name="retention")
    assert held.owner == "A" and held.expires_at is not None and held.last_finished_at is None
    left = Occurrence.objects.count()
    assert 0 < left < 16

    b = workers.start("--worker-id", "B", **env)
    assert wait_for(lambda: not Occurrence.objects.exists(), 60), b.output()
    assert wait_for(lambda: MaintenanceLease.objects.filter(owner="B", expires_at__isnull=True).exists(), 30)
    b.proc.send_signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.output()
    row = MaintenanceLease.objects.get(name="retention")
    assert row.last_started_at >= held.expires_at, "B took the lease before A's ran out"
    assert removed(b.output(100_000)) == {"B": left}


def test_a_burst_worker_starts_no_retention(workers, clock):
    history(clock, 2)
    # Work that keeps the burst worker up for longer than a retention period.
    scheduler.create_job("nap", "test.sleep", authority=granted("napper"), payload={"seconds": 2.5})
    kernel.enqueue("nap", scheduled_for=clock(), trigger_key="nap")
    burst = workers.start("--worker-id", "burst", "--burst", **retention_env(pause=0))
    assert burst.wait(60) == 0, burst.output()
    assert Occurrence.objects.filter(trigger_key="nap", status="succeeded").exists(), burst.output()
    assert Occurrence.objects.filter(job_id="old").count() == 2 and not MaintenanceLease.objects.exists()
