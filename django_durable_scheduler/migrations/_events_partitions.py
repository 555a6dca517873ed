"""A frozen copy of the events table's conversion to range partitions by ``occurred_at``, for
migration 0005 only (PostgreSQL; every other database keeps its plain table).

The conversion keeps the ACCESS EXCLUSIVE lock short however many rows the table holds: what
would scan the table is done first without blocking writers (a ``NOT VALID`` check, validated
under a lock that lets inserts through, that every row is before a boundary; a unique index on
(event_id, occurred_at) built ``CONCURRENTLY``), so that the one locked transaction only renames
the old table, creates the partitioned parent and attaches the old table as the partition of
everything before the boundary, which then needs neither a scan nor an index build.

The parent takes its columns, defaults and checks from the old table (``LIKE``), its foreign
keys from the old table's own definitions and its indexes from the model state's ``Meta``
(``schema_editor.add_index``): no column is written out here. Its primary key is
(event_id, occurred_at), since PostgreSQL requires the partition key in every unique key of a
partitioned table; ``event_id`` stays unique as one identity sequence numbers every row, the
old table's, carried on. The identity is the parent's: PostgreSQL (15 tested) lets a
partitioned table have one, used by every insert through the parent (all of this app's);
before PostgreSQL 17 a partition has none of its own, and from 17 partitions share the
parent's, so the old table's identity is dropped before it is attached.

Frozen: never edit this to follow ``partitions.py``; a migration must do the same thing forever.
The migration loader skips modules whose names start with an underscore.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

DAY = timedelta(days=1)
AHEAD_DAYS = 3  # daily partitions made from the boundary on; the workers make the next ones
# The boundary is at least this far ahead, so the check it adds never refuses an insert that
# comes while the index is built.
MARGIN_DAYS = 2
LOCK_TIMEOUT = "10s"  # a migration that cannot lock the table fails instead of queueing writers
CHECK = "dsch_events_before_partitioning"
INITIAL = "pinitial"  # the old table's suffix as a partition: everything before the boundary


def literal(moment: datetime) -> str:
    """A timestamp as SQL text: partition bounds are DDL, which takes no parameters."""
    return moment.astimezone(UTC).strftime("'%Y-%m-%d %H:%M:%S+00'")


def is_partitioned(connection: Any, table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relkind FROM pg_class c WHERE c.relname = %s AND pg_table_is_visible(c.oid)", [table]
        )
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


def boundary(connection: Any, table: str, column: str, now: datetime) -> datetime:
    """The first instant the old table will not hold: midnight UTC at least MARGIN_DAYS after
    now, and after the latest row (a row stamped ahead by a fast clock stays where it is)."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT max({quote(column)}) FROM {quote(table)}")
        (latest,) = cursor.fetchone()
    start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    bound = start + MARGIN_DAYS * DAY
    while latest is not None and latest >= bound:
        bound += DAY
    return bound


def prepare(schema_editor: Any, model: Any, bound: datetime) -> None:
    """Outside the locked transaction: the check that every row is before ``bound``, then its
    validation (SHARE UPDATE EXCLUSIVE: inserts go on), then the partition's unique index built
    concurrently. Each step first undoes what an interrupted earlier run left."""
    connection = schema_editor.connection
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    column = quote(model._meta.get_field("occurred_at").column)
    key = quote(model._meta.pk.column)
    with transaction.atomic(using=connection.alias):
        schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        schema_editor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {quote(CHECK)}")
        schema_editor.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {quote(CHECK)} CHECK ({column} < {literal(bound)}) NOT VALID"
        )
    schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {quote(CHECK)}")
    index = quote(f"{model._meta.db_table}_{INITIAL}_pkey")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}")
    schema_editor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {index} ON {table} ({key}, {column})")


def constraint_rows(connection: Any, table: str, kinds: str) -> list[tuple[str, str, str]]:
    """(name, kind, definition) of ``table``'s own constraints of the kinds given (``p``, ``f``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = ANY(%s) AND conparentid = 0 ORDER BY conname",
            [connection.ops.quote_name(table), list(kinds)],
        )
        return list(cursor.fetchall())


def sequence_state(connection: Any, table: str, column: str) -> tuple[str, int, bool]:
    """The identity sequence of ``table.column``: its name, last value and whether it was used."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, %s)", [connection.ops.quote_name(table), column])
        (sequence,) = cursor.fetchone()
        cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cursor.fetchone()
    return sequence, last, called


def continue_sequence(schema_editor: Any, table: str, column: str, last: int, called: bool) -> None:
    """Give ``table.column`` an identity that goes on from where the old one stopped."""
    quote = schema_editor.connection.ops.quote_name
    schema_editor.execute(
        f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} ADD GENERATED BY DEFAULT AS IDENTITY"
    )
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, %s), %s, %s)", [quote(table), column, last, called]
        )


