"""A throttle held by three real ``runscheduler`` processes, one of them SIGKILLed mid-run
(docs/design.md, "Throttles"): the starts of each key, as the database clock recorded them
(the claim and reclaim events), never come more than ``limit + burst`` in any ``period``."""

from __future__ import annotations

import os
import signal
from datetime import timedelta

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence

from ..procs.runner import Workers, granted, wait_for
from ..testapp import tasks  # noqa: F401  (the handlers, as a worker has them)

THROTTLE = {"limit": 4, "period": 1, "burst": 2, "key": "{customer}"}


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def most_in_a_period(starts: list, period: timedelta) -> int:
    """The most starts in any half-open window ``[t, t + period)``."""
    starts = sorted(starts)
    return max((sum(1 for other in starts if start <= other < start + period) for start in starts), default=0)


@pytest.mark.django_db(transaction=True)
def test_three_workers_hold_a_throttle_per_key_with_one_killed(workers, tmp_path):
    log = tmp_path / "runs.log"
    scheduler.create_job(
        "throttled", "test.limited", authority=granted("alice"), max_attempts=5, throttle=THROTTLE
    )
    payloads = [{"log": str(log), "customer": c, "seconds": 0.05} for c in "a" * 24 + "b" * 12]
    with transaction.atomic():
        for i, payload in enumerate(payloads):
            scheduler.enqueue(
                "throttled", scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}", payload=payload
            )
    started = [workers.start("--worker-id", f"W{n}", "--concurrency", "4", "--lease", "3") for n in range(3)]
    done = Occurrence.objects.filter(status="succeeded")
    assert wait_for(lambda: done.count() >= 8, 120), [w.output() for w in started]
    os.kill(started[0].pid, signal.SIGKILL)
    assert started[0].wait(30) == -signal.SIGKILL
    assert wait_for(lambda: done.count() == len(payloads), 180), [w.output() for w in started[1:]]
    for worker in started[1:]:
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
    customer = {row.pk: row.payload["customer"] for row in Occurrence.objects.all()}
    starts: dict[str, list] = {"a": [], "b": []}
    for occurrence, at in Event.objects.filter(
        event_type__in=["occurrence_claimed", "occurrence_reclaimed"]
    ).values_list("occurrence_id", "occurred_at"):
        starts[customer[occurrence]].append(at)
    period = timedelta(seconds=THROTTLE["period"])
    allowed = THROTTLE["limit"] + THROTTLE["burst"]
    assert len(starts["a"]) >= 24 and len(starts["b"]) >= 12
    assert most_in_a_period(starts["a"], period) <= allowed
    assert most_in_a_period(starts["b"], period) <= allowed
    # Keys are throttled apart: b's work ran while a's backlog waited.
    assert min(starts["b"]) < max(starts["a"]) - period
    # Over the rate waits in the queue: no refusal, no event of its own.
    assert not Event.objects.filter(event_type__in=["authority_denied", "authority_deferred"]).exists()
