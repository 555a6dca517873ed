"""The migrations' code: self-contained, and the frozen trigger rules of 0004 agree with 0.1.0's.

A migration must do the same thing forever, whatever the app becomes: it imports nothing of
the app outside ``migrations/`` (the exception is the model state's vocabulary, below) and
calls no private method (a schema editor's ``_...`` methods change between Django versions).
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from django_durable_scheduler import migrations as migrations_package
from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.migrations._first_fire_time import first_fire_time
from django_durable_scheduler.rules.schedules import initial_fire_time
from django_durable_scheduler.rules.triggers import validate_trigger

# The installed package's migrations: the Django 6 legs run these tests beside the wheel.
MIGRATIONS = Path(migrations_package.__file__).resolve().parent
PACKAGE = "django_durable_scheduler"
# Classes that the model state declares checks with: Django writes their import path into a
# migration, as it does a custom field's, and compares them with the models' own.
MODEL_STATE_VOCABULARY = {f"{PACKAGE}.constraints", f"{PACKAGE}.fields"}

no_database = pytest.mark.skipif(
    "sqlite" not in django_settings.DATABASES["default"]["ENGINE"],
    reason="no database here: the SQLite legs run it",
)


def imported_modules(tree: ast.Module, module: str) -> list[str]:
    """Every module a file imports, at any depth, relative imports resolved from ``module``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.rsplit(".", node.level)[0]
                found.append(f"{base}.{node.module}" if node.module else base)
            else:
                found.append(node.module or "")
    return found


def private_calls(tree: ast.Module) -> list[str]:
    """Calls of a method whose name starts with one underscore (``editor._create_index_name``)."""
    return [
        f"line {node.lineno}: {ast.unparse(node.func)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("_")
        and not node.func.attr.startswith("__")
    ]


def migration_files() -> list[Path]:
    files = sorted(MIGRATIONS.glob("*.py"))
    assert any(path.name.startswith("0004") for path in files)
    return files


@no_database
@pytest.mark.parametrize("path", migration_files(), ids=lambda path: path.name)
def test_a_migration_imports_nothing_of_the_app_outside_migrations(path):
    tree = ast.parse(path.read_text(), str(path))
    module = f"{PACKAGE}.migrations.{path.stem}"
    outside = [
        name
        for name in imported_modules(tree, module)
        if (name == PACKAGE or name.startswith(f"{PACKAGE}."))
        and not name.startswith(f"{PACKAGE}.migrations")
        and name not in MODEL_STATE_VOCABULARY
    ]
    assert outside == []


@no_database
@pytest.mark.parametrize("path", migration_files(), ids=lambda path: path.name)
def test_a_migration_calls_no_private_method(path):
    assert private_calls(ast.parse(path.read_text(), str(path))) == []


@no_database
def test_the_checks_find_what_they_look_for():
    bad = ast.parse(
        "from django_durable_scheduler.rules.triggers import validate_trigger\n"
        "from .. import schedules\n"
        "def step(apps, schema_editor):\n"
        "    import django_durable_scheduler.exceptions\n"
        "    schema_editor.execute(schema_editor._delete_index_sql(model, name))\n"
    )
    names = imported_modules(bad, f"{PACKAGE}.migrations.0009_x")
    assert sorted(names) == [PACKAGE, f"{PACKAGE}.exceptions", f"{PACKAGE}.rules.triggers"]
    assert private_calls(bad) == ["line 5: schema_editor._delete_index_sql"]


# ----------------------------------------------------------------------------- frozen rules


def live_first_fire_time(trigger, *, now, anchor):
    """What migration 0004 computed with the app's own code in 0.1.0."""
    try:
        valid = validate_trigger(trigger)
    except InvalidArgument:
        return None
    return initial_fire_time(valid, now=now, anchor=anchor)


