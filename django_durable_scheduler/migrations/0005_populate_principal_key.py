"""Fill ``Occurrence.principal_key`` (the fair-claim partition) from each authority snapshot.

Backward, cancelled occurrences (a status v2 does not know) become dead letters so the
older constraints hold again; the cancellation stays visible in ``last_error``.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from django_durable_scheduler.identity import canonical_json
from django_durable_scheduler.migrations._batch import batches, update_column


def forward(apps: Any, schema_editor: Any) -> None:
    Occurrence = apps.get_model("durable_scheduler", "Occurrence")
    for rows in batches(Occurrence, schema_editor.connection.alias, ["authority"]):
        for row in rows:
            principal = row.authority["principal"]
            row.principal_key = canonical_json([principal["type"], principal["id"]])
        update_column(Occurrence, schema_editor, rows, "principal_key")


def backward(apps: Any, schema_editor: Any) -> None:
    alias = schema_editor.connection.alias
    Occurrence = apps.get_model("durable_scheduler", "Occurrence")
    for row in Occurrence.objects.using(alias).filter(status="cancelled").iterator(chunk_size=2000):
        row.status = "dead_letter"
        row.last_error = {
            "code": "SCHEDULER_CANCELLED",
            "message": "cancelled (migrated back)",
            "previous": row.last_error,
        }
        row.save(update_fields=["status", "last_error"])


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0004_cancelled_status_and_claim_fairness")]
    operations = [migrations.RunPython(forward, backward, elidable=False)]
