"""The SQL text of the inserts :mod:`.dialect` runs, one builder per way of writing rows: the
portable ``INSERT ... VALUES``, SQLite's ``INSERT ... SELECT`` from a ``VALUES`` list and
PostgreSQL's from ``jsonb_to_recordset`` (the columns every row shares bound once), and the
guarded insert's single statement. Each yields statements and their parameters; which one runs
where is :mod:`.dialect`'s choice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from datetime import date, datetime, time
from functools import cache
from operator import attrgetter
from typing import Any, TypeVar
from uuid import UUID

from django.core.signals import setting_changed
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    CharField,
    DateField,
    DateTimeField,
    Field,
    ForeignKey,
    JSONField,
    Model,
    TextField,
)

__all__ = [
    "RECORDS_PER_STATEMENT",
    "guarded_statement",
    "placeholders",
    "prepare",
    "prepared_row",
    "quoted_columns",
    "recordset_statements",
    "returning_pk",
    "row_values",
    "rows_per_statement",
    "sqlite_values_statements",
    "values_statements",
]


def rows_per_statement(connection: BaseDatabaseWrapper, width: int, bound_once: int = 0) -> int:
    """Rows of ``width`` parameters that fit one statement beside ``bound_once`` others."""
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        getlimit = getattr(connection.connection, "getlimit", None)  # Python 3.11+
        if getlimit is not None:
            import sqlite3

            limit = int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
        else:
            limit = int(connection.features.max_query_params or 999)
    else:
        # MySQL's packet size is the bound here, kept far away by the row count.
        limit = 65535
    return max(1, min(1000, (limit - bound_once) // max(1, width)))


_QUOTED: dict[tuple[str, int], tuple[tuple[Field[Any, Any], ...], str]] = {}


def quoted_columns(connection: BaseDatabaseWrapper, fields: tuple[Field[Any, Any], ...]) -> str:
    """``(col, ...)`` of ``fields``, quoted; kept per database and shape of row (an insert
    of one row builds it every time otherwise)."""
    # By the tuple's identity (the insert paths pass the tuples dialect keeps per shape; a
    # tuple cannot change), kept with the text so that a reused id is never taken for another.
    key = (connection.vendor, id(fields))
    kept = _QUOTED.get(key)
    if kept is not None and kept[0] is fields:
        return kept[1]
    if len(_QUOTED) >= 256:
        _QUOTED.clear()
    quoted = "(" + ", ".join(connection.ops.quote_name(str(field.column)) for field in fields) + ")"
    _QUOTED[key] = (fields, quoted)
    return quoted


def _pg_type(connection: BaseDatabaseWrapper, field: Field[Any, Any]) -> str:
    """``field``'s PostgreSQL type for a cast or a record column; character types without
    their length, which a cast would silently cut values to (the target column still
    refuses a value too long)."""
    return re.sub(
        r"^(varchar|char|character varying|character)\(\d+\)$", r"\1", str(field.cast_db_type(connection))
    )


def _cast(connection: BaseDatabaseWrapper, field: Field[Any, Any]) -> str:
    """``%s`` cast to ``field``'s type, for a value in a PostgreSQL ``SELECT`` list, which
    (unlike ``VALUES``) does not take its types from the target columns."""
    return f"%s::{_pg_type(connection, field)}"


_MISSING = object()
M = TypeVar("M", bound=Model)


@cache
def _init_fields(model: type[Model]) -> tuple[tuple[str, Field[Any, Any], Any], ...]:
    """Per concrete field: its attname, the field, and its default where Django gives the same
    object every time (no default, or one that is not callable, and no ``db_default``), else
    ``_MISSING``: a callable default or a database default is made again for each row."""
    return tuple(
        (
            field.attname,
            field,
            _MISSING
            if (field.has_default() and callable(field.default)) or field.has_db_default()
            else field.get_default(),
        )
        for field in model._meta.concrete_fields
    )


def unsaved(model: type[M], values: dict[str, Any]) -> M:
    """What ``model(**values)`` makes (``values`` by attname: ``job_id``, not ``job``), every
    other field at its default, built from positional values in ``_meta.concrete_fields``
    order: ``Model.__init__``'s keyword path does several lookups per field, and an enqueue
    builds an occurrence and its event for every row it writes."""
    remaining = dict(values)
    args = []
    for attname, field, default in _init_fields(model):
        value = remaining.pop(attname, _MISSING)
        if value is _MISSING:
            value = field.get_default() if default is _MISSING else default
        args.append(value)
    if remaining:
        raise TypeError(f"{model.__name__} has no field {', '.join(sorted(remaining))}")
    return model(*args)


def row_values(objs: Sequence[Model], fields: Sequence[Field[Any, Any]]) -> list[list[Any]]:
    """Per object, its values of ``fields`` as ``save()`` takes them for an insert: what
    ``pre_save`` gives (so ``auto_now_add`` and the like get their values), read directly
    where a field's ``pre_save`` only reads the attribute."""
    get, computed = _readers(tuple(fields))
    rows = []
    for obj in objs:
        row = list(get(obj)) if len(fields) > 1 else [get(obj)]
        for i, field in computed:
            row[i] = field.pre_save(obj, True)
        rows.append(row)
    return rows


