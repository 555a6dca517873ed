"""``Occurrence.authority`` stores its snapshot without the envelope's default members and
reads it back whole (``fields.EnvelopeField``). The column is unchanged; rows stored whole
before are read as they are, so no row is rewritten.
"""

from __future__ import annotations

from django.db import migrations

import django_durable_scheduler.fields


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0009_policy_budget_optional")]

    operations = [
        migrations.AlterField(
            model_name="occurrence",
            name="authority",
            field=django_durable_scheduler.fields.EnvelopeField(),
        ),
    ]
