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
  it (PostgreSQL, SQLite 3.35+); elsewhere the caller inserts in a savepoint. The statements
  themselves are built in :mod:`.statements`; this module chooses which one a database runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache, lru_cache
from operator import attrgetter
from typing import Any

from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateField, Field, Model, QuerySet

from ..exceptions import InvalidArgument
from ..models import Occurrence
from . import kept
from .statements import (
    in_list,
    in_params,
    placeholders,
    quoted_columns,
    recordset_statements,
    returning_pk,
    row_values,
    rows_per_statement,
    sqlite_values_statements,
    values_statements,
)


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


def alias_for(using: str | None) -> str:
    """The database alias an operation given ``using=`` runs on: that one, else the database
    the project's routers write this app's models to. The app's tables live in one database
    (checks.py says so otherwise), and its reads go there too: what the kernel reads decides
    what it writes, so it must not come from a replica."""
    if using is not None and not isinstance(using, str):
        raise InvalidArgument("using", "must be a database alias or None")
    return using or router.db_for_write(Occurrence)


# The server's current time, to the microsecond, in UTC. SQLite runs on this host, so its clock
# is the host's.
_SERVER_NOW = {
    "postgresql": "SELECT clock_timestamp()",
    "mysql": "SELECT UTC_TIMESTAMP(6)",
}


def server_now(alias: str) -> datetime | None:
    """The database server's clock (aware UTC), or None where it is this host's (SQLite)."""
    connection = connections[alias]
    sql = _SERVER_NOW.get(connection.vendor)
    if sql is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(sql)
        (value,) = cursor.fetchone()
    server: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
    return server if server.tzinfo is not None else server.replace(tzinfo=UTC)


def planner_row_estimate(queryset: QuerySet[Any]) -> int | None:
    """How many rows the planner expects ``queryset`` to return (PostgreSQL: ``EXPLAIN``'s
    estimate, from the table statistics, in the time it takes to plan), or None where the
    database gives no usable estimate: the caller counts, within a bound, instead."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone()
    if isinstance(plan, str):  # a driver that does not decode json
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


# Per thread: the seconds its write transactions waited for SQLite's write lock (lock_waited).
_lock_waits = threading.local()


def lock_waited() -> float:
    """The seconds this thread's write transactions waited for SQLite's one write lock since
    the last call (0 on other databases): what the worker's loop leaves out of its cost per
    row, since it does not grow with the rows a transaction writes."""
    waited: float = getattr(_lock_waits, "seconds", 0.0)
    _lock_waits.seconds = 0.0
    return waited


def is_deadlock(exc: BaseException) -> bool:
    """Whether ``exc`` is the database undoing a transaction to break a deadlock (MySQL/MariaDB
    error 1213, PostgreSQL SQLSTATE 40P01): nothing of it stayed, and trying again is safe."""
    cause = exc.__cause__
    code = exc.args[0] if exc.args else None
    return code == 1213 or getattr(cause, "sqlstate", getattr(cause, "pgcode", None)) == "40P01"


@contextmanager
def write_transaction(using: str | None = None) -> Iterator[str]:
    """One kernel transaction on ``using`` (yields its alias); inside a caller's transaction,
    a savepoint, so that an error undoes only this operation and the caller's transaction
    stays usable."""
    alias = alias_for(using)
    connection = connections[alias]
    asked = time.monotonic()
    with transaction.atomic(using=alias):
        take_write_lock(connection)
        if connection.vendor == "sqlite":
            _lock_waits.seconds = getattr(_lock_waits, "seconds", 0.0) + time.monotonic() - asked
        yield alias


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


def latest_rows(qs: QuerySet[Any], alias: str) -> QuerySet[Any]:
    """``qs`` read as last committed, inside a transaction that has read before: a locking
    read (waiting) on MySQL/MariaDB, whose repeatable-read snapshot is fixed at a
    transaction's first read; PostgreSQL (read committed) and SQLite (one writer) see the
    latest rows with a plain read."""
    if connections[alias].vendor == "mysql":
        return qs.select_for_update()
    return qs


def shared_lock_clause(alias: str) -> str | None:
    """The clause that locks selected rows against writers but not against each other, where
    the callers rely on it: PostgreSQL's ``FOR SHARE``. Elsewhere None, and callers lock
    exclusively (MySQL/MariaDB: the shared locks its duplicate-key checks take would turn two
    claimers creating the same usage row into a deadlock; SQLite has one writer anyway)."""
    return "FOR SHARE" if connections[alias].vendor == "postgresql" else None


# --------------------------------------------------------------------------- reads


def model_columns(model: type[Model], names: Sequence[str]) -> tuple[Field[Any, Any], ...]:
    """The concrete fields of ``model`` named in ``names`` (by name or attname), in the
    model's own field order: the order :func:`read_models` takes its columns in."""
    wanted = set(names)
    return tuple(
        field for field in model._meta.concrete_fields if field.name in wanted or field.attname in wanted
    )


