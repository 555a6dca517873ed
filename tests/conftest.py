from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from .browser import browser  # noqa: F401 (a fixture the browser tests share)

# The fixtures of django_durable_scheduler.testing (its pytest plugin), also where the package
# is imported from a checkout rather than installed with its entry point.
pytest_plugins = ["django_durable_scheduler.testing.plugin"]

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """A settable clock for the scheduler (``DURABLE_SCHEDULER_CLOCK``)."""

    def __init__(self, start: datetime) -> None:
        self.current = start

    def __call__(self) -> datetime:
        return self.current

    def advance(self, seconds: float = 0, **kwargs: float) -> datetime:
        self.current += timedelta(seconds=seconds, **kwargs)
        return self.current

    def set(self, value: datetime) -> datetime:
        self.current = value
        return value


CLOCK_START = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock(settings) -> Clock:
    c = Clock(CLOCK_START)
    settings.DURABLE_SCHEDULER_CLOCK = c
    return c


AUTHORITY = {
    "schemaVersion": 1,
    "principal": {"type": "user", "id": "alice"},
    "requestedCapabilities": ["reports.send"],
}


def authority_for(principal_id: str, *caps: str, ptype: str = "user") -> dict:
    return {"principal": {"type": ptype, "id": principal_id}, "requestedCapabilities": list(caps)}


@pytest.fixture
def job(db, clock):
    from django_durable_scheduler import kernel

    return kernel.create_job("job-a", "reports.send", authority=AUTHORITY, payload={"n": 1})


def database_url() -> str:
    """A DATABASE_URL for the test database this process uses, for subprocesses."""
    s = connection.settings_dict
    name = s["NAME"]
    if connection.vendor == "sqlite":
        return f"sqlite:///{name}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    user = s.get("USER") or ""
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"{scheme}://{user}{password}@{host}{port}/{name}"


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def run_python(code: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def snapshot() -> dict:
    """Every scheduler table, row for row: to show that a refused call wrote nothing."""
    from django_durable_scheduler.models import (
        AuthorityPolicy,
        AuthorityPolicyRevision,
        AuthorityReservation,
        AuthorityUsage,
        Batch,
        Event,
        Job,
        Occurrence,
        UniqueCall,
    )

    models = (
        Batch,
        Job,
        Occurrence,
        Event,
        AuthorityPolicy,
        AuthorityPolicyRevision,
        AuthorityUsage,
        AuthorityReservation,
        UniqueCall,
    )
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in models}


# ``test_bad_input``'s world of jobs, occurrences and policies in every state, shared by the
# modules that throw bad input at the API (test_bad_input, test_input_contract, test_api_property).


@pytest.fixture(scope="module")
def module_world(django_db_setup, django_db_blocker):
    """The world, built once for the module in a transaction that is rolled back at its end.
    Each test runs inside it (pytest-django's per-test transaction is a savepoint there) and
    its writes are undone after it, as they would be without this."""
    from django.db import transaction
    from django.test.utils import override_settings

    from .kernel.test_bad_input import build_world

    with django_db_blocker.unblock():
        build_clock = Clock(CLOCK_START)
        with override_settings(DURABLE_SCHEDULER_CLOCK=build_clock), transaction.atomic():
            yield build_world(build_clock)
            transaction.set_rollback(True)


@pytest.fixture
def world(module_world, db, clock):
    clock.set(module_world.now)
    return module_world


@pytest.fixture
def registered():
    """``register(kind, units=1)`` registers a handler that records the occurrences it runs
    (the list it returns) until the test ends."""
    from django_durable_scheduler.handlers import registry

    kinds: list[str] = []
    calls: list[str] = []

    def register(kind: str, units=1) -> list[str]:
        def run(ctx):
            calls.append(ctx.occurrence_id)
            return {"ok": True}

        registry.handler(kind, units=units)(run)
        kinds.append(kind)
        return calls

    yield register
    for kind in kinds:
        registry.unregister(kind)