_READERS: dict[int, tuple[tuple[Field[Any, Any], ...], Any, list[tuple[int, Field[Any, Any]]]]] = {}


def _readers(
    fields: tuple[Field[Any, Any], ...],
) -> tuple[Callable[[Model], Any], list[tuple[int, Field[Any, Any]]]]:
    """The getter of ``fields``' attributes and the fields whose ``pre_save`` must run, kept
    by the tuple's identity (the insert paths pass the tuples dialect keeps per shape)."""
    kept = _READERS.get(id(fields))
    if kept is not None and kept[0] is fields:
        return kept[1], kept[2]
    if len(_READERS) >= 256:
        _READERS.clear()
    get = attrgetter(*(field.attname for field in fields))
    computed = [(i, field) for i, field in enumerate(fields) if not _reads_attribute(field)]
    _READERS[id(fields)] = (fields, get, computed)
    return get, computed


def _reads_attribute(field: Field[Any, Any]) -> bool:
    """Whether ``field.pre_save`` of a new row only reads the attribute: the base one, or
    Django's date and time fields without ``auto_now``/``auto_now_add`` (each row's times
    would otherwise cost a call apiece)."""
    pre_save = type(field).pre_save
    if pre_save is Field.pre_save:
        return True
    return (
        pre_save in (DateField.pre_save, DateTimeField.pre_save)
        and not getattr(field, "auto_now", False)
        and not getattr(field, "auto_now_add", False)
    )


# What numbers and times became, per field class and database (see prepare); bounded.
_PREPARED: dict[tuple[type, str, type, Any], Any] = {}
_PREPARED_MAX = 512
_REMEMBERED_TYPES = frozenset({int, datetime})


def prepare(field: Field[Any, Any], value: Any, connection: BaseDatabaseWrapper) -> Any:
    """``field.get_db_prep_save(value, connection)``, remembered for numbers and times: an
    insert repeats them (a job's revision and attempts, the time an occurrence's columns
    share, from one call to the next), and Django takes several microseconds for each. Only
    values that cannot change in place, by type and value, per field class (this package's
    fields prepare a value the same whatever the field), and only aware times (two naive ones
    that compare equal may differ in ``fold``, and so in the instant Django makes of them);
    forgotten when a setting that decides how times are stored changes (``override_settings``).
    A non-empty str for a text field, or a key to one, is what Django binds as it is."""
    kind = type(value)
    if kind is str and value and _takes_text_as_is(field):
        return value
    if kind not in _REMEMBERED_TYPES or (kind is datetime and value.tzinfo is None):
        return field.get_db_prep_save(value, connection)
    key = (type(field), connection.alias, kind, value)
    prepared = _PREPARED.get(key, _PREPARED)
    if prepared is _PREPARED:
        prepared = field.get_db_prep_save(value, connection)
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
        _PREPARED[key] = prepared
    return prepared


