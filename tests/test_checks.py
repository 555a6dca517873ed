"""System checks: one test (at least) per stable id."""

from __future__ import annotations

import sys
from datetime import timedelta
from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.checks import Tags
from django.core.checks.registry import registry as check_registry
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test.utils import override_settings

import django_durable_scheduler as scheduler
from django_durable_scheduler import checks
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.handlers.registry import Handler

from .conftest import AUTHORITY


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def ours(databases=None) -> list:
    """Our checks as ``manage.py check [--database X]`` runs them: database checks only when a
    database is named. (``run_checks(tags=...)`` cannot say that on Django 6, which passes
    every alias to every check it runs.)"""
    messages: list = []
    for check in check_registry.get_checks():
        if checks.TAG not in check.tags or (Tags.database in check.tags and not databases):
            continue
        messages += check(app_configs=None, databases=databases)
    return messages


def test_a_correct_project_has_no_messages(db):
    assert ours(databases=["default"]) == []


# --------------------------------------------------------------------------- E001


@pytest.fixture
def broken_app(tmp_path, monkeypatch):
    """An installed app whose handler module raises on import."""
    package = tmp_path / "dsch_broken_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from django.conf import settings

    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "dsch_broken_app"]):
        yield "dsch_broken_app"
    for name in [m for m in sys.modules if m.startswith("dsch_broken_app")]:
        del sys.modules[name]


def test_e001_handler_module_import_error(broken_app):
    messages = checks.check_handler_modules()
    assert ids(messages) == ["durable_scheduler.E001"]
    (message,) = messages
    assert message.msg == (
        "Handler module 'dsch_broken_app.tasks' of app 'dsch_broken_app' fails to import: "
        "RuntimeError: boom at import"
    )
    assert message.obj == "dsch_broken_app.tasks"
    assert "SILENCED_SYSTEM_CHECKS" in message.hint
    assert "durable_scheduler.E001" in ids(ours())


def test_e001_not_raised_for_importable_modules():
    assert checks.check_handler_modules() == []


def test_e001_skipped_when_the_module_setting_is_invalid(settings):
    settings.DURABLE_SCHEDULER_HANDLER_MODULE = "not a module"
    assert checks.check_handler_modules() == []  # E003 reports it


# --------------------------------------------------------------------------- E002


def _noop(ctx):
    return None


@pytest.mark.parametrize(
    ("handler", "problem"),
    [
        (Handler("bad.units", _noop, 0), "its units 0 are not a whole number in 1..1000000 or a callable"),
        (Handler("bad.units", _noop, 1_000_001), "its units 1000001 are not"),
        (Handler("bad.units", _noop, 2.5), "its units 2.5 are not"),  # type: ignore[arg-type]
        (Handler("bad.units", _noop, True), "its units True are not"),
        (Handler("bad.units", "not-a-function", 1), "its handler 'not-a-function' is not callable"),  # type: ignore[arg-type]
    ],
)
def test_e002_invalid_registration(monkeypatch, handler, problem):
    monkeypatch.setitem(registry._handlers, handler.kind, handler)
    messages = checks.check_handlers()
    assert ids(messages) == ["durable_scheduler.E002"]
    assert messages[0].msg.startswith(f"Kind 'bad.units' is registered wrongly: {problem}")
    assert messages[0].obj == "bad.units"
    assert "@scheduler.handler(kind, units=N)" in messages[0].hint


def test_e002_accepts_callable_and_boundary_units(monkeypatch):
    monkeypatch.setitem(registry._handlers, "ok.callable", Handler("ok.callable", _noop, lambda ctx: 3))
    monkeypatch.setitem(registry._handlers, "ok.max", Handler("ok.max", _noop, 1_000_000))
    assert checks.check_handlers() == []


