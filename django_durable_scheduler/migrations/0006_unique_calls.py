"""The ``UniqueCall`` table: one row per unique or debounced enqueue, its identity, the
occurrence it resolved to and its payload's digest, so that the same call again is answered
as it was the first time (docs/design.md, "Unique keys and debounce"). Its foreign key to the
occurrence has the index retention deletes by, and no other.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


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
                "db_table": "durable_scheduler_unique_calls",
                "indexes": [models.Index(fields=["occurrence"], name="dsch_unique_calls_occurrence")],
            },
        ),
    ]