# Django's text fields, which prepare a str as it is (``to_python`` returns it).
_TEXT_FIELDS = (CharField, TextField)


def _takes_text_as_is(field: Field[Any, Any]) -> bool:
    """Whether ``field`` is one of Django's text fields, or a foreign key to one."""
    target = field.target_field if type(field) is ForeignKey else field
    return type(target) in _TEXT_FIELDS


def _forget_prepared(*, setting: str, **kwargs: Any) -> None:
    if setting in ("USE_TZ", "TIME_ZONE", "DATABASES"):
        _PREPARED.clear()


setting_changed.connect(_forget_prepared, dispatch_uid="django_durable_scheduler.db.statements")


def prepared_row(obj: Model, fields: Sequence[Field[Any, Any]], connection: BaseDatabaseWrapper) -> list[Any]:
    """``obj``'s values of ``fields`` as an insert binds them."""
    (row,) = row_values([obj], fields)
    return [prepare(field, value, connection) for field, value in zip(fields, row, strict=True)]


def in_list(connection: BaseDatabaseWrapper, column: str, count: int) -> str:
    """``column`` is one of ``count`` values, which :func:`in_params` gives. On PostgreSQL
    ``column = ANY(%s)``, the values as one array: the statement's text is then the same for
    every count and has one parameter, so the driver parses it once and reuses that (psycopg
    parses a statement of more than 50 parameters again at each run), and the list is adapted
    in one go. Elsewhere ``column IN (%s, ...)``."""
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


def returning_pk(connection: BaseDatabaseWrapper, model: type[Model]) -> str:
    pk = model._meta.pk
    assert pk is not None
    return f" ON CONFLICT DO NOTHING RETURNING {connection.ops.quote_name(str(pk.column))}"


_ONE_ROW: dict[tuple[Any, ...], tuple[Any, str]] = {}


def one_row_insert(
    connection: BaseDatabaseWrapper, model: type[Model], fields: tuple[Field[Any, Any], ...]
) -> str:
    """``INSERT INTO <table> (<fields>) VALUES (%s, ...)``, built once per database and shape of
    row (by the fields tuple's identity, as :func:`guarded_statement`)."""
    key = (connection.alias, model, id(fields))
    kept = _ONE_ROW.get(key)
    if kept is not None and kept[0] is fields:
        return kept[1]
    table = connection.ops.quote_name(model._meta.db_table)
    sql = f"INSERT INTO {table} {quoted_columns(connection, fields)} VALUES {placeholders(len(fields))}"
    if len(_ONE_ROW) > 256:
        _ONE_ROW.clear()
    _ONE_ROW[key] = (fields, sql)
    return sql


def values_statements(
    connection: BaseDatabaseWrapper,
    table: str,
    columns: str,
    fields: Sequence[Field[Any, Any]],
    rows: list[list[Any]],
    tail: str,
) -> Iterator[tuple[str, list[Any]]]:
    """The portable insert: ``INSERT ... VALUES (...), (...)``, every value bound."""
    # One row (an enqueue's event) always fits: no need to ask the database its limit.
    per_statement = 1 if len(rows) == 1 else rows_per_statement(connection, len(fields))
    for start in range(0, len(rows), per_statement):
        chunk = rows[start : start + per_statement]
        params = [
            prepare(field, value, connection)
            for row in chunk
            for field, value in zip(fields, row, strict=True)
        ]
        values = ", ".join([placeholders(len(fields))] * len(chunk))
        yield f"INSERT INTO {table} {columns} VALUES {values}{tail}", params


