"""Budget state a claim reads without counting: ``AuthorityUsage.verified_at`` (when an audit
last recounted the window's reservations) and ``mismatch`` (what it saw when they differed; a
claim refuses such a window). Existing rows start unverified and unmarked."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0006_events_partitioned"),
    ]

    operations = [
        migrations.AddField(
            model_name="authorityusage",
            name="mismatch",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="authorityusage",
            name="verified_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
