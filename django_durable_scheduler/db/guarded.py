"""The inserts the ORM cannot say, in one place: rows skipped when their unique keys exist,
with the keys of those that went in (``INSERT ... ON CONFLICT DO NOTHING RETURNING``, which
``bulk_create(ignore_conflicts=True)`` does not report), and the guarded insert: a row
inserted only while another row still holds the values it was built from, without reading
that row first. An enqueue of a job this process has read before uses it
(``kernel.enqueuing``): the occurrence copies the job's columns, and the insert happens only
while the stored job still has them, so it writes exactly what a fresh read would have.

A third insert sends a write (an ``UPDATE``) in the same statement as the rows it goes with,
on PostgreSQL: the claim's UPDATE with its events, a budget's counts with its reservations.

Every statement takes its table, columns and values from the model: ``_meta.get_fields()``,
each field's ``pre_save`` and ``get_db_prep_save``, as ``save()`` does. A column is left out
where the database fills it in the same way: one with a ``db_default`` that no row sets, and
one that is NULL in every row (a plain occurrence binds 23 values, not 46).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    NOT_PROVIDED,
    AutoField,
    BigAutoField,
    Field,
    GeneratedField,
    Model,
    SmallAutoField,
)

from .dialect import can_skip_conflicts, concrete_fields, mark_saved, placeholders
from .wakeup import CHANNEL, notify_new_work

_AUTO_FIELDS = (AutoField, BigAutoField, SmallAutoField)


class GuardFailed(Exception):
    """The guard row of :func:`insert_guarded` no longer holds the expected values."""


@cache
def insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """The columns an insert of ``model`` writes: every concrete field but an auto-increment
    key and a generated column (what ``save()`` leaves to the database)."""
    return tuple(
        field
        for field in concrete_fields(model)
        if not isinstance(field, GeneratedField)
        and not (field.primary_key and isinstance(field, _AUTO_FIELDS))
    )


@cache
def _with_db_default(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    return tuple(field for field in insert_fields(model) if field.db_default is not NOT_PROVIDED)


def left_out(objs: Sequence[Model]) -> tuple[str, ...]:
    """The attnames of the fields with a ``db_default`` that no row of ``objs`` (all of one
    model) sets: their value is the database's, as ``save()`` leaves it. A field set on some
    rows and left to its default on others is refused."""
    left = []
    for field in _with_db_default(type(objs[0])):
        unset = [hasattr(getattr(obj, field.attname), "resolve_expression") for obj in objs]
        if all(unset):
            left.append(field.attname)
        elif any(unset):
            raise ValueError(f"{field.name} is set on some rows and left to its db_default on others")
    return tuple(left)


@cache
def _written(model: type[Model], left: tuple[str, ...]) -> tuple[Field[Any, Any], ...]:
    fields = insert_fields(model)
    return fields if not left else tuple(field for field in fields if field.attname not in left)


def _row(obj: Model, fields: Sequence[Field[Any, Any]], connection: BaseDatabaseWrapper) -> list[Any]:
    """``obj``'s values of ``fields`` as ``save()`` binds them for an insert."""
    return [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]