def _constant_columns(rows: list[list[Any]]) -> list[bool]:
    """Per column, whether every row holds the first row's value (never the first column, so
    that each row keeps one value of its own). The same object, or an equal scalar of the
    same type: Python's equality would take ``{"a": 1}`` for ``{"a": True}``."""
    first = rows[0]
    same = [all(_same(row[i], first[i]) for row in rows) for i in range(len(first))]
    same[0] = False
    return same


_SCALARS = frozenset({str, int, datetime, date, time, UUID})


def _same(value: Any, other: Any) -> bool:
    return value is other or (type(value) is type(other) and type(value) in _SCALARS and value == other)


def sqlite_values_statements(
    connection: BaseDatabaseWrapper,
    table: str,
    columns: str,
    fields: Sequence[Field[Any, Any]],
    rows: list[list[Any]],
    tail: str,
) -> Iterator[tuple[str, list[Any]]]:
    """SQLite's bulk insert: ``INSERT ... SELECT`` from a ``VALUES`` list of the columns that
    differ between the rows, the others bound once."""
    same = _constant_columns(rows)
    varying = [i for i, constant in enumerate(same) if not constant]
    constants = [fields[i].get_db_prep_save(rows[0][i], connection) for i, c in enumerate(same) if c]
    select = []
    for i in range(len(fields)):
        select.append("%s" if same[i] else f"v.column{varying.index(i) + 1}")
    # "WHERE true" tells SQLite's parser that an ON CONFLICT belongs to the INSERT.
    per_statement = rows_per_statement(connection, len(varying), len(constants))
    convert = [(i, _memo_prep(fields[i], connection)) for i in varying]
    for start in range(0, len(rows), per_statement):
        chunk = rows[start : start + per_statement]
        params = list(constants)
        for row in chunk:
            params += [prep(row[i]) for i, prep in convert]
        values = ", ".join([placeholders(len(varying))] * len(chunk))
        yield (
            f"INSERT INTO {table} {columns} SELECT {', '.join(select)} FROM (VALUES {values}) AS v"
            f" WHERE true{tail}",
            params,
        )


def _memo_prep(field: Field[Any, Any], connection: BaseDatabaseWrapper) -> Callable[[Any], Any]:
    """``field.get_db_prep_save`` for a run of values, remembering the last one (rows built
    together often share a value, a time above all)."""
    last: list[Any] = [object(), None]

    def prep(value: Any) -> Any:
        if value is not last[0]:
            last[:] = value, field.get_db_prep_save(value, connection)
        return last[1]

    return prep


# Rows per PostgreSQL bulk statement: one JSON document of this many records.
RECORDS_PER_STATEMENT = 5000


def recordset_statements(
    connection: BaseDatabaseWrapper,
    table: str,
    columns: str,
    fields: Sequence[Field[Any, Any]],
    rows: list[list[Any]],
    tail: str,
) -> Iterator[tuple[str, list[Any]]]:
    """PostgreSQL's bulk insert: ``INSERT ... SELECT`` from ``jsonb_to_recordset`` of one
    JSON parameter holding the columns that differ between the rows, so thousands of rows
    are one parameter to send and parse instead of a statement of tens of thousands."""
    same = _constant_columns(rows)
    varying = [i for i, constant in enumerate(same) if not constant]
    select: list[str] = []
    constants: list[Any] = []
    record: list[str] = []
    for i, field in enumerate(fields):
        if same[i]:
            select.append(_cast(connection, field))
            constants.append(field.get_db_prep_save(rows[0][i], connection))
        else:
            select.append(f"v.c{i}")
            record.append(f"c{i} {_pg_type(connection, field)}")
    source = f"jsonb_to_recordset(%s::jsonb) AS v({', '.join(record)})"
    sql = f"INSERT INTO {table} {columns} SELECT {', '.join(select)} FROM {source}{tail}"
    convert = [(f"c{i}", i, _json_converter(fields[i], connection)) for i in varying]
    for start in range(0, len(rows), RECORDS_PER_STATEMENT):
        chunk = rows[start : start + RECORDS_PER_STATEMENT]
        records = [{key: to_json(row[i]) for key, i, to_json in convert} for row in chunk]
        yield sql, [*constants, json.dumps(records, ensure_ascii=False, separators=(",", ":"))]


