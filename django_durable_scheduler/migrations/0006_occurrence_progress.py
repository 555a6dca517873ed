"""``Occurrence.progress``: a running handler's last progress report (``ctx.report_progress``),
shown to operators in the admin. A nullable column: adding it rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0005_events_partitioned"),
    ]

    operations = [
        migrations.AddField(
            model_name="occurrence",
            name="progress",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
    ]
