"""The workers' own alias (docs/scaling.md, "Prepared statements"): ``runscheduler --database
scheduler`` to the same PostgreSQL database as "default", with psycopg's preparation turned on
in that alias's OPTIONS. Work enqueued through "default" runs once each; the worker says that
its statements are prepared; the enqueuing connection, which the app does not own, prepares
nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import connection

from ..conftest import ROOT, subprocess_env
from ..procs.scratch import scratch_database

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's preparation is PostgreSQL's"),
]

SETTINGS = "tests.procs.worker_alias_settings"

ENQUEUE = """
import django, json
django.setup()
import django_durable_scheduler as scheduler
from django.db import connection
from tests.procs.runner import granted
scheduler.create_job("aliased", "test.ok", authority=granted("alias"))
for n in range(30):
    scheduler.enqueue("aliased", scheduled_for=1_700_000_000_000 + n, trigger_key=f"slot:{n}")
with connection.cursor() as cursor:
    cursor.execute("SELECT count(*) FROM pg_prepared_statements")
    print(json.dumps(cursor.fetchone()[0]))
"""

COUNT = """
import django, json
django.setup()
from django_durable_scheduler.models import Event, Occurrence
print(json.dumps([
    sorted(set(Occurrence.objects.values_list("status", "attempt"))),
    Event.objects.filter(event_type="occurrence_claimed").count(),
]))
"""


def run(url: str, *args: str) -> str:
    env = subprocess_env(DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS)
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def test_a_worker_alias_prepares_and_the_web_alias_does_not(tmp_path):
    with scratch_database(tmp_path, "dsch_worker_alias") as url:
        run(url, "-m", "django", "migrate", "--verbosity", "0")
        assert json.loads(run(url, "-c", ENQUEUE).splitlines()[-1]) == 0
        log = run(
            url, "-m", "django", "runscheduler", "--burst", "--database", "scheduler", "--verbosity", "2"
        )
        assert "database 'scheduler': psycopg prepares statements run 5 times" in log, log
        assert "Traceback" not in log, log
        statuses, claims = json.loads(run(url, "-c", COUNT).splitlines()[-1])
        assert statuses == [["succeeded", 1]] and claims == 30
