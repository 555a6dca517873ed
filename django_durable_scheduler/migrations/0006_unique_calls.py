"""The ``UniqueCall`` table: one row per unique or debounced enqueue, its identity, the
occurrence it resolved to and its payload's digest, so that the same call again is answered
as it was the first time (docs/design.md, "Unique keys and debounce"). Its foreign key to the
occurrence has the index retention deletes by; on PostgreSQL the ``varchar_pattern_ops`` twin
of its key goes, as the hot keys' went in 0004 (written on every keyed enqueue, never looked
up by prefix).
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

TABLE = "durable_scheduler_unique_calls"
# The twin Django makes next to the primary key on PostgreSQL, as it names it.
PATTERN_TWIN = ("durable_scheduler_unique_calls_call_key_52df8215_like", "call_key")


def drop_pattern_twin(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: drop the key's ``<index>_like`` twin (other databases make none)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(PATTERN_TWIN[0])}")


def restore_pattern_twin(apps: Any, schema_editor: Any) -> None:
    """Backward: the twin as Django makes it (the table itself goes next)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    name, column = PATTERN_TWIN
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {quote(name)} ON {quote(TABLE)} ({quote(column)} varchar_pattern_ops)"
    )


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0005_events_partitioned")]

    operations = [
        migrations.CreateModel(
            name="UniqueCall",
            fields=[
                ("call_key", models.CharField(max_length=77, primary_key=True, serialize=False)),
                ("payload_digest", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField()),
                (
                    "occurrence",
                    models.ForeignKey(
                        db_column="occurrence_id",
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="unique_calls",
                        to="durable_scheduler.occurrence",
                    ),
                ),
            ],
            options={
                "db_table": TABLE,
                "indexes": [models.Index(fields=["occurrence"], name="dsch_unique_calls_occurrence")],
            },
        ),
        migrations.RunPython(drop_pattern_twin, restore_pattern_twin, elidable=False),
    ]