def swap(schema_editor: Any, model: Any, bound: datetime) -> None:
    """The one locked transaction: the old table becomes the partition of everything before
    ``bound`` under a new partitioned parent, with daily partitions ahead and a default one."""
    connection = schema_editor.connection
    quote = connection.ops.quote_name
    name = model._meta.db_table
    initial = f"{name}_{INITIAL}"
    key, column = model._meta.pk.column, model._meta.get_field("occurred_at").column
    with transaction.atomic(using=connection.alias):
        schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        schema_editor.execute(f"LOCK TABLE {quote(name)} IN ACCESS EXCLUSIVE MODE")
        _, last, called = sequence_state(connection, name, key)
        constraints = constraint_rows(connection, name, "pf")
        schema_editor.execute(f"ALTER TABLE {quote(name)} RENAME TO {quote(initial)}")
        for index in model._meta.indexes:
            schema_editor.execute(
                f"ALTER INDEX {quote(index.name)} RENAME TO {quote(index.name + '_' + INITIAL)}"
            )
        for constraint, kind, _ in constraints:
            if kind == "p":
                schema_editor.execute(f"ALTER TABLE {quote(initial)} DROP CONSTRAINT {quote(constraint)}")
        schema_editor.execute(
            f"ALTER TABLE {quote(initial)} ADD CONSTRAINT {quote(initial + '_pkey')}"
            f" PRIMARY KEY USING INDEX {quote(initial + '_pkey')}"
        )
        schema_editor.execute(f"ALTER TABLE {quote(initial)} ALTER COLUMN {quote(key)} DROP IDENTITY")
        schema_editor.execute(
            f"CREATE TABLE {quote(name)} (LIKE {quote(initial)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
            f" INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE ({quote(column)})"
        )
        schema_editor.execute(f"ALTER TABLE {quote(name)} DROP CONSTRAINT {quote(CHECK)}")
        continue_sequence(schema_editor, name, key, last, called)
        pkey = next(constraint for constraint, kind, _ in constraints if kind == "p")
        schema_editor.execute(
            f"ALTER TABLE {quote(name)} ADD CONSTRAINT {quote(pkey)} PRIMARY KEY ({quote(key)}, {quote(column)})"
        )
        for constraint, kind, definition in constraints:
            if kind == "f":
                schema_editor.execute(
                    f"ALTER TABLE {quote(name)} ADD CONSTRAINT {quote(constraint)} {definition}"
                )
        for index in model._meta.indexes:
            schema_editor.add_index(model, index)
        schema_editor.execute(
            f"ALTER TABLE {quote(name)} ATTACH PARTITION {quote(initial)}"
            f" FOR VALUES FROM (MINVALUE) TO ({literal(bound)})"
        )
        schema_editor.execute(f"ALTER TABLE {quote(initial)} DROP CONSTRAINT {quote(CHECK)}")
        for day in range(AHEAD_DAYS):
            start = bound + day * DAY
            part = quote(f"{name}_p{start:%Y%m%d}")
            schema_editor.execute(
                f"CREATE TABLE {part} PARTITION OF {quote(name)}"
                f" FOR VALUES FROM ({literal(start)}) TO ({literal(start + DAY)})"
            )
        schema_editor.execute(f"CREATE TABLE {quote(name + '_pdefault')} PARTITION OF {quote(name)} DEFAULT")


def forward(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: the events table partitioned by ``occurred_at``. Elsewhere nothing."""
    connection = schema_editor.connection
    model = apps.get_model("durable_scheduler", "Event")
    table = model._meta.db_table
    if connection.vendor != "postgresql" or is_partitioned(connection, table):
        return
    now = timezone.now()
    bound = boundary(connection, table, model._meta.get_field("occurred_at").column, now)
    try:
        prepare(schema_editor, model, bound)
        swap(schema_editor, model, bound)
    except Exception:
        undo_prepare(schema_editor, model)
        raise


def undo_prepare(schema_editor: Any, model: Any) -> None:
    """After a failed run: the plain table as it was. The check above all must go, or every
    insert would be refused once the boundary passes; this waits for its lock as long as it
    takes."""
    quote = schema_editor.connection.ops.quote_name
    name = model._meta.db_table
    schema_editor.execute(f"ALTER TABLE {quote(name)} DROP CONSTRAINT IF EXISTS {quote(CHECK)}")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(f'{name}_{INITIAL}_pkey')}")


def backward(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: one plain table again, the rows copied over (a long lock; going back is for
    development, not for a large production table), as 0001-0004 left it."""
    connection = schema_editor.connection
    model = apps.get_model("durable_scheduler", "Event")
    name = model._meta.db_table
    if connection.vendor != "postgresql" or not is_partitioned(connection, name):
        return
    quote = connection.ops.quote_name
    key = model._meta.pk.column
    plain = f"{name}_plain"
    columns = ", ".join(quote(field.column) for field in model._meta.concrete_fields)
    with transaction.atomic(using=connection.alias):
        schema_editor.execute(f"LOCK TABLE {quote(name)} IN ACCESS EXCLUSIVE MODE")
        _, last, called = sequence_state(connection, name, key)
        constraints = constraint_rows(connection, name, "pf")
        schema_editor.execute(
            f"CREATE TABLE {quote(plain)} (LIKE {quote(name)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
            " INCLUDING STORAGE INCLUDING COMMENTS)"
        )
        schema_editor.execute(f"INSERT INTO {quote(plain)} ({columns}) SELECT {columns} FROM {quote(name)}")
        schema_editor.execute(f"DROP TABLE {quote(name)}")
        schema_editor.execute(f"ALTER TABLE {quote(plain)} RENAME TO {quote(name)}")
        pkey = next(constraint for constraint, kind, _ in constraints if kind == "p")
        schema_editor.execute(
            f"ALTER TABLE {quote(name)} ADD CONSTRAINT {quote(pkey)} PRIMARY KEY ({quote(key)})"
        )
        continue_sequence(schema_editor, name, key, last, called)
        for constraint, kind, definition in constraints:
            if kind == "f":
                schema_editor.execute(
                    f"ALTER TABLE {quote(name)} ADD CONSTRAINT {quote(constraint)} {definition}"
                )
        for index in model._meta.indexes:
            schema_editor.add_index(model, index)
