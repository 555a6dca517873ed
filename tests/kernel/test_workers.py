"""The workers table's writes: a worker's row written whole (an insert the first time), beaten
with one UPDATE, and beaten in the transaction of a lease renewal."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Occurrence, WorkerHeartbeat

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db


def record(worker_id: str, started_at, kinds=("test.ok",)) -> kernel.WorkerRecord:
    return kernel.WorkerRecord(
        worker_id=worker_id, hostname="h", pid=7, concurrency=2, kinds=list(kinds), started_at=started_at
    )


def test_record_worker_inserts_then_rewrites_the_whole_row(clock):
    started = clock()
    kernel.record_worker(record("w-1", started), at=started)
    row = WorkerHeartbeat.objects.get(pk="w-1")
    assert (row.hostname, row.pid, row.concurrency, row.kinds) == ("h", 7, 2, ["test.ok"])
    assert (row.started_at, row.last_seen_at, row.stopped_at) == (started, started, None)
    clock.advance(5)
    kernel.record_worker(record("w-1", started, kinds=["a", "b"]), at=clock(), stopped=True)
    row = WorkerHeartbeat.objects.get(pk="w-1")
    assert (row.kinds, row.started_at, row.last_seen_at, row.stopped_at) == (
        ["a", "b"],
        started,
        clock(),
        clock(),
    )
    assert WorkerHeartbeat.objects.count() == 1


def test_beat_worker_updates_when_it_was_seen_and_stopped(clock, django_assert_num_queries):
    started = clock()
    kernel.record_worker(record("w-2", started), at=started)
    clock.advance(3)
    with django_assert_num_queries(1):
        kernel.beat_worker("w-2", at=clock())
    row = WorkerHeartbeat.objects.get(pk="w-2")
    assert (row.started_at, row.last_seen_at, row.stopped_at) == (started, clock(), None)
    clock.advance(1)
    kernel.beat_worker("w-2", at=clock(), stopped=True)
    row = WorkerHeartbeat.objects.get(pk="w-2")
    assert (row.last_seen_at, row.stopped_at) == (clock(), clock())


def test_beat_worker_writes_no_row_that_was_never_recorded(clock):
    kernel.beat_worker("w-none", at=clock())
    assert not WorkerHeartbeat.objects.filter(pk="w-none").exists()


def test_renew_and_beat_renews_the_leases_and_beats_the_row(clock):
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("beat", "test.ok", authority=AUTHORITY)
    scheduler.enqueue("beat", scheduled_for=1_700_000_000_000, trigger_key="t")
    (claimed,) = kernel.claim_batch(owner="w-3", lease=30, limit=1)
    kernel.record_worker(record("w-3", clock()), at=clock())
    clock.advance(10)
    renewals = kernel.renew_and_beat([(claimed.pk, claimed.fence)], owner="w-3", lease=30)
    assert renewals.renewed == {claimed.pk}
    assert Occurrence.objects.get(pk=claimed.pk).lease_expires_at == clock() + timedelta(seconds=30)
    assert WorkerHeartbeat.objects.get(pk="w-3").last_seen_at == clock()