NOW = datetime(2026, 3, 29, 0, 30, 17, 123456, tzinfo=UTC)  # hours before Europe's spring-forward
ANCHOR = datetime(2026, 1, 1, 12, 0, 0, 999999, tzinfo=UTC)
CASES = [
    {},
    {"every": 300},
    {"every": 300, "anchor": "2026-03-29T00:31:00+02:00"},
    {"every": 0},
    {"every": True},
    {"every": 366 * 86_400 + 1},
    {"every": 60, "start_at": "2026-04-01T00:00:00Z", "end_at": "2026-05-01T00:00:00Z"},
    {"every": 60, "end_at": "2026-01-01T00:00:00Z"},
    {"every": 60, "start_at": "2026-05-01T00:00:00Z", "end_at": "2026-04-01T00:00:00Z"},
    {"at": "2100-01-01T09:00:00Z"},
    {"at": "2026-03-29T00:00:00Z"},
    {"at": "2026-03-28T23:00:00Z"},
    {"at": "2026-03-28T23:00:00Z", "catchup_window": 7200},
    {"at": "2026-03-29T00:00:00"},
    {"at": "2026-03-29T00:00:00Z\x00junk"},
    {"at": "2026-12-01T09:00:00+00:00", "start_at": "2027-01-01T00:00:00Z"},
    {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
    {"cron": "30 * * * *", "timezone": "Europe/Berlin"},
    {"cron": "*/7 1-3 * * *", "timezone": "Europe/Berlin"},
    {"cron": "0 9 * * 1-5", "timezone": "America/New_York"},
    {"cron": "0 0 29 2 *"},
    {"cron": "0 0 30 2 *"},
    {"cron": "0 0 30 2 1"},
    {"cron": "@daily"},
    {"cron": "@reboot"},
    {"cron": "@often"},
    {"cron": "0 0 * * * *"},
    {"cron": "5/10 * * * *"},
    {"cron": "0 0 L * *"},
    {"cron": "0 0 * JAN-MAR SUN"},
    {"cron": "0 0 * * 7"},
    {"cron": "0  0\t*  * *", "timezone": "Asia/Kolkata"},
    {"cron": "0 0 * * *", "timezone": "Mars/Olympus"},
    {"cron": "0 0 * * *", "timezone": "localtime"},
    {"cron": "0 0 * * *", "misfire": "run_all", "overlap": "skip", "catchup_window": 0},
    {"cron": "0 0 * * *", "misfire": "sometimes"},
    {"cron": "0 0 * * *", "catchup_window": 31 * 86_400 + 1},
    {"cron": 5},
    {"every": 60, "timezone": "UTC"},
    {"cron": "0 0 * * *", "anchor": "2026-01-01T00:00:00Z"},
    {"cron": "0 0 * * *", "every": 60},
    {"misfire": "skip"},
    {"when": "now"},
    ["every", 60],
]


@no_database
@pytest.mark.parametrize("trigger", CASES, ids=repr)
def test_frozen_first_fire_time_agrees_with_the_trigger_rules_of_0_1_0(trigger):
    for now in (NOW, NOW + timedelta(hours=1, minutes=5), datetime(2026, 10, 25, 0, 10, tzinfo=UTC)):
        assert first_fire_time(trigger, now=now, anchor=ANCHOR) == live_first_fire_time(
            trigger, now=now, anchor=ANCHOR
        )


# Mostly valid fields (small values fit every field), with a few that some field refuses.
FIELD = st.one_of(
    st.just("*"),
    st.integers(1, 12).map(str),
    st.lists(st.integers(1, 12), min_size=2, max_size=2).map(lambda r: f"{min(r)}-{max(r)}"),
    st.integers(1, 12).map(lambda step: f"*/{step}"),
    st.sampled_from(["MON-FRI", "JAN,JUL", "sun", "1-5/2", "*/1", "0-23", "?", "L", "5/15", "31", "60"]),
)


@no_database
@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(FIELD, min_size=5, max_size=5),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    now=st.datetimes(
        min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
    ),
)
def test_frozen_first_fire_time_agrees_on_generated_crons(fields, zone, now):
    trigger = {"cron": " ".join(fields), "timezone": zone}
    assert first_fire_time(trigger, now=now, anchor=ANCHOR) == live_first_fire_time(
        trigger, now=now, anchor=ANCHOR
    )
