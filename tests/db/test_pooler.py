"""Behind a transaction-mode pooler (PgBouncer), LISTEN is accepted but never delivers: a
worker finds that out at start (a test notification that does not arrive), says so in one
WARNING line and polls; ``DURABLE_SCHEDULER_LISTEN = False`` skips LISTEN altogether. On
a direct PostgreSQL connection the same test notification arrives and the worker says it
listens. Nothing is prepared unless the database's OPTIONS ask psycopg to
(``server_side_binding`` and ``prepare_threshold``), and the worker says which at start.
tests/run.py's ``pgbouncer`` leg runs this module and the crash tests through a real PgBouncer
in transaction mode (DSCH_POOLER=pgbouncer)."""

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
PREPARED = "psycopg prepares statements"
AS_TEXT = "statements go as text"


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
    # Prepared only where the settings ask psycopg to (never on the pooler's leg).
    prepared = bool(connection.settings_dict["OPTIONS"].get("prepare_threshold"))
    assert (PREPARED in log) == prepared and (AS_TEXT in log) != prepared, log
    assert "Traceback" not in log, log


def test_listen_off_polls_only(workers):
    worker = workers.start("--poll-interval", "0.1", DSCH_LISTEN="0")
    if connection.vendor != "mysql":  # MySQL/MariaDB have no wake-ups to turn off
        assert wait_for(lambda: "wake-ups off" in worker.output(20000) or not worker.alive(), timeout=30)
    ids = enqueue("polled", 20)
    assert wait_for(lambda: all_succeeded_once(ids), timeout=60), worker.output()
    log = worker.output(20000)
    assert NOT_DELIVERED not in log and LISTENING not in log, log
    assert "Traceback" not in log, log


def test_processes_sharing_the_pool_run_each_occurrence_once(workers):
    ids = enqueue("shared", 120)
    started = [workers.start("--burst", "--concurrency", "4") for _ in range(3)]
    for worker in started:
        assert worker.wait(120) == 0, worker.output()
    assert all_succeeded_once(ids)


@pytest.mark.skipif(not BEHIND_POOLER, reason="needs PgBouncer in transaction mode")
def test_enqueues_behind_the_pooler_prepare_nothing(caplog):
    """Enqueues outside a transaction, each on whatever server connection the pooler hands
    out, while another client holds one: none prepares a statement, so none can meet a server
    connection that lacks it; all are written, with their events, and nothing is logged."""
    import psycopg

    scheduler.create_job("alone", "test.ok", authority=granted("pooler"))
    settings = connection.settings_dict
    ids = []
    with (
        psycopg.connect(
            host=settings["HOST"], port=settings["PORT"], user=settings["USER"], dbname=settings["NAME"]
        ) as other,
        caplog.at_level("WARNING", logger="django_durable_scheduler"),
    ):
        for i in range(12):
            if i == 6:
                other.execute("SELECT 1")  # the other client's transaction takes a server connection
            ids.append(scheduler.enqueue("alone", scheduled_for=1_700_000_000_000 + i, trigger_key="t")[0].pk)
        other.rollback()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone() == (0,)
    assert caplog.text == ""
    assert Occurrence.objects.filter(pk__in=ids).count() == 12 == len(set(ids))
    assert Event.objects.filter(occurrence_id__in=ids, event_type="occurrence_enqueued").count() == 12
