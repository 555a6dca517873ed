"""Drop the ``varchar_pattern_ops`` twins PostgreSQL gets for CharField keys.

Django adds a ``<name>_like`` index next to every indexed or unique ``CharField`` on
PostgreSQL, for ``LIKE 'prefix%'`` lookups. Nothing here looks identifiers up by prefix
(the one ``startswith`` filter, on ``trigger_key``, is served by the (job, trigger_key)
index), and every extra index is written on each insert and status change of the hot
tables. Other databases have no such indexes: nothing to do there.
"""

from __future__ import annotations

from django.db import migrations

# (table, column) of each key whose ``_like`` twin goes.
TWINS = [
    ("durable_scheduler_occurrences", "occurrence_id"),
    ("durable_scheduler_occurrences", "idempotency_key"),
    ("durable_scheduler_occurrences", "job_id"),
    ("durable_scheduler_events", "job_id"),
    ("durable_scheduler_events", "occurrence_id"),
    ("durable_scheduler_authority_reservations", "occurrence_id"),
    ("durable_scheduler_authority_reservations", "job_id"),
]


def _names(schema_editor):
    for table, column in TWINS:
        yield table, column, schema_editor._create_index_name(table, [column], suffix="_like")


def drop_twins(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for _, _, name in _names(schema_editor):
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def restore_twins(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for table, column, name in _names(schema_editor):
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {quote(name)} ON {quote(table)} ({quote(column)} varchar_pattern_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0009_fair_claim_index")]

    operations = [migrations.RunPython(drop_twins, restore_twins, elidable=False)]
