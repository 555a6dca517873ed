"""Behind a transaction-mode pooler (PgBouncer), LISTEN is accepted but never delivers: a
worker finds that out at start (a test notification that does not arrive), says so in one
WARNING line and polls; ``DURABLE_SCHEDULER_LISTEN = False`` skips LISTEN altogether. On
a direct PostgreSQL connection the same test notification arrives and the worker says it
listens, and that its connection keeps the plans of the claim's reads (``db.kept``), which it
does nowhere else. tests/run.py's ``pgbouncer`` leg runs this module and the crash tests through a real
PgBouncer in transaction mode (DSCH_POOLER=pgbouncer)."""

from __future__ import annotations

import os

import pytest
from django.db import connection, transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import Event, Occurrence

from ..procs.runner import Workers, granted, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEHIND_POOLER = os.environ.get("DSCH_POOLER") == "pgbouncer"
NOT_DELIVERED = "did not deliver a test notification"
LISTENING = "listening for wake-ups"
KEEPING = "keeping the plans of the claim's reads"


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def enqueue(job_id: str, n: int) -> list[str]:
    scheduler.create_job(job_id, "test.ok", authority=granted("pooler"))
    with transaction.atomic():
        return [
            scheduler.enqueue(job_id, scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}")[0].pk
            for i in range(n)
        ]


def all_succeeded_once(ids: list[str]) -> bool:
    done = Occurrence.objects.filter(pk__in=ids, status="succeeded", attempt=1).count() == len(ids)
    claims = Event.objects.filter(occurrence_id__in=ids, event_type="occurrence_claimed").count()
    return done and claims == len(ids)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_a_worker_tells_whether_listen_delivers(workers):
    worker = workers.start("--poll-interval", "0.2")
    said = NOT_DELIVERED if BEHIND_POOLER else LISTENING
    assert wait_for(lambda: said in worker.output(20000), timeout=30), worker.output()
    ids = enqueue("pooled", 20)  # found by a wake-up on a direct connection, by the poll behind a pooler
    assert wait_for(lambda: all_succeeded_once(ids), timeout=60), worker.output()
    log = worker.output(20000)
    assert (NOT_DELIVERED in log) == BEHIND_POOLER and (LISTENING in log) != BEHIND_POOLER, log
    # Plans are kept only where the delivered notification proved that sessions are kept.
    assert (KEEPING in log) != BEHIND_POOLER, log
    assert "Traceback" not in log, log


def test_listen_off_polls_only(workers):
    worker = workers.start("--poll-interval", "0.1", DSCH_LISTEN="0")
    if connection.vendor != "mysql":  # MySQL/MariaDB have no wake-ups to turn off
        assert wait_for(lambda: "wake-ups off" in worker.output(20000) or not worker.alive(), timeout=30)
    ids = enqueue("polled", 20)
    assert wait_for(lambda: all_succeeded_once(ids), timeout=60), worker.output()
    log = worker.output(20000)
    assert NOT_DELIVERED not in log and LISTENING not in log and KEEPING not in log, log
    assert "Traceback" not in log, log


def test_processes_sharing_the_pool_run_each_occurrence_once(workers):
    ids = enqueue("shared", 120)
    started = [workers.start("--burst", "--concurrency", "4") for _ in range(3)]
    for worker in started:
        assert worker.wait(120) == 0, worker.output()
    assert all_succeeded_once(ids)


@pytest.mark.skipif(not BEHIND_POOLER, reason="needs PgBouncer in transaction mode")
def test_an_enqueue_behind_the_pooler_finds_it_out_and_runs_as_text(caplog):
    """A user who left LISTEN on behind a transaction-mode pooler: the enqueue's kept insert
    lands on a server connection that never saw its PREPARE, and runs as text from then on."""
    import psycopg

    from django_durable_scheduler.db import kept

    kept.keep_off(connection.alias)
    scheduler.create_job("alone", "test.ok", authority=granted("pooler"))
    ids = [
        scheduler.enqueue("alone", scheduled_for=1_700_000_000_000 + i, trigger_key="t")[0].pk
        for i in (0, 1, 2)
    ]
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"], port=settings["PORT"], user=settings["USER"], dbname=settings["NAME"]
    ) as other:
        # PgBouncer hands out the server connection used last: the other client's transaction
        # takes the one that holds the insert's PREPARE.
        other.execute("SELECT 1")
        with caplog.at_level("WARNING", logger="django_durable_scheduler"):
            ids += [
                scheduler.enqueue("alone", scheduled_for=1_700_000_000_000 + i, trigger_key="t")[0].pk
                for i in (3, 4, 5)
            ]
        other.rollback()
    assert "does not keep sessions" in caplog.text
    assert Occurrence.objects.filter(pk__in=ids).count() == 6 == len(set(ids))
    assert Event.objects.filter(occurrence_id__in=ids, event_type="occurrence_enqueued").count() == 6
