"""``Occurrence.trace_context``: the W3C trace context of the span current when the occurrence
was enqueued (the ``[otel]`` extra). Nullable, no default written: existing rows carry none."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0007_budget_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="occurrence",
            name="trace_context",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
    ]
