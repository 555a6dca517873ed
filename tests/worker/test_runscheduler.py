"""runscheduler as real OS processes: burst, signals, option validation."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Occurrence

from ..conftest import AUTHORITY, ROOT, run_python, subprocess_env

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


SIGNAL_WHILE_LOCKED = """
import os, signal, threading, time
import django
django.setup()
from django_durable_scheduler.worker import Worker
worker = Worker(worker_id="sig", poll_interval=60)
worker.install_signal_handlers()
# The main thread holds the wake-up event's lock, as it does inside Event.wait and Event.clear;
# the handler runs here, in this thread. (It used to call Event.set: it waited forever.)
with worker.waker.event._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
print("handler returned", flush=True)
deadline = time.monotonic() + 20
while not (worker.stopping and worker.waker.event.is_set()):  # stop() sets both, in turn
    assert time.monotonic() < deadline, "the signal did not stop the worker"
    time.sleep(0.01)
print("stopping", flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # a second signal: exit at once, status 1
time.sleep(20)
print("still running", flush=True)
"""


def test_a_signal_while_the_main_thread_holds_the_wake_lock_still_stops_the_worker():
    proc = run_python(SIGNAL_WHILE_LOCKED)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.split("\n")[:2] == ["handler returned", "stopping"], (out, err[-2000:])
    assert proc.returncode == 1, (out, err[-2000:])
    assert "second signal: exiting at once" in err
