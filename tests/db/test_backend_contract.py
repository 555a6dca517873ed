"""What the package relies on of Django's database backends beyond the documented ORM, one test
each, on every database and Django version the suite runs: the capability flags the dialect
chooses its SQL by, and the adapter of a time for a hand-written statement. A Django release that
changes one fails here, by name, before it changes what the scheduler writes."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import pytest
from django.db import connection

from django_durable_scheduler.db import dialect, guarded
from django_durable_scheduler.models import MaintenanceLease

pytestmark = pytest.mark.django_db

VENDOR = connection.vendor


def test_skip_locked_where_the_claim_uses_it():
    # dialect.lock_rows and the claim's statements: SKIP LOCKED on PostgreSQL and MariaDB 10.6+.
    features = connection.features
    expected = VENDOR in ("postgresql", "mysql")
    assert bool(features.has_select_for_update and features.has_select_for_update_skip_locked) == expected
    assert dialect.supports_skip_locked(connection.alias) == expected


def test_rows_returned_from_an_insert_where_conflicts_are_skipped():
    # dialect.can_skip_conflicts: SQLite says it through this flag (RETURNING, SQLite 3.35+).
    if VENDOR == "sqlite":
        assert connection.features.can_return_rows_from_bulk_insert == (
            sqlite3.sqlite_version_info >= (3, 35)
        )
    assert dialect.can_skip_conflicts(connection.alias) == (
        VENDOR == "postgresql" or (VENDOR == "sqlite" and sqlite3.sqlite_version_info >= (3, 35))
    )


def test_the_bound_on_parameters_is_a_number_or_none():
    # guarded._max_parameters falls back to it off SQLite.
    bound = connection.features.max_query_params
    assert bound is None or (isinstance(bound, int) and bound >= 999)
    assert guarded._max_parameters(connection) >= 999


def test_an_adapted_time_compares_with_a_stored_one():
    # The claim's hand-written reads bind times through ops.adapt_datetimefield_value.
    at = datetime(2026, 3, 29, 1, 30, 0, 123000, tzinfo=UTC)
    MaintenanceLease.objects.create(name="probe", expires_at=at)
    table = connection.ops.quote_name(MaintenanceLease._meta.db_table)
    column = connection.ops.quote_name(MaintenanceLease._meta.get_field("expires_at").column)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(*) FROM {table} WHERE {column} = %s",
            [connection.ops.adapt_datetimefield_value(at)],
        )
        assert cursor.fetchone()[0] == 1
