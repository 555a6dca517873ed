"""Give existing scheduled jobs their first fire time (strictly after the migration runs)."""

from __future__ import annotations

from typing import Any

from django.db import migrations
from django.utils import timezone

from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.migrations._batch import batches, update_column
from django_durable_scheduler.schedules import initial_fire_time
from django_durable_scheduler.triggers import validate_trigger


def forward(apps: Any, schema_editor: Any) -> None:
    Job = apps.get_model("durable_scheduler", "Job")
    now = timezone.now()
    for rows in batches(Job, schema_editor.connection.alias, ["trigger", "created_at"]):
        changed = []
        for row in rows:
            try:
                trigger = validate_trigger(row.trigger or {})
            except InvalidArgument:
                continue  # an invalid stored trigger never fires; update_job can repair it
            row.next_fire_at = initial_fire_time(trigger, now=now, anchor=row.created_at)
            if row.next_fire_at is not None:
                changed.append(row)
        update_column(Job, schema_editor, changed, "next_fire_at")


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0006_schedule_columns")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop, elidable=False)]
