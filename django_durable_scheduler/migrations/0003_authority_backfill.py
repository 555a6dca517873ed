"""The seed's v2 backfill: one authority policy per principal, and every job and pending
occurrence bound to revision 1 of its principal's policy.

Batched by primary key so memory stays bounded by the batch size plus one entry per
principal, whatever the number of occurrences. Terminal occurrences are validated but
neither rebound nor allowed to widen a policy (the seed's rule).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import migrations
from django.utils import timezone

from django_durable_scheduler.authority import normalize_authority
from django_durable_scheduler.migrations._batch import batches, update_column

TERMINAL = ("succeeded", "dead_letter")
REF = "schedulerPolicyRevision"
BOUND = "scheduler-authority:1"
DEFAULTS = {"window_ms": 24 * 60 * 60 * 1000, "max_runs": 100_000, "max_units": 100_000}
MEMO_SIZE = 4096  # distinct envelopes remembered; occurrences mostly repeat their job's


def normalizer() -> Any:
    """``normalize_authority`` remembered by the envelope's exact JSON text (key order, ``1``
    against ``1.0`` and ``true`` all kept apart), so a backfill normalizes each distinct
    envelope once, not once a row. Rows share a result: callers must not change it."""
    memo: dict[str, dict[str, Any]] = {}

    def normalize(value: Any, field: str) -> dict[str, Any]:
        try:
            key = json.dumps(value)
        except (TypeError, ValueError):
            return normalize_authority(value, field)  # it says what is wrong
        done = memo.get(key)
        if done is None:
            done = normalize_authority(value, field)
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[key] = done
        return done

    return normalize


def forward(apps: Any, schema_editor: Any) -> None:
    alias = schema_editor.connection.alias
    Job = apps.get_model("durable_scheduler", "Job")
    Occurrence = apps.get_model("durable_scheduler", "Occurrence")
    Policy = apps.get_model("durable_scheduler", "AuthorityPolicy")
    principals: dict[tuple[str, str], set[str]] = {}
    normalize = normalizer()

    def bind(row: Any, label: str) -> None:
        shared = normalize(row.authority, f"{label} {row.pk} authority")
        principal = shared["principal"]
        principals.setdefault((principal["type"], principal["id"]), set()).update(
            shared["requestedCapabilities"]
        )
        row.authority = {**shared, "authorizationRefs": {**shared["authorizationRefs"], REF: BOUND}}

    for rows in batches(Job, alias, ["authority"]):
        for row in rows:
            bind(row, "job")
        update_column(Job, schema_editor, rows, "authority")
    for rows in batches(Occurrence, alias, ["authority", "status"]):
        pending = []
        for row in rows:
            if row.status in TERMINAL:
                normalize(row.authority, f"occurrence {row.pk} authority")
            else:
                bind(row, "occurrence")
                pending.append(row)
        update_column(Occurrence, schema_editor, pending, "authority")
    now = timezone.now()
    Policy.objects.using(alias).bulk_create(
        [
            Policy(
                principal_type=ptype,
                principal_id=pid,
                revision=1,
                enabled=True,
                # May be empty for a principal whose jobs request nothing; readers accept it.
                capabilities=sorted(capabilities),
                created_at=now,
                updated_at=now,
                **DEFAULTS,
            )
            for (ptype, pid), capabilities in sorted(principals.items())
        ],
        batch_size=500,
    )


def backward(apps: Any, schema_editor: Any) -> None:
    alias = schema_editor.connection.alias
    Job = apps.get_model("durable_scheduler", "Job")
    Occurrence = apps.get_model("durable_scheduler", "Occurrence")
    apps.get_model("durable_scheduler", "AuthorityReservation").objects.using(alias).all().delete()
    apps.get_model("durable_scheduler", "AuthorityUsage").objects.using(alias).all().delete()
    apps.get_model("durable_scheduler", "AuthorityPolicy").objects.using(alias).all().delete()
    for model in (Job, Occurrence):
        for rows in batches(model, alias, ["authority"]):
            changed = []
            for row in rows:
                refs = (row.authority or {}).get("authorizationRefs")
                if isinstance(refs, dict) and REF in refs:
                    del refs[REF]
                    changed.append(row)
            update_column(model, schema_editor, changed, "authority")


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0002_authority")]
    operations = [migrations.RunPython(forward, backward, elidable=False)]
