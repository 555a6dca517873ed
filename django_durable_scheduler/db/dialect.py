"""Database-specific SQL behind one small interface, with a portable fallback.

- Write transactions: SQLite has no row locks and one writer at a time, so every kernel
  transaction takes the database write lock as its first act (``transaction_mode=IMMEDIATE``,
  or a no-op write when the project did not configure it). From then on no other writer can
  commit until we do: what the transaction reads is the latest committed state.
- Row locks: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL and MySQL 8 / MariaDB 10.6+, so
  concurrent claimers each take different rows without waiting on each other.
- Reads and writes go through the ORM (``QuerySet.raw`` for the claim's hand-written reads,
  ``bulk_create``); the few statements written by hand take their tables and columns from
  each model's ``_meta``, so a field added with ``makemigrations`` needs no edit here. The
  one insert the ORM cannot say (skip rows whose unique keys exist and report which went in)
  is :mod:`.guarded`'s.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Field, Model, QuerySet

from ..exceptions import InvalidArgument
from ..models import Occurrence

M = TypeVar("M", bound=Model)


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
    if connections[queryset.db].vendor != "postgresql":
        return None
    plan = json.loads(queryset.order_by().values("pk").explain(format="json"))
    if isinstance(plan, list):  # EXPLAIN's JSON is a list of one plan
        plan = plan[0]
    return int(plan["Plan"]["Plan Rows"])


@contextmanager
def without_jit(alias: str) -> Iterator[None]:
    """PostgreSQL's JIT compiler off for the statements inside (``SET LOCAL`` in a transaction
    of their own, or the caller's); elsewhere nothing. For aggregates over many rows with a
    subquery per row: their estimated cost passes the JIT thresholds, and compiling them took
    longer than running them (the history bench: 4.8 s against 1.1 s)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(using=alias):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
        yield


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


def prepare_threshold(alias: str) -> int | None:
    """After how many runs psycopg prepares a statement on ``alias`` (its documented
    ``prepare_threshold``, which takes effect with Django's ``server_side_binding``), or None
    where nothing is prepared: Django's default, and any database but PostgreSQL."""
    connection = connections[alias]
    options = connection.settings_dict.get("OPTIONS", {})
    if connection.vendor != "postgresql" or options.get("server_side_binding") is not True:
        return None
    threshold = options.get("prepare_threshold")  # Django leaves it None: nothing prepared
    return None if threshold is None else int(threshold)


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


def concrete_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """``model``'s fields that are columns of its table (``_meta.get_fields()``, concrete ones)."""
    return tuple(field for field in model._meta.get_fields() if field.concrete)


def model_columns(model: type[Model], names: Sequence[str]) -> tuple[Field[Any, Any], ...]:
    """The concrete fields of ``model`` named in ``names`` (by name or attname), in the
    model's own field order."""
    wanted = set(names)
    return tuple(field for field in concrete_fields(model) if field.name in wanted or field.attname in wanted)


def read_models(alias: str, model: type[M], sql: str, params: Any) -> list[M]:
    """Instances of ``model`` from the rows of ``sql`` (``QuerySet.raw``: columns matched by
    name, each value converted as the ORM converts it)."""
    return list(model._default_manager.db_manager(alias).raw(sql, params))


# --------------------------------------------------------------------------- inserts


def insert(alias: str, objs: Sequence[Model]) -> None:
    """Insert ``objs`` (all of one model) with ``bulk_create``; nothing is sent for none."""
    if objs:
        type(objs[0])._default_manager.db_manager(alias).bulk_create(objs)


def can_skip_conflicts(alias: str) -> bool:
    """Whether the database can skip rows whose unique keys exist and say which rows it
    inserted (``INSERT ... ON CONFLICT DO NOTHING RETURNING``): PostgreSQL, and SQLite 3.35+.
    MySQL's ``INSERT IGNORE`` would also turn other errors into warnings, so it has none here."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return True
    return connection.vendor == "sqlite" and bool(connection.features.can_return_rows_from_bulk_insert)


def mark_saved(objs: Sequence[Model], alias: str) -> None:
    """Mark ``objs`` as rows of ``alias`` (what ``save()`` does after an insert)."""
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias


# --------------------------------------------------------------------------- updates


# Keys per DELETE: under every database's bound on the parameters of one statement.
DELETE_CHUNK = 500


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
    step = DELETE_CHUNK
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


def in_list(connection: BaseDatabaseWrapper, column: str, count: int) -> str:
    """``column`` is one of ``count`` values, which :func:`in_params` gives. On PostgreSQL
    ``column = ANY(%s)``, the values as one array: the statement's text is then the same for
    every count, so one prepared statement serves every size. Elsewhere ``column IN (%s, ...)``."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)"
    return f"{column} IN ({', '.join(['%s'] * count)})"


def in_params(connection: BaseDatabaseWrapper, values: Sequence[Any]) -> list[Any]:
    """The parameters of :func:`in_list` for ``values`` (already as the database takes them)."""
    if connection.vendor == "postgresql":
        return [list(values)]
    return list(values)


def placeholders(width: int) -> str:
    return "(" + ", ".join(["%s"] * width) + ")"


def column_max(model: Any, name: str) -> int:
    """The largest value the integer column ``model.name`` holds on every supported database
    (the portable ranges Django checks against: e.g. 32767 for a small integer)."""
    internal_type = model._meta.get_field(name).get_internal_type()
    return int(BaseDatabaseOperations.integer_field_ranges[internal_type][1])
