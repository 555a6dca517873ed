"""Concurrency limits (docs/design.md, "Concurrency limits"): a policy's ``max_running``, a
job's ``concurrency`` and a handler's ``concurrency`` per ``concurrency_key``, held by every
claimer: in one process first, then with real ``runscheduler`` processes racing and one of
them killed while it holds a place."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.admin import dashboard
from django_durable_scheduler.kernel import claiming
from django_durable_scheduler.models import ConcurrencySlot, Event, Occurrence

from ..conftest import authority_for
from ..procs.runner import Workers, granted, wait_for
from ..testapp import tasks  # noqa: F401  (the handlers, with their limits, as a worker has them)

BASE_MS = 1_700_000_000_000


def cap(principal: str, max_running: int | None) -> None:
    """Give ``principal`` (of tests.run) a policy with this ``max_running``."""
    scheduler.set_policy(
        "user",
        principal,
        capabilities=["tests.run"],
        window=timedelta(hours=24),
        max_runs=100_000,
        max_units=100_000,
        max_running=max_running,
    )


def make(job_id: str, kind: str, payloads: list[dict], principal: str, **job) -> list[str]:
    scheduler.create_job(job_id, kind, authority=granted(principal), **{"max_attempts": 5, **job})
    with transaction.atomic():
        return [
            scheduler.enqueue(job_id, scheduled_for=BASE_MS + i, trigger_key=f"t{i}", payload=p)[0].pk
            for i, p in enumerate(payloads)
        ]


def principal_of(row) -> str:
    return row.authority["principal"]["id"]


# --------------------------------------------------------------------------- in one process


@pytest.mark.django_db
def test_a_capped_principal_is_passed_over_and_others_still_claimed(clock):
    cap("capped", 1)
    capped = make("capped", "k", [{}, {}, {}], "capped")
    free = make("free", "k", [{}, {}], "free")
    claimed = scheduler.claim_batch(owner="w", lease=60, limit=10)
    assert sorted(principal_of(row) for row in claimed) == ["capped", "free", "free"]
    # Over the limit: not claimed, no attempt used, no event.
    waiting = Occurrence.objects.filter(pk__in=capped, status="queued")
    assert waiting.count() == 2 and {row.attempt for row in waiting} == {0}
    assert not Event.objects.filter(occurrence_id__in=[row.pk for row in waiting]).exclude(
        event_type="occurrence_enqueued"
    )
    assert scheduler.claim_batch(owner="w", lease=60, limit=10) == []
    (held,) = [row for row in claimed if principal_of(row) == "capped"]
    scheduler.settle(held.pk, owner="w", fence=held.fence, outcome="succeeded")
    (next_one,) = scheduler.claim_batch(owner="w", lease=60, limit=10)
    assert principal_of(next_one) == "capped"
    assert set(free) <= set(Occurrence.objects.filter(status="running").values_list("pk", flat=True))


@pytest.mark.django_db
def test_an_expired_lease_gives_its_place_back(clock):
    cap("capped", 1)
    first, second = make("capped", "k", [{}, {}], "capped", max_attempts=1)
    (row,) = scheduler.claim_batch(owner="w", lease=10, limit=10)
    assert row.pk == first
    clock.advance(seconds=11)
    # The expired holder (final attempt) is swept; its place comes back for the next.
    (row,) = scheduler.claim_batch(owner="w2", lease=10, limit=10)
    assert row.pk == second
    assert Occurrence.objects.get(pk=first).status == "dead_letter"


@pytest.mark.django_db
def test_a_job_limit_counts_per_concurrency_key(clock):
    payloads = [{"customer": c} for c in ("a", "a", "b", "b", "c")]
    make("per-key", "k", payloads, "alice", concurrency=1, concurrency_key="{customer}")
    assert sorted(Occurrence.objects.values_list("concurrency_key", flat=True)) == ["a", "a", "b", "b", "c"]
    claimed = scheduler.claim_batch(owner="w", lease=60, limit=10)
    assert sorted(row.payload["customer"] for row in claimed) == ["a", "b", "c"]
    # Lowered or raised with update_job: the next claim reads the job's limit.
    scheduler.update_job("per-key", expected_revision=1, concurrency=2)
    assert sorted(r.payload["customer"] for r in scheduler.claim_batch(owner="w", lease=60, limit=10)) == [
        "a",
        "b",
    ]
    # One slot row per key, holding that key's claims.
    assert ConcurrencySlot.objects.count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize("forget_keys", [False, True])
def test_a_handler_limit_per_key_and_a_job_without_one(clock, tmp_path, forget_keys):
    payloads = [{"customer": c, "log": str(tmp_path / "log")} for c in ("a", "a", "b")]
    ids = make("handler-key", "test.per-customer", payloads, "alice")
    # Computed at enqueue where the handler is registered (here: tests.testapp.tasks).
    keyed = list(Occurrence.objects.filter(pk__in=ids).values_list("concurrency_key", flat=True))
    assert keyed == ["a", "a", "b"]
    if forget_keys:  # as if enqueued where the handler was not imported: keyed at claim
        Occurrence.objects.filter(pk__in=ids).update(concurrency_key=None)
    claimed = scheduler.claim_batch(owner="w", lease=60, limit=10)
    assert sorted(row.payload["customer"] for row in claimed) == ["a", "b"]
    unlimited = make("plain", "k", [{}, {}], "alice")
    assert {row.pk for row in scheduler.claim_batch(owner="w", lease=60, limit=10)} == set(unlimited)
    assert set(Occurrence.objects.filter(pk__in=unlimited).values_list("concurrency_key", flat=True)) == {
        None
    }


@pytest.mark.django_db
def test_the_worker_claim_holds_the_policy_limit_and_the_dashboard_shows_it(clock):
    cap("capped", 2)
    make("capped", "k", [{}] * 4, "capped")
    make("free", "k", [{}] * 3, "free")
    batch = claiming.claim_authorized(owner="w", lease=60, limit=10)
    assert sorted(principal_of(row) for row in batch.runnable) == ["capped"] * 2 + ["free"] * 3
    assert not batch.refused and not batch.unpriced
    limits = dashboard.concurrency_limits()
    assert {"scope": "principal", "name": "user:capped", "running": 2, "limit": 2} in limits


@pytest.mark.django_db
def test_bad_concurrency_key_at_enqueue_writes_nothing(clock):
    scheduler.create_job(
        "keyed", "k", authority=authority_for("alice", "x.run"), concurrency_key="{customer}"
    )
    before = Occurrence.objects.count(), Event.objects.count()
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.enqueue("keyed", scheduled_for=BASE_MS, trigger_key="t", payload={"other": 1})
    assert info.value.details["field"] == "concurrency_key"
    assert (Occurrence.objects.count(), Event.objects.count()) == before


@pytest.mark.django_db
def test_a_changed_key_template_keys_the_next_enqueue_in_the_same_process(clock):
    scheduler.create_job("rekeyed", "k", authority=authority_for("alice", "x.run"), concurrency_key="{a}")
    scheduler.enqueue("rekeyed", scheduled_for=BASE_MS, trigger_key="t1", payload={"a": 1})
    scheduler.update_job("rekeyed", expected_revision=1, concurrency_key="{b}")
    occurrence, _ = scheduler.enqueue("rekeyed", scheduled_for=BASE_MS, trigger_key="t2", payload={"b": 2})
    assert occurrence.concurrency_key == "2"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 10_001}, "concurrency"),
        ({"concurrency": "2"}, "concurrency"),
        ({"concurrency_key": 5}, "concurrency_key"),
        ({"concurrency_key": "{a.b}"}, "concurrency_key"),
        ({"concurrency_key": "x" * 257}, "concurrency_key"),
    ],
)
def test_a_bad_handler_limit_is_refused_at_registration(kwargs, field):
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.handler("test.never-registered", **kwargs)
    assert info.value.details["field"] == field
    from django_durable_scheduler.handlers import registry

    assert registry.get_handler("test.never-registered") is None


# --------------------------------------------------------------------------- real workers


def runs(log: Path) -> list[tuple[float, str, str, str]]:
    """(time, start|end, occurrence, customer) of every recorded handler start and end."""
    lines = log.read_text().splitlines() if log.exists() else []
    found = []
    for line in lines:
        event, at, occurrence, customer = line.split()
        found.append((float(at), event, occurrence, customer))
    return sorted(found, key=lambda item: (item[0], item[1] != "start"))  # a start before a tied end


def most_at_once(events, keep=lambda occurrence, customer: True) -> int:
    running = most = 0
    for _, event, occurrence, customer in events:
        if keep(occurrence, customer):
            running += 1 if event == "start" else -1
            most = max(most, running)
    return most


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def stop(workers_list) -> None:
    for worker in workers_list:  # one still starting up would die of the signal, not stop
        assert wait_for(lambda w=worker: w.in_loop() or not w.alive(), 90), worker.output()
    for worker in workers_list:
        worker.proc.send_signal(signal.SIGTERM)
    for worker in workers_list:
        assert worker.wait(60) == 0, worker.output()


@pytest.mark.django_db(transaction=True)
def test_three_workers_never_run_more_than_the_policy_allows(workers, tmp_path):
    log = tmp_path / "runs.log"
    capped_ids = make("capped", "test.limited", [{"log": str(log), "seconds": 0.4}] * 8, "capped")
    cap("capped", 2)
    free_ids = make("free", "test.limited", [{"log": str(log), "seconds": 0.4}] * 4, "free")
    started = [workers.start("--worker-id", f"W{n}", "--concurrency", "4", "--lease", "30") for n in range(3)]
    done = Occurrence.objects.filter(status="succeeded")
    assert wait_for(lambda: done.count() == 12, 120), [w.output() for w in started]
    stop(started)
    events = runs(log)
    capped = set(capped_ids)
    assert most_at_once(events, lambda occurrence, _: occurrence in capped) == 2
    # The free principal's work ran meanwhile, not after the capped backlog.
    last_capped_start = max(
        at for at, event, occurrence, _ in events if event == "start" and occurrence in capped
    )
    first_free_end = min(
        at for at, event, occurrence, _ in events if event == "end" and occurrence in free_ids
    )
    assert first_free_end < last_capped_start
    # Passed over, never refused: one attempt each, no denial or deferral.
    assert set(Occurrence.objects.values_list("attempt", flat=True)) == {1}
    assert not Event.objects.filter(event_type__in=["authority_denied", "authority_deferred"]).exists()


@pytest.mark.django_db(transaction=True)
def test_one_run_at_a_time_per_customer_across_workers(workers, tmp_path):
    log = tmp_path / "runs.log"
    payloads = [{"log": str(log), "customer": c, "seconds": 0.3} for c in "ababab"]
    make("customers", "test.per-customer", payloads, "alice")
    started = [workers.start("--worker-id", f"W{n}", "--concurrency", "3", "--lease", "30") for n in range(3)]
    assert wait_for(lambda: Occurrence.objects.filter(status="succeeded").count() == 6, 120), [
        w.output() for w in started
    ]
    stop(started)
    events = runs(log)
    assert most_at_once(events, lambda _, customer: customer == "a") == 1
    assert most_at_once(events, lambda _, customer: customer == "b") == 1
    assert most_at_once(events) == 2  # two customers ran in parallel


@pytest.mark.django_db(transaction=True)
def test_a_killed_workers_place_comes_back_with_its_lease(workers, tmp_path):
    log = tmp_path / "runs.log"
    hung, queued = make(
        "one-at-a-time",
        "test.limited",
        [{"log": str(log), "hang": True}, {"log": str(log), "seconds": 0.1}],
        "alice",
        concurrency=1,
    )
    a = workers.start("--worker-id", "A", "--concurrency", "4", "--lease", "2")
    assert wait_for(lambda: any(item[2] == hung for item in runs(log)), 60), a.output()
    time.sleep(1.0)  # A would take the second if the limit did not hold it back
    assert Occurrence.objects.get(pk=queued).status == "queued"
    os.kill(a.pid, signal.SIGKILL)
    assert a.wait(30) == -signal.SIGKILL
    lease_end = Occurrence.objects.get(pk=hung).lease_expires_at
    b = workers.start("--worker-id", "B", "--concurrency", "4", "--lease", "30")
    done = Occurrence.objects.filter(pk__in=[hung, queued], status="succeeded")
    assert wait_for(lambda: done.count() == 2, 60), b.output()
    stop([b])
    events = runs(log)
    starts = [at for at, event, occurrence, _ in events if event == "start" and occurrence == queued]
    assert len(starts) == 1 and starts[0] >= lease_end.timestamp()
    assert most_at_once([item for item in events if item[0] >= lease_end.timestamp()]) == 1
    assert Occurrence.objects.get(pk=queued).attempt == 1


@pytest.mark.django_db(transaction=True)
def test_racing_claimers_take_exactly_the_limits_places(tmp_path):
    """Four processes claim at the same moment, nobody settles: the capped principal's runs
    and each customer's come to exactly their limits, and the free principal's all run."""
    import subprocess
    import sys

    from ..conftest import ROOT, subprocess_env

    cap("capped", 2)
    make("capped", "k", [{}] * 10, "capped")
    make(
        "keyed",
        "k",
        [{"customer": c} for c in "aaaabbbb"],
        "keyed",
        concurrency=1,
        concurrency_key="{customer}",
    )
    make("free", "k", [{}] * 5, "free")
    env = subprocess_env(START_AT=str(time.time() + 3), ROUNDS="8")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.procs.limit_racer", f"racer-{n}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in outputs]
    running = Occurrence.objects.filter(status="running")
    assert running.filter(job_id="capped").count() == 2
    assert sorted(running.filter(job_id="keyed").values_list("concurrency_key", flat=True)) == ["a", "b"]
    assert running.filter(job_id="free").count() == 5
    assert sum(int(out) for out, _ in outputs) == 9
