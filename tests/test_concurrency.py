"""Several OS processes claim from one pool: every occurrence is claimed exactly once."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence

from .conftest import ROOT, authority_for, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROCESSES = 4
OCCURRENCES = 2000


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
