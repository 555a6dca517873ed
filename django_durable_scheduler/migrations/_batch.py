"""Helpers for data migrations: keyset batches and linear-time bulk column updates.

(The migration loader skips modules whose names start with an underscore.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

BATCH = 2000
CHUNK = 100  # rows a statement in update_column


def batches(model: Any, alias: str, fields: Sequence[str], batch: int = BATCH) -> Iterator[list[Any]]:
    """Rows of ``model`` in primary-key order, ``batch`` at a time: memory stays bounded."""
    last = None
    while True:
        qs = model.objects.using(alias).order_by("pk").only("pk", *fields)
        if last is not None:
            qs = qs.filter(pk__gt=last)
        rows = list(qs[:batch])
        if not rows:
            return
        yield rows
        last = rows[-1].pk


def update_column(model: Any, schema_editor: Any, rows: Sequence[Any], name: str) -> None:
    """UPDATE one column of ``rows``, ``CHUNK`` rows a statement.

    Each statement is ``SET col = CASE pk WHEN .. THEN .. END WHERE pk IN (..)``, the form
    ``bulk_update`` uses. Its cost grows with the square of the rows in one CASE, so the chunks
    stay small; against one statement a row, it saves a round trip a row (0003 and 0005 over
    100,000 occurrences: 75 -> 25 s on MariaDB, 51 -> 22 s on PostgreSQL). PostgreSQL types a
    CASE of bare parameters as text, so the CASE is cast to the column's type there, as
    ``bulk_update`` does. Not ``bulk_update`` itself: it builds the same statement out of
    expressions, row by row, and the 100,000-occurrence migration took 56 s (SQLite), 55 s
    (PostgreSQL) and 74 s (MariaDB) with it, against 21, 23 and 27 s with this.
    """
    if not rows:
        return
    connection = schema_editor.connection
    field = model._meta.get_field(name)
    pk = model._meta.pk
    quote = connection.ops.quote_name
    table, column, key = quote(model._meta.db_table), quote(field.column), quote(pk.column)
    values = [(row.pk, field.get_db_prep_save(getattr(row, name), connection)) for row in rows]
    with connection.cursor() as cursor:
        for start in range(0, len(values), CHUNK):
            chunk = values[start : start + CHUNK]
            case = f"CASE {key} {' '.join(['WHEN %s THEN %s'] * len(chunk))} END"
            if connection.features.requires_casted_case_in_updates:
                case = f"CAST({case} AS {field.db_type(connection)})"
            keys = ", ".join(["%s"] * len(chunk))
            params = [param for pair in chunk for param in pair] + [pk_value for pk_value, _ in chunk]
            cursor.execute(f"UPDATE {table} SET {column} = {case} WHERE {key} IN ({keys})", params)
