"""PostgreSQL LISTEN/NOTIFY: an idle worker wakes on enqueue, not at its next poll."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Occurrence, WorkerHeartbeat

from .conftest import AUTHORITY, ROOT, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"),
]


def test_enqueue_wakes_an_idle_worker():
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("job", "test.ok", authority=AUTHORITY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "runscheduler", "--poll-interval", "60", "--worker-id", "listener"],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not WorkerHeartbeat.objects.filter(pk="listener").exists():
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        time.sleep(1.5)  # let it go idle (its next poll is a minute away)
        occ, _ = scheduler.enqueue("job", scheduled_for=1_700_000_000_000, trigger_key="t")
        started = time.monotonic()
        while not Occurrence.objects.filter(pk=occ.pk, status="succeeded").exists():
            assert time.monotonic() - started < 10, "the enqueue did not wake the worker"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
