"""Database-specific SQL behind one small interface, with a portable fallback.

- Write transactions: SQLite has no row locks and one writer at a time, so every kernel
  transaction takes the database write lock as its first act (``transaction_mode=IMMEDIATE``,
  or a no-op write when the project did not configure it). From then on no other writer can
  commit until we do: what the transaction reads is the latest committed state.
- Row locks: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL and MySQL 8 / MariaDB 10.6+, so
  concurrent claimers each take different rows without waiting on each other.
- Inserts are built from each model's ``_meta``: every concrete column, with the values of
  the model instances (so their defaults), and a field added with ``makemigrations`` is
  written with no edit here. ``ON CONFLICT DO NOTHING ... RETURNING`` where the database has
  it (PostgreSQL, SQLite 3.35+); elsewhere the caller inserts in a savepoint.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model, QuerySet

from .wakeup import CHANNEL


def _immediate(connection: BaseDatabaseWrapper) -> bool:
    mode = str(connection.settings_dict.get("OPTIONS", {}).get("transaction_mode", ""))
    return mode.upper() == "IMMEDIATE"


def take_write_lock(connection: BaseDatabaseWrapper) -> None:
    """On SQLite without IMMEDIATE transactions, take the write lock now (see module doc)."""
    if connection.vendor == "sqlite" and not _immediate(connection):
        with connection.cursor() as cursor:
            # A write that touches nothing still opens a write transaction, waiting for the
            # lock with the busy timeout rather than failing later on a lock upgrade.
            cursor.execute("UPDATE durable_scheduler_jobs SET revision = revision WHERE 0 = 1")


@contextmanager
def write_transaction(using: str | None = None) -> Iterator[str]:
    """One kernel transaction on ``using`` (yields its alias); inside a caller's transaction,
    a savepoint, so that an error undoes only this operation and the caller's transaction
    stays usable."""
    alias = using or DEFAULT_DB_ALIAS
    with transaction.atomic(using=alias):
        take_write_lock(connections[alias])
        yield alias


def in_autocommit(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is outside any transaction: no atomic block, autocommit on."""
    return not connection.in_atomic_block and connection.get_autocommit()


def supports_skip_locked(alias: str) -> bool:
    features = connections[alias].features
    return bool(features.has_select_for_update and features.has_select_for_update_skip_locked)


def lock_rows(qs: QuerySet[Any], alias: str) -> QuerySet[Any]:
    """Lock the rows ``qs`` returns, skipping rows other transactions hold."""
    if connections[alias].vendor == "sqlite":
        return qs  # the transaction already holds the database write lock
    if supports_skip_locked(alias):
        of = ("self",) if connections[alias].features.has_select_for_update_of else ()
        return qs.select_for_update(skip_locked=True, of=of)
    return qs.select_for_update()


# --------------------------------------------------------------------------- inserts


@cache
def insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """The columns a plain ``INSERT`` into ``model``'s table may write: every concrete field
    but an auto-increment key or a generated column (what ``Model.save()`` leaves out)."""
    meta = model._meta
    return tuple(
        field for field in meta.local_concrete_fields if field is not meta.auto_field and not field.generated
    )


def _columns(objs: Sequence[Model]) -> list[Field[Any, Any]]:
    """The columns to write for ``objs``: :func:`insert_fields`, less those whose value is
    left to the database (a field with ``db_default`` that no row sets)."""
    fields = []
    for field in insert_fields(type(objs[0])):
        if field.has_db_default():
            unset = [hasattr(getattr(obj, field.attname), "resolve_expression") for obj in objs]
            if all(unset):
                continue
            if any(unset):
                raise ValueError(f"{field.name} is set on some rows and left to its db_default on others")
        fields.append(field)
    return fields