# The converters of each thread's columns, by alias and column list (a module's constant:
# kept by identity, since hashing its fields costs a call each), found once: a connection
# belongs to one thread, and its backend's converters are its own methods. Thread-local, so
# that they go with the thread and its connections.
_converters_here = threading.local()


def _converters(
    connection: BaseDatabaseWrapper, alias: str, fields: tuple[Field[Any, Any], ...]
) -> list[Any]:
    known: dict[tuple[str, int], tuple[Any, ...]] | None = getattr(_converters_here, "known", None)
    if known is None:
        known = _converters_here.known = {}
    entry = known.get((alias, id(fields)))
    if entry is not None and entry[0] is fields and entry[1] is connection:
        return entry[2]  # type: ignore[no-any-return]
    found = []
    for index, field in enumerate(fields):
        column = field.get_col(field.model._meta.db_table)
        for convert in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
            found.append((index, convert, column))
    known[alias, id(fields)] = (fields, connection, found)
    return found


def read_models(
    alias: str, model: type[Model], fields: tuple[Field[Any, Any], ...], sql: str, params: Any
) -> list[Any]:
    """Instances of ``model`` from the rows of ``sql``, whose columns are ``fields`` (from
    :func:`model_columns`, in that order), each value converted as the ORM converts it
    (``Model.from_db``): what ``QuerySet.raw`` gives, without its per-query setup, for a
    statement sent on every claim."""
    connection = connections[alias]
    converters = _converters(connection, alias, fields)
    names = [field.attname for field in fields]
    rows = kept.fetch(connection, sql, params)  # from a kept plan where the worker keeps them
    found = []
    for row in rows:
        values = list(row)
        for index, convert, column in converters:
            values[index] = convert(values[index], column, connection)
        found.append(model.from_db(alias, names, values))
    return found


# --------------------------------------------------------------------------- inserts


@cache
def insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """The columns a plain ``INSERT`` into ``model``'s table may write: every concrete field
    but an auto-increment key or a generated column (what ``Model.save()`` leaves out)."""
    meta = model._meta
    return tuple(
        field for field in meta.local_concrete_fields if field is not meta.auto_field and not field.generated
    )


