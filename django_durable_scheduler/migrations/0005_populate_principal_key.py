"""Fill ``Occurrence.principal_key`` (the fair-claim partition) from each authority snapshot.

Backward, cancelled occurrences (a status v2 does not know) become dead letters so the
older constraints hold again; the cancellation stays visible in ``last_error``.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from django_durable_scheduler.identity import canonical_json

BATCH = 2000


def forward(apps: Any, schema_editor: Any) -> None:
    alias = schema_editor.connection.alias
    Occurrence = apps.get_model("durable_scheduler", "Occurrence")
    last = None
    while True:
        qs = Occurrence.objects.using(alias).order_by("pk").only("pk", "authority")
        if last is not None:
            qs = qs.filter(pk__gt=last)
        rows = list(qs[:BATCH])
        if not rows:
            return
        for row in rows:
            principal = row.authority["principal"]
            row.principal_key = canonical_json([principal["type"], principal["id"]])
        Occurrence.objects.using(alias).bulk_update(rows, ["principal_key"])
        last = rows[-1].pk


def backward(apps: Any, schema_editor: Any) -> None:
    alias = schema_editor.connection.alias
    Occurrence = apps.get_model("durable_scheduler", "Occurrence")
    for row in Occurrence.objects.using(alias).filter(status="cancelled").iterator(chunk_size=BATCH):
        row.status = "dead_letter"
        row.last_error = {"code": "SCHEDULER_CANCELLED", "message": "cancelled (migrated back)", "previous": row.last_error}
        row.save(update_fields=["status", "last_error"])


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0004_cancelled_status_and_claim_fairness")]
    operations = [migrations.RunPython(forward, backward, elidable=False)]
