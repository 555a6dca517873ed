"""Helpers for data migrations: keyset batches and linear-time bulk column updates.

(The migration loader skips modules whose names start with an underscore.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

BATCH = 2000
CHUNK = 100  # rows a statement in update_columns


def batches(
    model: Any,
    alias: str,
    fields: Sequence[str],
    batch: int = BATCH,
    *,
    where: Mapping[str, Any] | None = None,
) -> Iterator[list[Any]]:
    """Rows of ``model`` (those matching the ``where`` filter, if given) in primary-key order,
    ``batch`` at a time: memory stays bounded."""
    last = None
    while True:
        qs = model.objects.using(alias).filter(**(where or {})).order_by("pk").only("pk", *fields)
        if last is not None:
            qs = qs.filter(pk__gt=last)
        rows = list(qs[:batch])
        if not rows:
            return
        yield rows
        last = rows[-1].pk


def update_columns(model: Any, schema_editor: Any, rows: Sequence[Any], *names: str) -> None:
    """UPDATE the columns ``names`` of ``rows``, ``CHUNK`` rows a statement, each row once.

    Each statement is ``SET col = CASE pk WHEN .. THEN .. END, .. WHERE pk IN (..)``, the form
    ``bulk_update`` uses. Its cost grows with the square of the rows in one CASE, so the chunks
    stay small; against one statement a row, it saves a round trip a row (the backfill and the
    principal keys over 100,000 occurrences: 75 -> 25 s on MariaDB, 51 -> 22 s on PostgreSQL).
    PostgreSQL types a CASE of bare parameters as text, so the CASE is cast to the column's type
    there, as ``bulk_update`` does. Not ``bulk_update`` itself: it builds the same statement out
    of expressions, row by row, and the 100,000-occurrence migration took 56 s (SQLite), 55 s
    (PostgreSQL) and 74 s (MariaDB) with it, against 21, 23 and 27 s with this.

    Several columns go in one statement, not one statement a column: PostgreSQL queues a
    deferred foreign-key check for a row updated a second time in one transaction (its
    version is then the transaction's own), and a table with pending checks cannot be altered
    by the operations that follow in the same migration.
    """
    if not rows or not names:
        return
    connection = schema_editor.connection
    quote = connection.ops.quote_name
    pk = model._meta.pk
    table, key = quote(model._meta.db_table), quote(pk.column)
    fields = [model._meta.get_field(name) for name in names]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start : start + CHUNK]
            keys = [row.pk for row in chunk]
            assignments, params = [], []
            for field in fields:
                case = f"CASE {key} {' '.join(['WHEN %s THEN %s'] * len(chunk))} END"
                if connection.features.requires_casted_case_in_updates:
                    case = f"CAST({case} AS {field.db_type(connection)})"
                assignments.append(f"{quote(field.column)} = {case}")
                for row in chunk:
                    params += [row.pk, field.get_db_prep_save(getattr(row, field.attname), connection)]
            where = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"UPDATE {table} SET {', '.join(assignments)} WHERE {key} IN ({where})", params + keys
            )
