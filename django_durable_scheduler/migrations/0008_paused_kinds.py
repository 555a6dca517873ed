"""The paused kinds: a row per kind that no worker claims while it exists (kernel/pausing.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0007_throttles"),
    ]

    operations = [
        migrations.CreateModel(
            name="PausedKind",
            fields=[
                ("kind", models.CharField(max_length=128, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField()),
                ("paused_by", models.CharField(blank=True, default="", max_length=256)),
            ],
            options={
                "verbose_name": "paused kind",
                "db_table": "durable_scheduler_paused_kinds",
                "ordering": ["kind"],
            },
        ),
    ]
