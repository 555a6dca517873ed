"""Several OS processes claim from one pool: every occurrence is claimed exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from django.db import connection, transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence, WorkerHeartbeat

from ..conftest import AUTHORITY, ROOT, authority_for, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROCESSES = 4
OCCURRENCES = 1000


def test_concurrent_claimers_take_each_occurrence_once():
    for p in range(5):
        scheduler.create_job(f"job-{p}", "k", authority=authority_for(f"p{p}"))
    with transaction.atomic():
        for n in range(OCCURRENCES):
            scheduler.enqueue(f"job-{n % 5}", scheduled_for=1_700_000_000_000 + n, trigger_key=f"t{n}")
    env = subprocess_env(START_AT=str(time.time() + 2.0))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.procs.claim_worker", f"worker-{i}", str(8 + 4 * i)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out.split())
    claimed = Counter(pk for out in outputs for pk in out)
    assert len(claimed) == OCCURRENCES
    assert max(claimed.values()) == 1
    assert all(outputs), "every process should have claimed something"
    assert Occurrence.objects.filter(status="succeeded", attempt=1, fence=1).count() == OCCURRENCES
    assert Event.objects.filter(event_type="occurrence_claimed").count() == OCCURRENCES
    assert not Event.objects.filter(event_type="occurrence_reclaimed").exists()
    print("\n[concurrency] per-process claims:", [len(out) for out in outputs])


def test_concurrent_single_claims_take_turns_across_principals():
    """Processes calling claim() one occurrence at a time, at once: each occurrence is
    claimed once, and the rotation read from the database holds across them: the small
    principals' work is done early although the big one's is all due first."""
    counts = {"big": 150, "b": 30, "c": 30}
    for offset, (pid, count) in enumerate(counts.items()):
        scheduler.create_job(f"job-{pid}", "k", authority=authority_for(pid))
        with transaction.atomic():
            for n in range(count):
                at = 1_700_000_000_000 + offset * 1_000_000 + n
                scheduler.enqueue(f"job-{pid}", scheduled_for=at, trigger_key=f"t{n}")
    env = subprocess_env(START_AT=str(time.time() + 2.0))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.procs.claim_worker", f"single-{i}", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out.split())
    total = sum(counts.values())
    claimed = Counter(pk for out in outputs for pk in out)
    assert len(claimed) == total and max(claimed.values()) == 1
    assert Occurrence.objects.filter(status="succeeded", attempt=1).count() == total
    # In claim order: strict turns would finish b and c by the 90th claim; serving the
    # earliest due first would not start them before the 151st.
    order = list(
        Event.objects.filter(event_type="occurrence_claimed")
        .order_by("event_id")
        .values_list("occurrence__authority__principal__id", flat=True)
    )
    assert len(order) == total
    last_small = max(i for i, pid in enumerate(order) if pid != "big")
    assert last_small < 120, order
    print("\n[fair claims] last claim of b or c at position", last_small + 1, "of", total)


SCHEDULERS = 4
SPEED = 10  # the shared clock runs 10x real time: 40 slots of an every-second job in 4 s


def test_racing_schedulers_fire_each_slot_exactly_once(settings):
    from datetime import UTC, datetime, timedelta

    from ..conftest import Clock

    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    settings.DURABLE_SCHEDULER_CLOCK = Clock(t0)
    for n in range(5):
        scheduler.create_job(
            f"every-{n}", "k", authority=authority_for(f"p{n}"), trigger={"every": 1, "misfire": "run_all"}
        )
    t0_ms = int(t0.timestamp() * 1000)
    env = subprocess_env(
        DSCH_CLOCK_T0=str(t0_ms),
        DSCH_CLOCK_START=str(time.time() + 2.0),
        DSCH_CLOCK_SPEED=str(SPEED),
        DSCH_CLOCK_END=str(t0_ms + 40_000),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.procs.materializer"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(SCHEDULERS)
    ]
    written = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        written.append(int(out.split()[-1]))
    for n in range(5):
        keys = list(Occurrence.objects.filter(job_id=f"every-{n}").values_list("trigger_key", flat=True))
        assert len(keys) == len(set(keys)), "a slot fired twice"
        fired = sorted(datetime.fromisoformat(k.removeprefix("schedule:")) for k in keys)
        # The shared clock stops at t0 + 40 s and the schedulers fire what is due before exiting.
        assert fired == [t0 + timedelta(seconds=i) for i in range(1, 41)], "a slot is missing"
    assert not Event.objects.filter(event_type="slot_skipped").exists()
    assert sum(written) == Occurrence.objects.count()
    print("\n[materialize race] occurrences written per process:", written)


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no row locks: one claimer at a time")
def test_a_row_held_by_another_claimer_is_taken_soon_after_not_at_the_next_poll():
    """A claim that finds the only due row locked by another claimer (SKIP LOCKED) comes
    back empty. The worker then has nothing running that would wake it and no enqueue to
    announce anything: it must look again shortly, not at its next poll a minute away."""
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("job", "test.ok", authority=AUTHORITY)
    occ, _ = scheduler.enqueue("job", scheduled_for=1_700_000_000_000, trigger_key="t")
    proc = None
    try:
        with transaction.atomic():
            # Held as another claimer holds the rows it is claiming, until its commit.
            assert Occurrence.objects.select_for_update().filter(pk=occ.pk).exists()
            proc = subprocess.Popen(
                [sys.executable, "-m", "django", "runscheduler", "--poll-interval", "60", "--worker-id", "w"],
                cwd=ROOT,
                env=subprocess_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 30
            while not WorkerHeartbeat.objects.filter(pk="w").exists():
                assert time.monotonic() < deadline, "worker did not start"
                time.sleep(0.05)
            time.sleep(1.0)  # it has claimed, found the row locked, and gone back to waiting
            assert Occurrence.objects.get(pk=occ.pk).status == "queued"
        released = time.monotonic()
        while Occurrence.objects.get(pk=occ.pk).status != "succeeded":
            assert time.monotonic() - released < 10, "the worker waited for its next poll"
            time.sleep(0.05)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-3000:]
