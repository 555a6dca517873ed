"""Database routers: with this app's tables in a database of their own, chosen by a router,
the API, ``runscheduler`` and the other commands work there without ``using=`` or
``--database``, and never touch the default database (which lacks the tables, so a
misrouted query fails). ``--database`` and ``using=`` still choose; an unknown alias is
refused in one line; a router that splits the app's models is a system check error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from ..conftest import ROOT, subprocess_env
from ..procs.scratch import scratch_database

pytestmark = pytest.mark.slow

SETTINGS = "tests.procs.routed_settings"

ENQUEUE = """
import django, json
django.setup()
import django_durable_scheduler as scheduler
from django.db import connections
scheduler.create_job("routed", "test.ok")
for n in range(5):
    scheduler.enqueue("routed", scheduled_for=1_700_000_000_000 + n, trigger_key=f"slot:{n}")
print(json.dumps(sorted(connections["scheduler"].introspection.table_names())))
"""

COUNT = """
import django, json
django.setup()
from django_durable_scheduler.models import Occurrence
print(json.dumps({alias: sorted(Occurrence.objects.using(alias).values_list("status", flat=True))
                  for alias in ["scheduler"]}))
"""


def run(urls: tuple[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    other, scheduler = urls
    env = subprocess_env(DATABASE_URL=scheduler, DSCH_OTHER_URL=other, DJANGO_SETTINGS_MODULE=SETTINGS)
    try:
        return subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args)} did not exit within {timeout} s:\n{exc.stderr!r}"[-4000:])


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """Two scratch databases of this leg's kind, migrated through the router."""
    tmp = tmp_path_factory.mktemp("routed")
    with scratch_database(tmp, "dsch_routed_other") as other, scratch_database(tmp, "dsch_routed") as sched:
        urls = (other, sched)
        ok(run(urls, "-m", "django", "migrate", "--verbosity", "0"))
        ok(run(urls, "-m", "django", "migrate", "--database", "scheduler", "--verbosity", "0"))
        yield urls


def test_the_router_chooses_the_database(routed):
    tables = json.loads(ok(run(routed, "-c", ENQUEUE)))
    assert "durable_scheduler_occurrences" in tables
    ok(run(routed, "-m", "django", "runscheduler", "--burst", "--poll-interval", "0.05"))
    statuses = json.loads(ok(run(routed, "-c", COUNT)))
    assert statuses == {"scheduler": ["succeeded"] * 5}
    status = json.loads(ok(run(routed, "-m", "django", "scheduler_status", "--json")))
    assert status["due"] == 0 and status["stopped_workers"] == 1, status
    ok(run(routed, "-m", "django", "scheduler_sync", "--database", "scheduler"))


def test_an_unknown_database_alias_is_refused(routed):
    proc = run(routed, "-m", "django", "runscheduler", "--burst", "--database", "nope")
    assert proc.returncode == 2
    assert "'nope' is not in DATABASES" in proc.stderr and "scheduler" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_naming_the_default_database_reaches_it(routed):
    # The default database has no scheduler tables: --database wins over the router, and
    # runscheduler says in one line that the database is not migrated.
    proc = run(routed, "-m", "django", "runscheduler", "--burst", "--database", "default")
    assert proc.returncode != 0
    assert "database 'default' has no table" in proc.stderr and "Traceback" not in proc.stderr


class SplitRouter:
    def db_for_write(self, model, **hints):
        return "other" if model._meta.model_name == "event" else None


def test_a_router_that_splits_the_app_is_an_error():
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.SplitRouter"]):
        errors = [m for m in run_checks() if m.id == "durable_scheduler.E004"]
    assert len(errors) == 1
    assert "Event -> other" in errors[0].msg and "Occurrence -> default" in errors[0].msg
    assert [m for m in run_checks() if m.id == "durable_scheduler.E004"] == []
