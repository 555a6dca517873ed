"""A worker whose database connections the server ends (``pg_terminate_backend``, as a restart,
a failover or a pooler does) goes on at once: one WARNING line, no traceback, no back-off, and
nothing is lost or run twice."""

from __future__ import annotations

import pytest
from django.db import connection

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence

from ..procs.runner import Workers, granted, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_terminate_backend is PostgreSQL's"),
]


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def enqueue(job_id: str, first: int, n: int) -> list[str]:
    return [
        scheduler.enqueue(job_id, scheduled_for=1_700_000_000_000 + i, trigger_key="t")[0].pk
        for i in range(first, first + n)
    ]


def succeeded_once(ids: list[str]) -> bool:
    done = Occurrence.objects.filter(pk__in=ids, status="succeeded", attempt=1).count() == len(ids)
    claims = Event.objects.filter(occurrence_id__in=ids, event_type="occurrence_claimed").count()
    return done and claims == len(ids)


def terminate_others() -> int:
    """End every other backend of the test database (the worker's), as an operator's
    ``pg_terminate_backend`` storm would; how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_killed_connections_are_replaced_at_once(workers):
    scheduler.create_job("killed", "test.ok", authority=granted("killed"))
    worker = workers.start("--poll-interval", "0.05")
    first = enqueue("killed", 0, 10)
    assert wait_for(lambda: succeeded_once(first), timeout=60), worker.output()
    ids = list(first)
    for round_ in range(3):
        assert terminate_others() >= 1
        batch = enqueue("killed", 100 * (round_ + 1), 10)
        ids += batch
        assert wait_for(lambda batch=batch: succeeded_once(batch), timeout=60), worker.output(20000)
    assert worker.alive()
    log = worker.output(50000)
    assert "database error in the scheduler loop" in log and "retrying at once" in log, log
    assert "Traceback" not in log, log
    assert succeeded_once(ids)