# --------------------------------------------------------------------------- E003


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("HANDLER_MODULE", "my tasks", "must be a dotted module name"),
        ("HANDLER_MODULE", "tasks.", "must be a dotted module name"),
        ("HANDLER_MODULE", 3, "must be a dotted module name"),
        ("AUTODISCOVER", "yes", "must be True or False"),
        ("AUTODISCOVER", 1, "must be True or False"),
        ("AUTODISCOVER", None, "must be True or False"),
        ("DEFAULT_LEASE", 0, "must be a number of seconds in (0, 86400]"),
        ("RETRY_BASE_DELAY", 0, "must be a number of seconds in (0, 86400]"),
        ("RETRY_BASE_DELAY", -1.5, "must be a number of seconds"),
        ("RETRY_BASE_DELAY", "10", "must be a number of seconds"),
        ("RETRY_BASE_DELAY", float("nan"), "must be a number of seconds"),
        ("RETRY_MAX_DELAY", 5, "(5) must not be shorter than DURABLE_SCHEDULER_RETRY_BASE_DELAY (10)"),
        ("RETRY_MAX_DELAY", 40 * 86400, "must be a number of seconds in (0, 2678400]"),
        ("RETRY_JITTER", 1, "must be a number in [0, 1)"),
        ("RETRY_JITTER", -0.1, "must be a number in [0, 1)"),
        ("RETRY_JITTER", True, "must be a number in [0, 1)"),
        ("MAX_CLAIM_BATCH", 0, "must be a whole number >= 1"),
        ("MAX_CLAIM_BATCH", 2.0, "must be a whole number >= 1"),
        ("CLOCK", 42, "must be a callable (or a dotted path to one)"),
        ("CLOCK", "tests.no_such_module.clock", "cannot be imported"),
        ("CLOCK", "tests.conftest.AUTHORITY", "must be a callable"),
        ("HANDLER_TIMEOUT", 0, "must be None, or seconds or a timedelta in [0.001, 2678400]"),
        ("HANDLER_TIMEOUT", -5, "must be None, or seconds or a timedelta"),
        ("HANDLER_TIMEOUT", "30", "not '30'"),
        ("HANDLER_TIMEOUT", True, "must be None, or seconds or a timedelta"),
        ("HANDLER_TIMEOUT", timedelta(days=32), "must be None, or seconds or a timedelta"),
    ],
)
def test_e003_settings_of_the_wrong_type_or_range(settings, name, value, problem):
    setattr(settings, f"DURABLE_SCHEDULER_{name}", value)
    messages = checks.check_settings()
    assert ids(messages) == ["durable_scheduler.E003"]
    assert messages[0].msg.startswith(f"DURABLE_SCHEDULER_{name} ")
    assert problem in messages[0].msg
    assert messages[0].obj == f"DURABLE_SCHEDULER_{name}"
    assert messages[0].hint


def test_e003_valid_settings(settings, clock):
    settings.DURABLE_SCHEDULER_HANDLER_MODULE = "jobs.handlers"
    settings.DURABLE_SCHEDULER_RETRY_BASE_DELAY = 0.5
    settings.DURABLE_SCHEDULER_RETRY_MAX_DELAY = 0.5
    settings.DURABLE_SCHEDULER_RETRY_JITTER = 0
    settings.DURABLE_SCHEDULER_MAX_CLAIM_BATCH = 1
    assert checks.check_settings() == []  # the clock fixture's callable too
    settings.DURABLE_SCHEDULER_CLOCK = "tests.procs.clock.dilated"
    assert checks.check_settings() == []
    for timeout in (None, 0.5, 60, timedelta(minutes=5)):
        settings.DURABLE_SCHEDULER_HANDLER_TIMEOUT = timeout
        assert checks.check_settings() == []


def test_e003_reports_every_bad_setting(settings):
    settings.DURABLE_SCHEDULER_RETRY_JITTER = 2
    settings.DURABLE_SCHEDULER_MAX_CLAIM_BATCH = -1
    assert [m.obj for m in checks.check_settings()] == [
        "DURABLE_SCHEDULER_RETRY_JITTER",
        "DURABLE_SCHEDULER_MAX_CLAIM_BATCH",
    ]


# --------------------------------------------------------------------------- W001


def fake_connections(monkeypatch, vendor: str, options: dict) -> None:
    conn = SimpleNamespace(vendor=vendor, settings_dict={"OPTIONS": options})
    monkeypatch.setattr(checks, "connections", {"main": conn})


def test_w001_sqlite_without_immediate_transactions(monkeypatch):
    fake_connections(monkeypatch, "sqlite", {})
    messages = checks.check_sqlite_transaction_mode(databases=["main"])
    assert ids(messages) == ["durable_scheduler.W001"]
    assert "DATABASES['main']['OPTIONS']['transaction_mode'] = 'IMMEDIATE'" in messages[0].hint


@pytest.mark.parametrize(
    ("vendor", "options"), [("sqlite", {"transaction_mode": "immediate"}), ("postgresql", {})]
)
def test_w001_not_raised(monkeypatch, vendor, options):
    fake_connections(monkeypatch, vendor, options)
    assert checks.check_sqlite_transaction_mode(databases=["main"]) == []


class FakeConnections(dict):
    """``connections`` as the check sees it: iterating gives the configured aliases."""


def test_w001_on_a_plain_check_covers_every_configured_database(monkeypatch):
    conns = FakeConnections(
        main=SimpleNamespace(vendor="sqlite", settings_dict={"OPTIONS": {}}),
        fine=SimpleNamespace(vendor="sqlite", settings_dict={"OPTIONS": {"transaction_mode": "IMMEDIATE"}}),
        other=SimpleNamespace(vendor="sqlite", settings_dict={}),
    )
    monkeypatch.setattr(checks, "connections", conns)
    messages = checks.check_sqlite_transaction_mode()
    assert [m.msg for m in messages] == [
        "SQLite database 'main' does not use transaction_mode IMMEDIATE.",
        "SQLite database 'other' does not use transaction_mode IMMEDIATE.",
    ]


PREPARED = {"server_side_binding": True, "prepare_threshold": 5}