def _json_converter(field: Field[Any, Any], connection: BaseDatabaseWrapper) -> Callable[[Any], Any]:
    """How a value of ``field`` goes into a JSON record for ``jsonb_to_recordset``: a JSON
    column's value as the JSON it is, anything else as the text or number the column's
    input function reads, from the field's own ``get_db_prep_save``."""
    if isinstance(field, JSONField):
        if field.encoder is None:
            return lambda value: value
        encoder = field.encoder
        return lambda value: json.loads(json.dumps(value, cls=encoder))
    prep = _memo_prep(field, connection)

    def convert(value: Any) -> Any:
        prepared = prep(value)
        if prepared is None or isinstance(prepared, bool | int | float | str):
            return prepared
        return prepared.isoformat() if isinstance(prepared, datetime | date | time) else str(prepared)

    return convert


_GUARDED: dict[tuple[Any, ...], tuple[Any, Any, str]] = {}


def guarded_statement(
    connection: BaseDatabaseWrapper,
    model: type[Model],
    fields: tuple[Field[Any, Any], ...],
    guard_sql: str,
    then: Sequence[Model],
    then_fields: tuple[Field[Any, Any], ...],
    notify: bool,
) -> str:
    """The statement of :func:`.guarded.insert_guarded`, built once per database, columns and shape."""
    then_model = type(then[0]) if then else None
    # By the field tuples' identity (dialect keeps one per shape of row; hashing the fields
    # themselves costs more than the statement saves), checked against the tuples kept.
    key = (connection.alias, model, id(fields), id(then_fields), guard_sql, then_model, len(then), notify)
    kept = _GUARDED.get(key)
    if kept is not None and kept[0] is fields and kept[1] is then_fields:
        return kept[2]
    quote = connection.ops.quote_name
    table, columns = quote(model._meta.db_table), quoted_columns(connection, fields)
    if connection.vendor == "sqlite":
        pk = returning_pk(connection, model)
        # "WHERE EXISTS" also tells SQLite's parser that ON CONFLICT belongs to the INSERT.
        sql = (
            f"INSERT INTO {table} {columns} SELECT {', '.join(['%s'] * len(fields))}"
            f" WHERE EXISTS ({guard_sql}){pk}"
        )
    else:
        select = ", ".join(_cast(connection, field) for field in fields)
        parts = [
            f"g AS ({guard_sql})",
            f"o AS (INSERT INTO {table} {columns} SELECT {select} FROM g ON CONFLICT DO NOTHING RETURNING 1)",
        ]
        if then_model is not None:
            then_select = ", ".join(_cast(connection, field) for field in then_fields)
            rows = " UNION ALL ".join([f"SELECT {then_select} FROM o"] * len(then))
            parts.append(
                f"t AS (INSERT INTO {quote(then_model._meta.db_table)}"
                f" {quoted_columns(connection, then_fields)} {rows})"
            )
        if notify:
            # Delivered by PostgreSQL only if (and when) the transaction commits.
            parts.append("n AS (SELECT pg_notify(%s, '') FROM o)")
        counted = ", (SELECT COUNT(*) FROM n)" if notify else ""
        sql = f"WITH {', '.join(parts)} SELECT (SELECT COUNT(*) FROM o), (SELECT COUNT(*) FROM g){counted}"
    if len(_GUARDED) > 256:
        _GUARDED.clear()
    _GUARDED[key] = (fields, then_fields, sql)
    return sql
