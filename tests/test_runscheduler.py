"""runscheduler as real OS processes: burst, signals, option validation."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Occurrence

from .conftest import AUTHORITY, ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runscheduler", "--poll-interval", "0.05", *args],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def make(kind, n=1, payload=None):
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job(kind, kind, authority=AUTHORITY, payload=payload)
    return [
        scheduler.enqueue(kind, scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")[0] for i in range(n)
    ]


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_burst_drains_and_exits_zero():
    make("test.ok", 20)
    proc = start("--burst", "--concurrency", "4")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert Occurrence.objects.filter(status="succeeded").count() == 20


def test_sigterm_lets_running_handler_finish_within_grace():
    (occ,) = make("test.sleep", payload={"seconds": 1.5})
    proc = start("--grace", "10", "--worker-id", "w-sig")
    assert wait_for(lambda: Occurrence.objects.filter(pk=occ.pk, status="running").exists())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    occ.refresh_from_db()
    assert (occ.status, occ.result) == ("succeeded", "slept")


def test_sigterm_past_grace_gives_the_lease_up():
    (occ,) = make("test.sleep", payload={"seconds": 30})
    proc = start("--grace", "0.5", "--worker-id", "w-slow", "--lease", "60")
    assert wait_for(lambda: Occurrence.objects.filter(pk=occ.pk, status="running").exists())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    occ.refresh_from_db()
    # Released: another worker can take it at once, without waiting for the 60 s lease.
    assert (occ.status, occ.lease_owner, occ.attempt, occ.fence) == ("queued", None, 0, 1)
    again = scheduler.claim(owner="other", lease=10)
    assert again is not None and again.pk == occ.pk and again.fence == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--lease", "abc"], "--lease"),
        (["--lease", "0"], "--lease"),
        (["--kinds", ","], "--kinds"),
    ],
)
def test_bad_options_are_refused(args, message):
    proc = start(*args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert message in err
