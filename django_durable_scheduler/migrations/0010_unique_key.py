"""``Occurrence.unique_key``: the caller's key for "one waiting at a time" (an enqueue's
``unique_key``, with ``debounce`` or without), and the partial index of the live rows that
have one, by (job, key). Existing rows have no key, so the index starts empty (MySQL/MariaDB,
without partial indexes: one entry per row, with a NULL key). ``UniqueLock``: the per-job row
those enqueues lock, made by the first one."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0009_cancel_requested"),
    ]

    operations = [
        migrations.CreateModel(
            name="UniqueLock",
            fields=[
                ("job_id", models.CharField(max_length=256, primary_key=True, serialize=False)),
                ("locked_at", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_scheduler_unique_locks",
                "ordering": ["job_id"],
            },
        ),
        migrations.AddField(
            model_name="occurrence",
            name="unique_key",
            field=models.CharField(blank=True, default=None, max_length=256, null=True),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(
                    ("unique_key__isnull", False),
                    models.Q(
                        ("status", "queued"), ("status", "retry_wait"), ("status", "running"), _connector="OR"
                    ),
                ),
                fields=["job", "unique_key"],
                name="dsch_occurrences_unique",
            ),
        ),
    ]
