"""Crash recovery with real ``runscheduler`` processes: kill -9 mid-handler, kill -9 at random
moments, and a PostgreSQL outage under a running worker. Nothing may be lost or run to
success twice: lease expiry brings killed work back, fencing refuses the dead owner."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence

from ..procs.runner import Workers, granted, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE_MS = 1_700_000_000_000


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def make(job_id, kind, n, *, payload=None, max_attempts=3, principal="crash"):
    scheduler.create_job(
        job_id, kind, authority=granted(principal), payload=payload, max_attempts=max_attempts
    )
    with transaction.atomic():
        return [
            scheduler.enqueue(job_id, scheduled_for=BASE_MS + i, trigger_key=f"t{i}")[0].pk for i in range(n)
        ]


def succeeded_count() -> int:
    return Occurrence.objects.filter(status="succeeded").count()


def assert_each_succeeded_exactly_once(ids):
    """Every occurrence succeeded once, with a result naming itself, and a history that adds up:
    attempt == fence == number of claims, and the success recorded under the final fence."""
    rows = {o.pk: o for o in Occurrence.objects.filter(pk__in=ids)}
    assert len(rows) == len(ids), "an occurrence disappeared"
    statuses = Counter(o.status for o in rows.values())
    assert statuses == {"succeeded": len(ids)}, statuses
    assert not Event.objects.filter(event_type="occurrence_dead_lettered").exists()
    successes = Counter(
        Event.objects.filter(event_type="occurrence_succeeded").values_list("occurrence_id", flat=True)
    )
    assert set(successes) == set(ids)
    assert max(successes.values()) == 1, "an occurrence was recorded as succeeded twice"
    claims = Counter(
        Event.objects.filter(event_type__in=["occurrence_claimed", "occurrence_reclaimed"]).values_list(
            "occurrence_id", flat=True
        )
    )
    final_fence = dict(
        Event.objects.filter(event_type="occurrence_succeeded").values_list("occurrence_id", "fence")
    )
    for pk, occ in rows.items():
        assert occ.result["occurrence"] == pk
        assert occ.result["attempt"] == occ.attempt
        assert occ.attempt == occ.fence == claims[pk], (pk, occ.attempt, occ.fence, claims[pk])
        assert final_fence[pk] == occ.fence
        assert occ.lease_owner is None and occ.lease_expires_at is None


def wait_leases_expired(timeout: float = 60.0) -> None:
    def expired():
        return not Occurrence.objects.filter(status="running", lease_expires_at__gt=timezone.now()).exists()

    assert wait_for(expired, timeout), "leases of killed workers never expired"
    time.sleep(0.1)


# --------------------------------------------------------------------------- kill -9 mid-handler


def test_sigkill_mid_handler_is_reclaimed_after_lease_expiry_and_fenced(workers):
    (pk,) = make("crash-once", "test.crash-once", 1, payload={"seconds": 120})
    a = workers.start("--worker-id", "A", "--lease", "2")
    # The handler itself reports that attempt 1 started (ctx.record_metadata).
    assert wait_for(lambda: Occurrence.objects.filter(pk=pk, metadata={"started": 1}).exists(), 60), (
        a.output()
    )
    # Let A's heartbeat renew the lease at least once (waited for: a loaded machine is slow).
    renewed = Event.objects.filter(occurrence_id=pk, event_type="occurrence_renewed", owner_id="A")
    assert wait_for(renewed.exists, 30), a.output()
    os.kill(a.pid, signal.SIGKILL)
    assert a.wait(30) == -signal.SIGKILL
    killed = Occurrence.objects.get(pk=pk)
    assert (killed.status, killed.lease_owner, killed.attempt, killed.fence) == ("running", "A", 1, 1)
    lease_end = killed.lease_expires_at

    # B starts at once; it must wait for A's lease to run out, then reclaim.
    b = workers.start("--worker-id", "B", "--lease", "30")
    assert wait_for(lambda: Occurrence.objects.filter(pk=pk, status="succeeded").exists(), 60), b.output()
    b.proc.send_signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.output()

    occ = Occurrence.objects.get(pk=pk)
    assert (occ.status, occ.attempt, occ.fence, occ.lease_owner) == ("succeeded", 2, 2, None)
    assert occ.result == {"occurrence": pk, "attempt": 2, "fence": 2}
    events = list(Event.objects.filter(occurrence_id=pk).order_by("event_id"))
    (reclaim,) = [e for e in events if e.event_type == "occurrence_reclaimed"]
    assert (reclaim.owner_id, reclaim.fence) == ("B", 2)
    assert reclaim.data["previousOwner"] == "A"
    assert reclaim.data["previousFence"] == 1
    assert reclaim.data["attempt"] == 2
    assert reclaim.occurred_at >= lease_end, "B took the occurrence before A's lease expired"
    # The dead owner left only its claim and lease renewals behind: no outcome.
    assert {e.event_type for e in events if e.owner_id == "A"} == {"occurrence_claimed", "occurrence_renewed"}
    (success,) = [e for e in events if e.event_type == "occurrence_succeeded"]
    assert (success.owner_id, success.fence) == ("B", 2)

    # A's result arriving late (a zombie) is refused by the fence.
    with pytest.raises(scheduler.LeaseLost) as info:
        scheduler.settle(pk, owner="A", fence=1, outcome="succeeded", result="zombie")
    assert info.value.details["reason"] in {"not_running", "wrong_owner", "wrong_fence"}
    with pytest.raises(scheduler.LeaseLost):
        scheduler.renew(pk, owner="A", fence=1, lease=30)
    occ.refresh_from_db()
    assert occ.result == {"occurrence": pk, "attempt": 2, "fence": 2}
    assert Event.objects.filter(occurrence_id=pk, event_type="occurrence_succeeded").count() == 1


# --------------------------------------------------------------------------- kill -9 anywhere


KILL_ROUNDS = 5
KILL_OCCURRENCES = 50


def test_sigkill_at_random_moments_loses_nothing(workers):
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    print(f"\n[kill -9] seed {seed}")
    # 50 x 0.2 s at concurrency 4: at least 2.5 s of work, so most kills land mid-handler.
    ids = make("kill9", "test.echo", KILL_OCCURRENCES, payload={"seconds": 0.2}, max_attempts=10)
    interrupted = 0
    for round_no in range(KILL_ROUNDS):
        owner = f"k{round_no}"
        proc = workers.start("--worker-id", owner, "--lease", "1", "--concurrency", "4", verbosity=0)
        if round_no == 0:
            # Anywhere from Django's start-up to the first handlers.
            time.sleep(rng.uniform(0.2, 1.5))
        else:
            # Somewhere while this worker is at work.
            assert wait_for(
                lambda owner=owner: (
                    Event.objects.filter(owner_id=owner).exists() or succeeded_count() == KILL_OCCURRENCES
                ),
                60,
            ), proc.output()
            time.sleep(rng.uniform(0.0, 0.5))
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        orphaned = Occurrence.objects.filter(status="running", lease_owner=owner).count()
        interrupted += orphaned > 0
        print(
            f"[kill -9] round {round_no}: succeeded {succeeded_count()}, "
            f"left running by the killed worker {orphaned}"
        )

    wait_leases_expired()
    # A plain worker, stopped once all is done, rather than --burst: --burst can exit early on
    # its own (see test_scale.test_burst_worker_with_one_slot_drains_the_pool).
    final = workers.start("--worker-id", "final", "--lease", "5", "--concurrency", "4")
    assert wait_for(lambda: succeeded_count() == KILL_OCCURRENCES, 120), final.output()
    final.proc.send_signal(signal.SIGTERM)
    assert final.wait(60) == 0, final.output()

    assert_each_succeeded_exactly_once(ids)
    reclaims = Event.objects.filter(event_type="occurrence_reclaimed").count()
    print(f"[kill -9] reclaims {reclaims}")
    assert interrupted >= 1, "no kill landed while handlers were running"
    assert reclaims >= 1


# --------------------------------------------------------------------------- PostgreSQL outage


def _pg_cluster() -> str:
    versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])
    return versions[-1]


def _pg_ctl(action: str, *extra: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", _pg_cluster(), "main", action, *extra],
        check=True,
        capture_output=True,
        timeout=120,
    )


def _pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1"], capture_output=True).returncode == 0


def _pg_start_and_wait() -> None:
    if not _pg_ready():
        try:
            _pg_ctl("start")
        except subprocess.CalledProcessError:
            if not _pg_ready():  # "already running" is fine; anything else is worth seeing
                raise
    if not wait_for(_pg_ready, 120, 0.2):
        raise RuntimeError("PostgreSQL did not come back")


PG_OCCURRENCES = 300


@pytest.mark.restarts_database_server
def test_worker_survives_a_postgresql_outage(workers):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    if not (shutil.which("pg_ctlcluster") and Path("/etc/postgresql").is_dir()):
        pytest.skip("needs a local PostgreSQL cluster managed by pg_ctlcluster")
    ids = make("pg-outage", "test.echo", PG_OCCURRENCES, payload={"seconds": 0.02})
    worker = workers.start("--worker-id", "pg", "--concurrency", "4", "--lease", "10")
    assert wait_for(lambda: succeeded_count() >= 50, 60), worker.output()
    outage_started = time.monotonic()
    try:
        _pg_ctl("stop", "-m", "fast")
        time.sleep(4)
    finally:
        _pg_start_and_wait()
    outage = time.monotonic() - outage_started
    connections.close_all()  # the test's own connection died with the server
    done_at_outage = succeeded_count()
    assert done_at_outage < PG_OCCURRENCES, "the outage came too late to matter"
    assert worker.alive(), "the worker died in the outage:\n" + worker.output()

    assert wait_for(lambda: succeeded_count() == PG_OCCURRENCES, 120, 0.2), worker.output()
    assert worker.alive(), worker.output()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()

    assert_each_succeeded_exactly_once(ids)
    reclaims = Event.objects.filter(event_type="occurrence_reclaimed").count()
    print(
        f"\n[pg outage] {outage:.1f} s down; {done_at_outage} done before it came back; reclaims {reclaims}"
    )
