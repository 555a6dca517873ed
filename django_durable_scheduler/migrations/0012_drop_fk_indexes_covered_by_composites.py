"""Drop the single-column indexes Django gives three foreign keys: occurrence.job,
event.job and event.occurrence. Each is the leading column of a composite index already
((job, trigger_key), (job, event_id), (occurrence, event_id)), which serves the same lookups
and the foreign keys' own checks (MySQL/MariaDB keeps the foreign key on the composite).
Every index is written on each enqueue; on SQLite each is one more page in every commit.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0011_enqueue_function"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="job",
            field=models.ForeignKey(
                db_column="job_id",
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="durable_scheduler.job",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="occurrence",
            field=models.ForeignKey(
                blank=True,
                db_column="occurrence_id",
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="durable_scheduler.occurrence",
            ),
        ),
        migrations.AlterField(
            model_name="occurrence",
            name="job",
            field=models.ForeignKey(
                db_column="job_id",
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="occurrences",
                to="durable_scheduler.job",
            ),
        ),
    ]