@cache
def _with_db_default(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    return tuple(field for field in insert_fields(model) if field.has_db_default())


@cache
def _nullable(model: type[Model]) -> tuple[tuple[Field[Any, Any], ...], Callable[[Model], Any]]:
    """The columns an insert may leave out when no row has a value for them: nullable, with
    no database default, and written as the attribute holds them (no ``auto_now``); with
    the getter of their values (a tuple)."""
    fields = tuple(
        field
        for field in insert_fields(model)
        if field.null
        and not field.primary_key
        and not field.has_db_default()
        and not getattr(field, "auto_now", False)
        and not getattr(field, "auto_now_add", False)
        and (type(field).pre_save is Field.pre_save or isinstance(field, DateField))
    )
    getter = attrgetter(*(field.attname for field in fields)) if len(fields) > 1 else None
    return fields, getter or (lambda obj: ())


def _unset(model: type[Model], objs: Sequence[Model]) -> list[str]:
    """The attnames of the nullable columns (:func:`_nullable`) that are None in every row:
    left out of the insert, the database writes NULL there anyway. A plain occurrence leaves
    out every column of the features it does not use (chains, batches, limits, unique keys,
    traces)."""
    fields, get = _nullable(model)
    if not fields:
        return []
    unset = [i for i, value in enumerate(get(objs[0])) if value is None]
    for obj in objs[1:]:
        if not unset:
            break
        values = get(obj)
        unset = [i for i in unset if values[i] is None]
    return [fields[i].attname for i in unset]


@lru_cache(maxsize=256)  # one entry per shape of row written
def _written(model: type[Model], left: tuple[str, ...]) -> tuple[Field[Any, Any], ...]:
    """``model``'s insert fields but those named in ``left``: by name, since a field's own
    hash is computed in Python and each insert looks its shape up here."""
    fields = insert_fields(model)
    return fields if not left else tuple(field for field in fields if field.attname not in left)


def written_columns(objs: Sequence[Model]) -> tuple[Field[Any, Any], ...]:
    """The columns to write for ``objs``: :func:`insert_fields`, less those whose value is
    left to the database (a field with ``db_default`` that no row sets, a nullable one that
    every row leaves None: :func:`_unset`)."""
    model = type(objs[0])
    left = _unset(model, objs)
    for field in _with_db_default(model):
        unset = [hasattr(getattr(obj, field.attname), "resolve_expression") for obj in objs]
        if all(unset):
            left.append(field.attname)
        elif any(unset):
            raise ValueError(f"{field.name} is set on some rows and left to its db_default on others")
    return _written(model, tuple(left))


def can_skip_conflicts(alias: str) -> bool:
    """Whether :func:`insert_rows` can skip rows whose unique keys exist and say which rows
    it inserted: PostgreSQL, and SQLite with ``RETURNING`` (3.35+). MySQL's ``INSERT
    IGNORE`` would also turn other errors into warnings, so it has no such insert here."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return True
    return connection.vendor == "sqlite" and bool(connection.features.can_return_rows_from_bulk_insert)


def mark_saved(objs: Sequence[Model], alias: str) -> None:
    """Mark ``objs`` as rows of ``alias`` (what ``save()`` does after an insert)."""
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias


# A write without results and its rows of parameters (``executemany``): what
# :func:`insert_rows` may send first, in the round trip of its insert where it can.
Write = tuple[str, Sequence[Sequence[Any]]]


def insert_rows(
    alias: str, objs: Sequence[Model], *, skip_conflicts: bool = False, after: Write | None = None
) -> set[Any]:
    """Insert ``objs`` (all of one model).

    ``after``: a write (an ``UPDATE`` returning nothing, from :func:`update_statement`) that
    must run first, in the caller's transaction: on PostgreSQL it goes as data-modifying
    ``WITH`` clauses of the first insert, one per parameter row, so the two cost one round
    trip (the sub-statements run once and to completion whatever the insert reads of them;
    no insert reads them); elsewhere it runs on its own just before.

    ``skip_conflicts`` (only where :func:`can_skip_conflicts`): rows whose unique keys exist
    already are skipped, and the primary keys of the rows inserted are returned. Otherwise
    every row is inserted and an empty set returned (a database-generated key is not read
    back: nothing on the hot path reads it).

    One row, or MySQL/MariaDB: ``INSERT ... VALUES``. Many rows on PostgreSQL and SQLite:
    ``INSERT ... SELECT`` from the rows, where the columns whose value is the same in every
    row (a bulk enqueue's job columns, a batch's event time) are bound once per statement
    instead of once per row; which ones, is found from the values themselves."""
    connection = connections[alias]
    if not objs or (after is not None and connection.vendor != "postgresql"):
        if after is not None and after[1]:
            with connection.cursor() as cursor:
                if len(after[1]) == 1:  # a statement, not a batch of one, in the query log too
                    cursor.execute(after[0], after[1][0])
                else:
                    cursor.executemany(after[0], after[1])
        if not objs:
            return set()
        after = None
    if skip_conflicts and not can_skip_conflicts(alias):
        raise ValueError(f"no insert that skips conflicts on {connection.vendor}")
    model = type(objs[0])
    fields = written_columns(objs)
    table = connection.ops.quote_name(model._meta.db_table)
    columns = quoted_columns(connection, fields)
    tail = returning_pk(connection, model) if skip_conflicts else ""
    rows = row_values(objs, fields)
    if len(rows) > 1 and connection.vendor == "postgresql":
        statements = recordset_statements(connection, table, columns, fields, rows, tail)
    elif len(rows) > 1 and connection.vendor == "sqlite":
        statements = sqlite_values_statements(connection, table, columns, fields, rows, tail)
    else:
        statements = values_statements(connection, table, columns, fields, rows, tail)
    if after is not None and after[1]:
        statements = _after(after, iter(statements))
    inserted: set[Any] = set()
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)
            if skip_conflicts:
                inserted.update(row[0] for row in cursor.fetchall())
    if skip_conflicts:
        pk_name = model._meta.pk.attname
        mark_saved([obj for obj in objs if getattr(obj, pk_name) in inserted], alias)
    else:
        mark_saved(objs, alias)
    return inserted


def _after(write: Write, statements: Iterator[tuple[str, list[Any]]]) -> Iterator[tuple[str, list[Any]]]:
    """``statements`` (inserts), the first one preceded by ``write`` as ``WITH`` clauses."""
    sql, rows = write
    first, params = next(statements)
    clauses = ", ".join(f"w{n} AS ({sql})" for n in range(len(rows)))
    yield f"WITH {clauses} {first}", [value for row in rows for value in row] + list(params)
    yield from statements


# --------------------------------------------------------------------------- updates


def delete_rows(alias: str, model: type[Model], field: str, values: Sequence[Any]) -> int:
    """Delete the rows of ``model`` whose ``field`` is one of ``values``, without loading them
    (``QuerySet.delete()`` loads every row, payload and all, to look for what points at it):
    for rows nothing else points at. Returns how many went."""
    if not values:
        return 0
    connection = connections[alias]
    column = model._meta.get_field(field)
    quote = connection.ops.quote_name
    prepared = [column.get_db_prep_value(value, connection) for value in values]  # type: ignore[union-attr]
    step = rows_per_statement(connection, 1)
    deleted = 0
    with connection.cursor() as cursor:
        for start in range(0, len(prepared), step):
            chunk = prepared[start : start + step]
            cursor.execute(
                f"DELETE FROM {quote(model._meta.db_table)} WHERE {quote(str(column.column))} "  # type: ignore[union-attr]
                f"IN {placeholders(len(chunk))}",
                chunk,
            )
            deleted += cursor.rowcount
    return deleted


def update_statement(alias: str, objs: Sequence[Model], fields: Sequence[str]) -> Write:
    """One ``UPDATE`` of ``fields`` by primary key, with a row of parameters per object in
    ``objs``: for ``executemany`` (:func:`update_rows`) or to send with an insert
    (:func:`insert_rows`'s ``after``)."""
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
    return sql, rows


def update_rows(alias: str, objs: Sequence[Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of each of ``objs`` to its row (by primary key) with one ``UPDATE``
    run for all of them (``executemany``): portable, and without ``bulk_update``'s
    ``CASE WHEN`` statement."""
    if not objs:
        return
    sql, rows = update_statement(alias, objs, fields)
    with connections[alias].cursor() as cursor:
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
    if not can_update_returning(alias):
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
    conditions.append(in_list(connection, in_sql, len(where_in[1])))
    params += in_params(connection, [in_field.get_db_prep_value(value, connection) for value in where_in[1]])
    returned = ", ".join(column(name)[0] for name in returning)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(conditions)}"
            f" RETURNING {returned}",
            params,
        )
        return [tuple(row) for row in cursor.fetchall()]


def can_update_returning(alias: str) -> bool:
    """Whether ``UPDATE ... RETURNING`` runs here: PostgreSQL, and SQLite 3.35+ (the version
    Django's ``can_return_columns_from_insert`` stands for). MariaDB returns rows only from
    ``INSERT`` and ``DELETE``."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return True
    return connection.vendor == "sqlite" and bool(connection.features.can_return_columns_from_insert)
