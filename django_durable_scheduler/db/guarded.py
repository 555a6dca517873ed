"""The guarded insert: a row inserted only while another row still holds the values it was
built from, without reading that row first. An enqueue of a job this process has read before
uses it (``kernel.enqueuing``): the occurrence copies the job's columns, and the insert happens
only while the stored job still has them, so it writes exactly what a fresh read would have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import Field, Model

from . import kept
from .dialect import can_skip_conflicts, mark_saved, written_columns
from .statements import guarded_statement, one_row_insert, prepared_row
from .wakeup import CHANNEL, notify_new_work


class GuardFailed(Exception):
    """The guard row of :func:`insert_guarded` no longer holds the expected values."""


def supports_guarded_insert(alias: str) -> bool:
    """Whether :func:`insert_guarded` works on this database."""
    return connections[alias].vendor == "postgresql" or (
        connections[alias].vendor == "sqlite" and can_skip_conflicts(alias)
    )


def guard_for(alias: str, obj: Model, names: Sequence[str]) -> tuple[str, list[Any]]:
    """The guard of :func:`insert_guarded` for ``obj``'s row: ``SELECT 1 FROM <table> WHERE
    pk = %s AND <column> = %s ...`` (null-safe) with ``obj``'s current values of the fields
    ``names``."""
    connection = connections[alias]
    meta = obj._meta
    quote = connection.ops.quote_name
    same = "IS" if connection.vendor == "sqlite" else "IS NOT DISTINCT FROM"
    assert meta.pk is not None
    conditions = [f"{quote(str(meta.pk.column))} = %s"]
    params: list[Any] = [meta.pk.get_db_prep_value(obj.pk, connection)]
    for name in names:
        field = meta.get_field(name)
        assert isinstance(field, Field)
        conditions.append(f"{quote(str(field.column))} {same} %s")
        params.append(field.get_db_prep_save(getattr(obj, field.attname), connection))
    return f"SELECT 1 FROM {quote(meta.db_table)} WHERE {' AND '.join(conditions)}", params


def insert_guarded(
    alias: str,
    obj: Model,
    guard: tuple[str, list[Any]],
    *,
    then: Sequence[Model] = (),
    notify: bool = False,
    keep_plan: bool = False,
) -> bool:
    """Insert ``obj`` only while the ``guard`` row (from :func:`guard_for`) still holds its
    values, skipping it if a row with one of its unique keys exists; if inserted, also the
    rows ``then`` (its events) and, with ``notify``, a wake-up of listening workers. True if
    inserted, False if a row was there; :class:`GuardFailed` (nothing written) if the guard
    row changed. The enqueue of a job this process has read before uses it to insert
    without reading the job again.

    PostgreSQL: one statement (the guard, the inserts and ``pg_notify`` in one ``WITH``),
    atomic by itself, so it needs no transaction of its own; with ``keep_plan``, its plan is
    kept when it runs alone (``kept.fetch``). SQLite: the insert, then the rest, so the caller
    runs it inside a write transaction."""
    connection = connections[alias]
    fields = written_columns([obj])
    then_fields = written_columns(then) if then else ()
    sql = guarded_statement(connection, type(obj), fields, guard[0], then, then_fields, notify)
    row = prepared_row(obj, fields, connection)
    guard_params = guard[1]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute(sql, [*row, *guard_params])
            inserted = cursor.fetchone() is not None
            if not inserted:
                cursor.execute(guard[0], guard_params)
                if cursor.fetchone() is None:
                    raise GuardFailed
            elif then:  # its events, on the same cursor
                insert = one_row_insert(connection, type(then[0]), then_fields)
                for item in then:
                    cursor.execute(insert, prepared_row(item, then_fields, connection))
        if inserted:
            mark_saved([obj, *then], alias)
            if notify:
                notify_new_work(alias)
        return inserted
    params: list[Any] = [*guard_params, *row]
    for item in then:
        params += prepared_row(item, then_fields, connection)
    if notify:
        params.append(CHANNEL)
    count, guard_held, *_ = kept.fetch(connection, sql, params, alone=keep_plan)[0]
    if not guard_held:
        raise GuardFailed
    if count:
        mark_saved([obj, *then], alias)
    return bool(count)
