"""A cancel requested while the occurrence runs: when, and the fence of the attempt it names.
Existing rows have none."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0008_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="occurrence",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="cancel_requested_fence",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
    ]
