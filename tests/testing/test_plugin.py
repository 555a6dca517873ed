"""The pytest plugin: declared as a ``pytest11`` entry point, importable before Django is set
up (it imports neither Django nor the app), and its fixtures working in a project's own
pytest run, beside a fixture of the project's named ``clock``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from urllib.parse import urlsplit, urlunsplit

from ..conftest import ROOT
from ..tree import reads_the_tree

PLUGIN = "django_durable_scheduler.testing.plugin"
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]

PROJECT_TESTS = """
import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import registry

registry.handler("plugin.echo")(lambda ctx: ctx.payload)


@pytest.fixture
def clock():
    return "the project's own"


def make_work(now):
    scheduler.create_job("echo", "plugin.echo")
    scheduler.enqueue("echo", scheduled_for=now, trigger_key="k", payload={"n": 1})


def test_in_a_transaction(scheduler_testing, scheduler_clock, clock):
    assert clock == "the project's own"
    make_work(scheduler_clock.now)
    scheduler_testing.assert_enqueued(job="echo", count=1)
    (ran,) = scheduler_testing.drain()
    assert ran.result == {"n": 1}


def test_committing(transactional_db, scheduler_drain, scheduler_clock):
    from django.db import connection

    assert not connection.in_atomic_block  # transactional_db wins over the fixture's db
    make_work(scheduler_clock.now)
    assert [run.result for run in scheduler_drain()] == [{"n": 1}]


@pytest.mark.django_db(transaction=True)
def test_marked(scheduler_drain, scheduler_clock):
    from django.db import connection

    assert not connection.in_atomic_block
    scheduler_clock.advance(hours=1)
    make_work(scheduler_clock.now)
    assert [run.status for run in scheduler_drain()] == ["succeeded"]
"""


@reads_the_tree
def test_the_plugin_is_a_pytest_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    if env.get("DATABASE_URL"):  # a test database of its own, not this run's
        url = urlsplit(env["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(url._replace(path=f"{url.path}_plugin"))
    return env


def test_the_plugin_imports_without_django_configured():
    env = {key: value for key, value in _env().items() if key != "DJANGO_SETTINGS_MODULE"}
    code = textwrap.dedent(
        f"""
        import sys
        import {PLUGIN} as plugin
        from django.conf import settings
        assert not settings.configured
        assert "django_durable_scheduler.models" not in sys.modules
        print(sorted(name for name in vars(plugin) if name.startswith("scheduler_")))
        """
    )
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["['scheduler_clock',", "'scheduler_drain',", "'scheduler_testing']"]


def test_the_fixtures_in_a_projects_pytest_run(tmp_path):
    (tmp_path / "test_project.py").write_text(PROJECT_TESTS)
    ran = subprocess.run(
        [*PYTEST, "-p", PLUGIN, "--ds=tests.settings", "test_project.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert "3 passed" in ran.stdout