@pytest.mark.parametrize(
    ("vendor", "options", "listen", "expected"),
    [
        ("postgresql", {}, True, ["durable_scheduler.I001"]),
        ("postgresql", {"server_side_binding": True}, True, ["durable_scheduler.I001"]),
        ("postgresql", {"prepare_threshold": 5}, True, ["durable_scheduler.I001"]),
        ("postgresql", PREPARED, True, []),
        ("postgresql", PREPARED, False, ["durable_scheduler.W004"]),
        ("postgresql", {}, False, ["durable_scheduler.I001"]),
        ("sqlite", {}, True, []),
        ("mysql", {}, False, []),
    ],
)
def test_i001_w004_prepared_statements(monkeypatch, settings, vendor, options, listen, expected):
    settings.DURABLE_SCHEDULER_LISTEN = listen
    fake_connections(monkeypatch, vendor, options)
    messages = checks.check_prepared_statements(databases=["main"])
    assert ids(messages) == expected
    if expected == ["durable_scheduler.I001"]:
        assert "DATABASES['main']['OPTIONS'] = {'server_side_binding': True, 'prepare_threshold': 5}" in (
            messages[0].hint
        )
        assert "PgBouncer 1.21" in messages[0].hint


def test_i001_only_on_check_deploy():
    # A settings check for deployment: a plain `check` (and every runserver) does not run it.
    plain = check_registry.get_checks(include_deployment_checks=False)
    deploy = check_registry.get_checks(include_deployment_checks=True)
    assert checks.check_prepared_statements not in plain
    assert checks.check_prepared_statements in deploy
    assert checks.TAG in checks.check_prepared_statements.tags


def _printed_by(command: str, *args: str, **options: object) -> str:
    out, err = StringIO(), StringIO()
    call_command(command, *args, stdout=out, stderr=err, **options)
    return out.getvalue() + err.getvalue()


def test_w001_shows_on_check_and_when_runscheduler_starts(monkeypatch, db):
    # Not a database check: a plain `manage.py check` runs it, and so does every command that
    # runs the system checks before it starts, runscheduler among them.
    (registered,) = (c for c in check_registry.get_checks() if c is checks.check_sqlite_transaction_mode)
    assert Tags.database not in registered.tags
    # Django 6's check command names the databases ("default"); 5.2's names none.
    conn = SimpleNamespace(vendor="sqlite", settings_dict={"OPTIONS": {}})
    monkeypatch.setattr(checks, "connections", FakeConnections(default=conn))
    assert "durable_scheduler.W001" in _printed_by("check")
    assert "durable_scheduler.W001" in _printed_by("runscheduler", "--once", skip_checks=False)


# --------------------------------------------------------------------------- W002


@pytest.fixture
def unhandled_jobs(db, clock):
    scheduler.create_job("orphan-1", "nobody.handles", authority=AUTHORITY)
    scheduler.create_job("orphan-2", "nobody.handles", authority=AUTHORITY)
    scheduler.create_job("paused", "also.nobody", authority=AUTHORITY, enabled=False)
    scheduler.create_job("fine", "test.ok", authority=AUTHORITY)


def test_w002_enabled_jobs_without_a_handler(unhandled_jobs):
    messages = checks.check_jobs_have_handlers(databases=["default"])
    assert ids(messages) == ["durable_scheduler.W002"]  # one per kind; disabled jobs wait anyway
    assert messages[0].msg == (
        "Enabled jobs of kind 'nobody.handles' in database 'default' have no handler registered "
        "in this process."
    )
    assert messages[0].obj == "nobody.handles"
    assert "@scheduler.handler('nobody.handles')" in messages[0].hint
    assert "durable_scheduler.W002" in ids(ours(databases=["default"]))


def test_w002_runs_only_when_databases_are_given(unhandled_jobs):
    assert checks.check_jobs_have_handlers() == []
    assert "durable_scheduler.W002" not in ids(ours())


def test_w002_quiet_once_a_handler_is_registered(unhandled_jobs):
    scheduler.handler("nobody.handles")(_noop)
    try:
        assert checks.check_jobs_have_handlers(databases=["default"]) == []
    finally:
        registry.unregister("nobody.handles")


def test_w002_skips_a_database_without_the_tables(db, monkeypatch):
    # migrate runs the database checks before it creates the tables.
    from django.db import connections

    monkeypatch.setattr(connections["default"].introspection, "table_names", lambda *a, **k: [])
    assert checks.check_jobs_have_handlers(databases=["default"]) == []


# --------------------------------------------------------------------------- E005


def test_e005_use_tz_false_is_refused_at_start(db):
    with override_settings(USE_TZ=False):
        messages = checks.check_use_tz()
        assert ids(messages) == ["durable_scheduler.E005"]
        assert messages[0].obj == "USE_TZ"
        assert "USE_TZ = True" in str(messages[0].hint)
        # Not a database check: runscheduler runs it before it starts, and refuses to.
        with pytest.raises(SystemCheckError, match=r"durable_scheduler\.E005"):
            call_command("runscheduler", "--once", skip_checks=False)
    assert checks.check_use_tz() == []
