"""Helpers for data migrations: keyset batches and linear-time bulk column updates.

(The migration loader skips modules whose names start with an underscore.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

BATCH = 2000


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
    """UPDATE one column of ``rows`` with one prepared statement per row (executemany).

    ``bulk_update`` builds a CASE with a branch per row, which costs O(batch**2) on some
    databases; this stays linear.
    """
    if not rows:
        return
    connection = schema_editor.connection
    field = model._meta.get_field(name)
    pk = model._meta.pk
    quote = connection.ops.quote_name
    sql = f"UPDATE {quote(model._meta.db_table)} SET {quote(field.column)} = %s WHERE {quote(pk.column)} = %s"
    params = [(field.get_db_prep_save(getattr(row, name), connection), row.pk) for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
