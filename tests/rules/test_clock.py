"""One clock for many hosts: ``DURABLE_SCHEDULER_TIME_SOURCE = "database"`` corrects this host's
clock to the database server's, measured with one query per ``DatabaseClock.REFRESH``."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import conf
from django_durable_scheduler.db import dialect
from django_durable_scheduler.models import Occurrence

from ..conftest import ROOT, subprocess_env

SKEW = timedelta(minutes=5)
# SQLite runs on this host: its clock is the host's, so there is nothing to correct.
needs_server = pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite's clock is this host's: nothing to correct"
)


@pytest.fixture
def skewed_host(settings):
    """This host's clock five minutes fast, the time taken from the database."""
    settings.DURABLE_SCHEDULER_CLOCK = lambda: datetime.now(UTC) + SKEW
    settings.DURABLE_SCHEDULER_TIME_SOURCE = "database"
    conf.database_clock.reset()
    yield
    conf.database_clock.reset()


@needs_server
@pytest.mark.django_db
def test_a_host_five_minutes_off_reads_the_database_time(skewed_host):
    server = dialect.server_now("default")
    assert server is not None
    assert abs(conf.now() - server) < timedelta(seconds=2)
    assert abs(conf.now() - datetime.now(UTC)) < timedelta(seconds=2)


@needs_server
@pytest.mark.django_db
def test_the_offset_costs_one_query_per_refresh(skewed_host, monkeypatch):
    with CaptureQueriesContext(connection) as queries:
        for _ in range(100):
            conf.now()
    assert len(queries) == 1
    later = time.monotonic() + conf.DatabaseClock.REFRESH + 1
    monkeypatch.setattr(conf.time, "monotonic", lambda: later)
    with CaptureQueriesContext(connection) as queries:
        conf.now()
        conf.now()
    assert len(queries) == 1


@needs_server
@pytest.mark.django_db
def test_a_database_that_does_not_answer_keeps_the_last_offset(skewed_host, monkeypatch, caplog):
    good = conf.now()
    conf.database_clock._measured_at = None  # due again

    def down(alias):
        raise DatabaseError("server closed the connection")

    monkeypatch.setattr(dialect, "server_now", down)
    with caplog.at_level(logging.WARNING, logger="django_durable_scheduler"):
        again = conf.now()
    assert abs(again - good) < timedelta(seconds=2)
    assert "could not read the database's clock" in caplog.text


@pytest.mark.django_db
def test_the_host_clock_is_the_default(settings):
    settings.DURABLE_SCHEDULER_CLOCK = lambda: datetime(2030, 1, 1, tzinfo=UTC)
    with CaptureQueriesContext(connection) as queries:
        assert conf.now() == datetime(2030, 1, 1, tzinfo=UTC)
    assert len(queries) == 0


def burst(skewed: bool, source: str) -> subprocess.CompletedProcess[str]:
    """``runscheduler --burst`` in a process whose clock is five minutes fast."""
    env = {"DSCH_TIME_SOURCE": source}
    if skewed:
        env.update(
            DSCH_CLOCK_T0=str(int((datetime.now(UTC) + SKEW).timestamp() * 1000)),
            DSCH_CLOCK_START=str(time.time()),
            DSCH_CLOCK_SPEED="1",
        )
    return subprocess.run(
        [sys.executable, "-m", "django", "runscheduler", "--burst", "--poll-interval", "0.05"],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_server
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_clock_is_fast_does_not_claim_early_with_the_database_time():
    scheduler.create_job("later", "test.ok")
    occurrence, _ = scheduler.enqueue(
        "later", scheduled_for=datetime.now(UTC) + timedelta(minutes=2), trigger_key="in-two-minutes"
    )
    done = burst(skewed=True, source="database")
    assert done.returncode == 0, done.stderr[-3000:]
    occurrence.refresh_from_db()
    assert occurrence.status == "queued"  # due in two minutes by the database's clock
    # The same host trusting its own clock runs it three minutes early.
    done = burst(skewed=True, source="host")
    assert done.returncode == 0, done.stderr[-3000:]
    assert Occurrence.objects.get(pk=occurrence.pk).status == "succeeded"
