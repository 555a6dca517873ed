"""No wake-up is lost: a worker whose next poll is a minute away starts every occurrence
enqueued while it is idle or busy (claiming, settling, running handlers) at once, and not
at that poll. PostgreSQL wakes it by NOTIFY, a file-backed SQLite database by a datagram
(django_durable_scheduler.db.wakeup). And a worker's claim batches follow its handlers' speed,
not its thread count."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from django.db import connection

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence, WorkerHeartbeat
from django_durable_scheduler.rules import events

from ..conftest import AUTHORITY, ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Far below the worker's poll interval (60 s), far above a wake-up's latency: an occurrence
# that starts later than this waited for something other than its wake-up.
BOUND = 1.0


@pytest.mark.skipif(
    connection.vendor not in ("postgresql", "sqlite"),
    reason="MySQL/MariaDB have no wake-ups: workers find new work at their next poll",
)
def test_every_enqueue_wakes_the_worker_whether_idle_or_busy():
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("stamp", "test.stamp", authority=AUTHORITY)
    # Two handler threads: the sleeping handlers below sometimes leave it no free slot.
    args = ["--poll-interval", "60", "--concurrency", "2", "--worker-id", "woken"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "runscheduler", *args],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rng = random.Random(22)
    enqueued: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 30
        while not WorkerHeartbeat.objects.filter(pk="woken").exists():
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        time.sleep(0.5)  # idle: its first turns are over
        for n in range(40):
            time.sleep(rng.uniform(0, 0.3))
            # Every third one keeps a handler thread busy a while, so that later enqueues
            # arrive while the worker runs, settles and claims, or has no free thread.
            seconds = 0.1 if n % 3 == 0 else 0
            at = time.time()
            occ, _ = scheduler.enqueue(
                "stamp", scheduled_for=0, trigger_key=f"k{n}", payload={"seconds": seconds}
            )
            enqueued[occ.pk] = at
        deadline = time.monotonic() + 60
        while Occurrence.objects.filter(pk__in=enqueued, status="succeeded").count() < len(enqueued):
            assert time.monotonic() < deadline, "not every occurrence ran"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    delays = {
        occ.pk: occ.result["started"] - enqueued[occ.pk] for occ in Occurrence.objects.filter(pk__in=enqueued)
    }
    print("start delays (ms):", sorted(round(d * 1000) for d in delays.values()))
    late = {pk: round(delay, 3) for pk, delay in delays.items() if delay > BOUND}
    assert not late, f"started more than {BOUND} s after their enqueue: {late}"


def test_one_thread_with_fast_handlers_claims_batches_larger_than_a_thread_count_multiple():
    """With --concurrency 1 and no-op handlers the worker claims far more than 32 at a time
    (the old cap: 32 per handler thread), and each occurrence still runs exactly once."""
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("fast", "test.ok", authority=AUTHORITY)
    total = 300
    scheduler.enqueue_many("fast", [{"scheduled_for": 0, "trigger_key": f"f{n}"} for n in range(total)])
    done = subprocess.run(
        [sys.executable, "-m", "django", "runscheduler", "--burst", "--concurrency", "1", "--worker-id", "1"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert Occurrence.objects.filter(job_id="fast", status="succeeded", attempt=1).count() == total
    claims = Event.objects.filter(job_id="fast", event_type=events.OCCURRENCE_CLAIMED)
    assert claims.count() == total, "each occurrence was claimed once"
    # One claim writes its events in one transaction at one time: a batch is a group of them.
    batches = Counter(claims.values_list("occurred_at", flat=True))
    print("claim batches:", sorted(batches.values(), reverse=True))
    assert max(batches.values()) > 32, sorted(batches.values())