def _insert_sql(
    connection: BaseDatabaseWrapper, model: type[Model], fields: Sequence[Field[Any, Any]], rows: int
) -> str:
    """``INSERT INTO <table> (<fields>) VALUES (%s, ...), ...`` of ``rows`` rows."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in fields)
    values = ", ".join([placeholders(len(fields))] * rows)
    return f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES {values}"


@cache
def _unnest_sql(alias: str, model: type[Model], fields: tuple[Field[Any, Any], ...]) -> str:
    """PostgreSQL's insert of many rows: ``INSERT ... SELECT * FROM UNNEST(%s::type[], ...)``,
    one array parameter per column, so the statement's text and plan are the same for every
    number of rows (the form Django's ``bulk_create`` takes on PostgreSQL)."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in fields)
    arrays = ", ".join(f"(%s)::{_pg_type(connection, field)}[]" for field in fields)
    return f"INSERT INTO {quote(model._meta.db_table)} ({columns}) SELECT * FROM UNNEST({arrays})"


def _conflicts_skipped(connection: BaseDatabaseWrapper, model: type[Model]) -> str:
    pk = model._meta.pk
    assert pk is not None
    return f" ON CONFLICT DO NOTHING RETURNING {connection.ops.quote_name(str(pk.column))}"


def _max_parameters(connection: BaseDatabaseWrapper) -> int:
    """How many parameters one statement may bind: SQLite's own limit as its connection
    reports it (``sqlite3.Connection.getlimit``, Python 3.11+), which is usually far above the
    999 Django assumes; elsewhere Django's figure, or PostgreSQL's 65,535."""
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        getlimit = getattr(connection.connection, "getlimit", None)
        if getlimit is not None:
            return int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
    return int(connection.features.max_query_params or 65535)


def insert_new(alias: str, objs: Sequence[Model]) -> set[Any]:
    """Insert those of ``objs`` (all of one model) whose unique keys are not taken yet, and
    return their primary keys (only where :func:`.dialect.can_skip_conflicts`; elsewhere the
    caller inserts each in a savepoint)."""
    if not objs:
        return set()
    connection = connections[alias]
    if not can_skip_conflicts(alias):
        raise ValueError(f"no insert that skips conflicts on {connection.vendor}")
    model = type(objs[0])
    left, rows = _without_nulls(objs, left_out(objs), connection)
    fields = _written(model, left)
    if connection.vendor == "postgresql" and len(objs) > 1:
        sql = _unnest_sql(alias, model, fields) + _conflicts_skipped(connection, model)
        with connection.cursor() as cursor:
            cursor.execute(sql, [list(column) for column in zip(*rows, strict=True)])
            inserted = {row[0] for row in cursor.fetchall()}
        _mark_inserted(objs, inserted, alias)
        return inserted
    per_statement = max(1, min(1000, _max_parameters(connection) // len(fields)))
    inserted = set()
    with connection.cursor() as cursor:
        for start in range(0, len(objs), per_statement):
            chunk = rows[start : start + per_statement]
            sql = _insert_sql(connection, model, fields, len(chunk)) + _conflicts_skipped(connection, model)
            # SQLite: "ON CONFLICT" after "VALUES" is read as the insert's, as wanted.
            cursor.execute(sql, [value for row in chunk for value in row])
            inserted.update(row[0] for row in cursor.fetchall())
    _mark_inserted(objs, inserted, alias)
    return inserted


def insert_missing(alias: str, objs: Sequence[Model]) -> None:
    """Insert the rows whose keys no other transaction has inserted meanwhile, and keep theirs:
    one statement where conflicts can be skipped, else (MySQL/MariaDB) a savepoint per row."""
    if can_skip_conflicts(alias):
        insert_new(alias, objs)
        return
    for obj in objs:
        try:
            with transaction.atomic(using=alias):
                obj.save(using=alias, force_insert=True)
        except IntegrityError:
            pass


def _mark_inserted(objs: Sequence[Model], inserted: set[Any], alias: str) -> None:
    pk_name = type(objs[0])._meta.pk.attname
    mark_saved([obj for obj in objs if getattr(obj, pk_name) in inserted], alias)


# A write that returns nothing, with its parameters: what :func:`insert_after` sends first.
Write = tuple[str, list[Any]]


def insert_after(alias: str, writes: Sequence[Write], objs: Sequence[Model]) -> None:
    """Run ``writes`` (``UPDATE`` statements returning nothing), then insert ``objs`` (all of
    one model), in the caller's transaction. On PostgreSQL, in one round trip: the writes go
    as data-modifying ``WITH`` clauses of the insert (each runs once, to completion, whatever
    the insert reads of it; the insert reads none). Elsewhere one after the other, the rows
    by ``bulk_create``."""
    connection = connections[alias]
    if connection.vendor != "postgresql" or not objs or not writes:
        with connection.cursor() as cursor:
            for sql, params in writes:
                cursor.execute(sql, params)
        if objs:
            type(objs[0])._default_manager.db_manager(alias).bulk_create(objs)
        return
    model = type(objs[0])
    left, rows = _without_nulls(objs, left_out(objs), connection)
    fields = _written(model, left)
    clauses = ", ".join(f"w{n} AS ({sql})" for n, (sql, _) in enumerate(writes))
    params = [value for _, write_params in writes for value in write_params]
    params += [value for row in rows for value in row]
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {clauses} {_insert_sql(connection, model, fields, len(objs))}", params)
    mark_saved(objs, alias)


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


def _pg_type(connection: BaseDatabaseWrapper, field: Field[Any, Any]) -> str:
    """``field``'s PostgreSQL type without its parameters (``varchar``, not ``varchar(50)``:
    a cast to that would cut a value too long silently, where the column refuses it), as
    Django's own bulk insert casts its arrays."""
    return str(field.db_type(connection)).split("(")[0]


def _typed(connection: BaseDatabaseWrapper, field: Field[Any, Any]) -> str:
    """``%s`` for a value of ``field`` in a PostgreSQL ``SELECT`` list, which (unlike
    ``VALUES``) does not take its types from the target columns."""
    return f"%s::{_pg_type(connection, field)}"


@cache
def _guarded_sql(
    alias: str,
    model: type[Model],
    left: tuple[str, ...],
    guard_sql: str,
    then: tuple[type[Model], tuple[str, ...], int] | None,
) -> str:
    """The statement of :func:`insert_guarded` on PostgreSQL: the guard, the insert and its
    ``then`` rows (model, columns left out, rows) and the wake-up in one ``WITH``, so one round
    trip that is atomic by itself. Kept by the names of what it leaves out: hashing the fields
    themselves costs more than building it."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    fields = _written(model, left)
    columns = ", ".join(quote(str(field.column)) for field in fields)
    select = ", ".join(_typed(connection, field) for field in fields)
    parts = [
        f"g AS ({guard_sql})",
        f"o AS (INSERT INTO {quote(model._meta.db_table)} ({columns}) SELECT {select} FROM g"
        " ON CONFLICT DO NOTHING RETURNING 1)",
    ]
    if then is not None:
        then_model, then_left, then_rows = then
        then_fields = _written(then_model, then_left)
        table = quote(then_model._meta.db_table)
        then_columns = ", ".join(quote(str(field.column)) for field in then_fields)
        then_select = ", ".join(_typed(connection, field) for field in then_fields)
        rows = " UNION ALL ".join([f"SELECT {then_select} FROM o"] * then_rows)
        parts.append(f"t AS (INSERT INTO {table} ({then_columns}) {rows})")
    # Delivered by PostgreSQL only if (and when) the transaction commits.
    parts.append("n AS (SELECT pg_notify(%s, '') FROM o)")
    counts = "(SELECT COUNT(*) FROM o), (SELECT COUNT(*) FROM g), (SELECT COUNT(*) FROM n)"
    return f"WITH {', '.join(parts)} SELECT {counts}"


@cache
def _guarded_sqlite_sql(alias: str, model: type[Model], left: tuple[str, ...], guard_sql: str) -> str:
    """The insert of :func:`insert_guarded` on SQLite: ``INSERT ... SELECT ... WHERE EXISTS``."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    fields = _written(model, left)
    columns = ", ".join(quote(str(field.column)) for field in fields)
    # "WHERE EXISTS" also tells SQLite's parser that ON CONFLICT belongs to the INSERT.
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) SELECT {', '.join(['%s'] * len(fields))}"
        f" WHERE EXISTS ({guard_sql}){_conflicts_skipped(connection, model)}"
    )


def _without_nulls(
    objs: Sequence[Model], left: tuple[str, ...], connection: BaseDatabaseWrapper
) -> tuple[tuple[str, ...], list[list[Any]]]:
    """The rows of ``objs`` (all of one model) as an insert binds them, without the columns
    that are NULL in every row (a column left out of an insert is NULL: it has no default in
    the database but a ``db_default``, which ``left`` leaves out already), and ``left`` with
    their names: a plain occurrence leaves the columns of the features it does not use, so its
    statement binds a third of the values."""
    model = type(objs[0])
    fields = _written(model, left)
    rows = [_row(obj, fields, connection) for obj in objs]
    nulls: set[int] = set()
    for number, row in enumerate(rows):
        here = {i for i, value in enumerate(row) if value is None}
        nulls = here if number == 0 else nulls & here
        if not nulls:
            return left, rows
    kept = [i for i in range(len(fields)) if i not in nulls]
    names = left + tuple(fields[i].attname for i in sorted(nulls))
    return names, [[row[i] for i in kept] for row in rows]


def insert_guarded(
    alias: str, obj: Model, guard: tuple[str, list[Any]], *, then: Sequence[Model] = ()
) -> bool:
    """Insert ``obj`` only while the ``guard`` row (from :func:`guard_for`) still holds its
    values, skipping it if a row with one of its unique keys exists; if inserted, also the
    rows ``then`` (its events, all of one model) and a wake-up of listening workers. True if
    inserted, False if a row was there; :class:`GuardFailed` (nothing written) if the guard
    row changed.

    PostgreSQL: one statement, atomic by itself, so it needs no transaction of its own.
    SQLite: the insert, then the guard again when nothing went in (to tell a row already there
    from a changed guard row), then the rest, so the caller runs it in a write transaction."""
    connection = connections[alias]
    model = type(obj)
    left, (row,) = _without_nulls([obj], left_out([obj]), connection)
    guard_sql, guard_params = guard
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(_guarded_sqlite_sql(alias, model, left, guard_sql), [*row, *guard_params])
            inserted = cursor.fetchone() is not None
            if not inserted:
                cursor.execute(guard_sql, guard_params)
                if cursor.fetchone() is None:
                    raise GuardFailed
        else:
            then_shape = None
            params: list[Any] = [*guard_params, *row]
            if then:
                then_left, then_rows = _without_nulls(then, left_out(then), connection)
                then_shape = (type(then[0]), then_left, len(then))
                params += [value for then_row in then_rows for value in then_row]
            params.append(CHANNEL)
            cursor.execute(_guarded_sql(alias, model, left, guard_sql, then_shape), params)
            count, guard_held, _ = cursor.fetchone()
            if not guard_held:
                raise GuardFailed
            inserted = bool(count)
    if not inserted:
        return False
    mark_saved([obj], alias)
    if connection.vendor != "sqlite":
        mark_saved(then, alias)
        return True
    if then:
        type(then[0])._default_manager.db_manager(alias).bulk_create(then)
    notify_new_work(alias)
    return True
