"""``runscheduler`` on a database without this app's migrations (none at all, or all but the
last) exits non-zero with one line that says to migrate and names what is missing, instead
of retrying its first query forever."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db.migrations.loader import MigrationLoader

from .conftest import ROOT, subprocess_env
from .procs.scratch import scratch_database

pytestmark = pytest.mark.slow

APP = "durable_scheduler"


def migrations() -> list[str]:
    """This app's migrations, in the order they apply (read from the code, not a database)."""
    graph = MigrationLoader(None).graph
    (leaf,) = graph.leaf_nodes(APP)
    return [f"{app}.{name}" for app, name in graph.forwards_plan(leaf) if app == APP]


def manage(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=subprocess_env(DATABASE_URL=url),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args)} did not exit within {timeout} s:\n{exc.stderr!r}"[-4000:])


def assert_refused(url: str, options: list[str], missing: list[str]) -> None:
    proc = manage(url, "runscheduler", "--poll-interval", "0.05", *options, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0, proc.stderr
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert "Traceback" not in proc.stderr and "manage.py migrate" in line, line
    named = [name for name in migrations() if name in line]
    assert named == missing, line


def test_runscheduler_refuses_a_database_it_cannot_run_on(tmp_path):
    everything = migrations()
    assert everything[2].startswith(f"{APP}.0003_") and len(everything) > 3
    modes = (["--burst"], [])  # a burst run and one that would run forever
    with scratch_database(tmp_path, "dsch_unmigrated") as url:
        for options in modes:
            assert_refused(url, options, everything)  # a new, empty database

        migrated = manage(url, "migrate", APP, "0003", "--verbosity", "0")
        assert migrated.returncode == 0, migrated.stderr
        for options in modes:
            assert_refused(url, options, everything[3:])  # the tables exist, 0004 is not applied

        migrated = manage(url, "migrate", "--verbosity", "0")
        assert migrated.returncode == 0, migrated.stderr
        ran = manage(url, "runscheduler", "--burst", "--poll-interval", "0.05")
        assert ran.returncode == 0, ran.stderr


@pytest.mark.django_db
def test_a_migrated_database_lacks_nothing():
    from django.db import connection

    from django_durable_scheduler.checks import unapplied_migrations

    assert unapplied_migrations(connection) == []