def can_skip_conflicts(alias: str) -> bool:
    """Whether :func:`insert_rows` can skip rows whose unique keys exist and say which rows
    it inserted: PostgreSQL, and SQLite with ``RETURNING`` (3.35+). MySQL's ``INSERT
    IGNORE`` would also turn other errors into warnings, so it has no such insert here."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return True
    return connection.vendor == "sqlite" and bool(connection.features.can_return_rows_from_bulk_insert)


def _rows_per_statement(connection: BaseDatabaseWrapper, width: int) -> int:
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        getlimit = getattr(connection.connection, "getlimit", None)  # Python 3.11+
        if getlimit is not None:
            import sqlite3

            limit = int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
        else:
            limit = int(connection.features.max_query_params or 999)
    else:
        # PostgreSQL's wire protocol counts parameters in 16 bits; MySQL's packet size is
        # the other bound, kept far away by the row count.
        limit = 65535
    return max(1, min(2000, limit // max(1, width)))


def _table_and_columns(
    connection: BaseDatabaseWrapper, model: type[Model], fields: Sequence[Field[Any, Any]]
) -> tuple[str, str]:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in fields)
    return quote(model._meta.db_table), f"({columns})"


def _prepared(obj: Model, fields: Sequence[Field[Any, Any]], connection: BaseDatabaseWrapper) -> list[Any]:
    """``obj``'s values of ``fields`` as an insert binds them (``pre_save``, as ``save()``
    does, so ``auto_now_add`` and the like get their values too)."""
    return [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]


def _placeholders(width: int) -> str:
    return "(" + ", ".join(["%s"] * width) + ")"


def mark_saved(objs: Sequence[Model], alias: str) -> None:
    """Mark ``objs`` as rows of ``alias`` (what ``save()`` does after an insert)."""
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias


def insert_rows(alias: str, objs: Sequence[Model], *, skip_conflicts: bool = False) -> set[Any]:
    """Insert ``objs`` (all of one model) with multi-row ``INSERT`` statements.

    ``skip_conflicts`` (only where :func:`can_skip_conflicts`): rows whose unique keys exist
    already are skipped, and the primary keys of the rows inserted are returned. Otherwise
    every row is inserted and an empty set returned (a database-generated key is not read
    back: nothing on the hot path reads it)."""
    if not objs:
        return set()
    connection = connections[alias]
    model = type(objs[0])
    fields = _columns(objs)
    table, columns = _table_and_columns(connection, model, fields)
    tail = ""
    if skip_conflicts:
        if not can_skip_conflicts(alias):
            raise ValueError(f"no insert that skips conflicts on {connection.vendor}")
        pk = model._meta.pk
        assert pk is not None
        tail = f" ON CONFLICT DO NOTHING RETURNING {connection.ops.quote_name(str(pk.column))}"
    inserted: set[Any] = set()
    per_statement = _rows_per_statement(connection, len(fields))
    with connection.cursor() as cursor:
        for start in range(0, len(objs), per_statement):
            chunk = objs[start : start + per_statement]
            params: list[Any] = []
            for obj in chunk:
                params += _prepared(obj, fields, connection)
            values = ", ".join([_placeholders(len(fields))] * len(chunk))
            cursor.execute(f"INSERT INTO {table} {columns} VALUES {values}{tail}", params)
            if skip_conflicts:
                inserted.update(row[0] for row in cursor.fetchall())
    if skip_conflicts:
        pk_name = model._meta.pk.attname
        mark_saved([obj for obj in objs if getattr(obj, pk_name) in inserted], alias)
    else:
        mark_saved(objs, alias)
    return inserted


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
    alias: str, obj: Model, guard: tuple[str, list[Any]], *, then: Sequence[Model] = (), notify: bool = False
) -> bool:
    """Insert ``obj`` only while the ``guard`` row (from :func:`guard_for`) still holds its
    values, skipping it if a row with one of its unique keys exists; if inserted, also the
    rows ``then`` (its events) and, with ``notify``, a wake-up of listening workers. True if
    inserted, False if a row was there; :class:`GuardFailed` (nothing written) if the guard
    row changed. The enqueue of a job this process has read before uses it to insert
    without reading the job again.

    PostgreSQL: one statement (the guard, the inserts and ``pg_notify`` in one ``WITH``),
    atomic by itself, so it needs no transaction of its own. SQLite: the insert, then the
    rest, so the caller runs it inside a write transaction."""
    connection = connections[alias]
    fields = _columns([obj])
    table, columns = _table_and_columns(connection, type(obj), fields)
    row = _prepared(obj, fields, connection)
    guard_sql, guard_params = guard
    select = ", ".join(["%s"] * len(row))
    if connection.vendor == "sqlite":
        pk = connection.ops.quote_name(str(obj._meta.pk.column))
        with connection.cursor() as cursor:
            # "WHERE true" tells SQLite's parser that ON CONFLICT belongs to the INSERT.
            cursor.execute(
                f"INSERT INTO {table} {columns} SELECT {select} WHERE EXISTS ({guard_sql})"
                f" ON CONFLICT DO NOTHING RETURNING {pk}",
                [*row, *guard_params],
            )
            inserted = cursor.fetchone() is not None
            if not inserted:
                cursor.execute(guard_sql, guard_params)
                if cursor.fetchone() is None:
                    raise GuardFailed
        if inserted:
            mark_saved([obj], alias)
            insert_rows(alias, then)
            if notify:
                from .wakeup import notify_new_work

                notify_new_work(alias)
        return inserted
    parts = [
        f"g AS ({guard_sql})",
        f"o AS (INSERT INTO {table} {columns} SELECT {select} FROM g ON CONFLICT DO NOTHING RETURNING 1)",
    ]
    params: list[Any] = [*guard_params, *row]
    if then:
        then_fields = _columns(then)
        then_table, then_columns = _table_and_columns(connection, type(then[0]), then_fields)
        selects = " UNION ALL ".join(f"SELECT {', '.join(['%s'] * len(then_fields))} FROM o" for _ in then)
        parts.append(f"t AS (INSERT INTO {then_table} {then_columns} {selects})")
        for item in then:
            params += _prepared(item, then_fields, connection)
    wake = "0"
    if notify:
        # Delivered by PostgreSQL only if (and when) the transaction commits.
        wake = "(SELECT COUNT(*) FROM (SELECT pg_notify(%s, '') FROM o) AS n)"
        params.append(CHANNEL)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {', '.join(parts)} SELECT (SELECT COUNT(*) FROM o), {wake}, (SELECT COUNT(*) FROM g)",
            params,
        )
        count, _, guard_held = cursor.fetchone()
    if not guard_held:
        raise GuardFailed
    if count:
        mark_saved([obj, *then], alias)
    return bool(count)


# --------------------------------------------------------------------------- updates


def update_rows(alias: str, objs: Sequence[Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of each of ``objs`` to its row (by primary key) with one ``UPDATE``
    run for all of them (``executemany``): portable, and without ``bulk_update``'s
    ``CASE WHEN`` statement."""
    if not objs:
        return
    connection = connections[alias]
    meta = objs[0]._meta
    assert meta.pk is not None
    columns = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    sql = "UPDATE {} SET {} WHERE {} = %s".format(
        quote(meta.db_table),
        ", ".join(f"{quote(str(field.column))} = %s" for field in columns),  # type: ignore[union-attr]
        quote(str(meta.pk.column)),
    )
    rows = [
        [field.get_db_prep_save(getattr(obj, field.attname), connection) for field in columns]  # type: ignore[union-attr]
        + [meta.pk.get_db_prep_save(obj.pk, connection)]
        for obj in objs
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def update_returning(
    alias: str,
    model: type[Model],
    values: dict[str, Any],
    where: dict[str, Any],
    where_in: tuple[str, Sequence[Any]],
    returning: Sequence[str],
) -> list[tuple[Any, ...]] | None:
    """``UPDATE <model> SET values WHERE where AND where_in[0] IN where_in[1] RETURNING
    returning`` (fields by name), the rows it changed. None where ``UPDATE`` cannot return
    rows (MySQL/MariaDB): the caller locks, reads and updates instead."""
    connection = connections[alias]
    if connection.vendor not in ("postgresql", "sqlite"):
        return None
    meta = model._meta
    quote = connection.ops.quote_name

    def column(name: str) -> tuple[str, Any]:
        field = meta.get_field(name)
        return quote(str(field.column)), field  # type: ignore[union-attr]

    sets, params = [], []
    for name, value in values.items():
        sql, field = column(name)
        sets.append(f"{sql} = %s")
        params.append(field.get_db_prep_save(value, connection))
    conditions = []
    for name, value in where.items():
        sql, field = column(name)
        conditions.append(f"{sql} = %s")
        params.append(field.get_db_prep_value(value, connection))
    in_sql, in_field = column(where_in[0])
    conditions.append(f"{in_sql} IN ({', '.join(['%s'] * len(where_in[1]))})")
    params += [in_field.get_db_prep_value(value, connection) for value in where_in[1]]
    returned = ", ".join(column(name)[0] for name in returning)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(conditions)}"
            f" RETURNING {returned}",
            params,
        )
        return [tuple(row) for row in cursor.fetchall()]
