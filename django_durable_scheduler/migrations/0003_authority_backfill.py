"""The authority backfill: one authority policy per principal, and every job and pending
occurrence bound to revision 1 of its principal's policy.

Batched by primary key so memory stays bounded by the batch size plus one entry per
principal, whatever the number of occurrences. Terminal occurrences are validated but
neither rebound nor allowed to widen a policy: a finished run grants nothing to future ones.

The envelope rules are written out here, as they stood when this migration was written,
rather than imported from ``authority.py``: the backfill must read a v1 envelope tomorrow
as it does today, whatever the app's own normalization becomes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import migrations
from django.utils import timezone

from ._batch import batches, update_columns

TERMINAL = ("succeeded", "dead_letter")
REF = "schedulerPolicyRevision"
BOUND = "scheduler-authority:1"
DEFAULTS = {"window_ms": 24 * 60 * 60 * 1000, "max_runs": 100_000, "max_units": 100_000}
MEMO_SIZE = 4096  # distinct envelopes remembered; occurrences mostly repeat their job's

# The v1 authority envelope.
ENVELOPE_KEYS = frozenset(
    {"schemaVersion", "principal", "tenantId", "workspaceId", "requestedCapabilities", "authorizationRefs"}
)
REF_KEYS = frozenset({"decisionId", "policyRevision", REF, "grantIds", "approvalIds", "delegationIds"})
REF_LISTS = ("approvalIds", "delegationIds", "grantIds")
BOUND_REF = re.compile(r"^scheduler-authority:([1-9][0-9]{0,17})$")
CONTROL = re.compile("[\x00-\x1f\x7f]")
MAX_IDENTIFIER = 256
MAX_LIST = 256
MAX_BYTES = 1024 * 1024  # of the envelope as canonical JSON


def refuse(field: str, message: str) -> ValueError:
    return ValueError(f"{field}: {message}")


def identifier(value: Any, field: str, max_length: int = MAX_IDENTIFIER) -> str:
    """A stripped, non-empty string of at most ``max_length`` characters, valid Unicode,
    without control characters."""
    if not isinstance(value, str):
        raise refuse(field, f"must be a string, not {type(value).__name__}")
    text = value.strip()
    if not text:
        raise refuse(field, "must not be empty")
    if len(text) > max_length:
        raise refuse(field, f"must be at most {max_length} characters (got {len(text)})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise refuse(field, "holds a lone surrogate, which is not valid Unicode text") from None
    control = CONTROL.search(text)
    if control is not None:
        raise refuse(field, f"must not contain control characters (found U+{ord(control.group()):04X})")
    return text


def optional_identifier(value: Any, field: str) -> str | None:
    return None if value is None else identifier(value, field)


def identifier_list(value: Any, field: str) -> list[str]:
    """Sorted and deduplicated; may be empty."""
    if not isinstance(value, list | tuple):
        raise refuse(field, f"must be a list, not {type(value).__name__}")
    if len(value) > MAX_LIST:
        raise refuse(field, f"must have at most {MAX_LIST} entries (got {len(value)})")
    return sorted({identifier(item, f"{field}[{index}]") for index, item in enumerate(value)})


def refuse_unknown(value: dict[str, Any], allowed: frozenset[str], field: str) -> None:
    for key in value:
        if key not in allowed:
            raise refuse(f"{field}.{key}", "is not a known key")


def normalize_authority(value: Any, field: str) -> dict[str, Any]:
    """The normalized envelope: unknown keys refused at every level, lists deduplicated and
    sorted, absent optional values written as explicit nulls."""
    if not isinstance(value, dict):
        raise refuse(field, "must be an object (the authority envelope)")
    refuse_unknown(value, ENVELOPE_KEYS, field)
    version = value.get("schemaVersion", 1)
    if version != 1 or isinstance(version, bool):
        raise refuse(f"{field}.schemaVersion", "must be 1")
    refs_in = value.get("authorizationRefs")
    if refs_in is None:
        refs_in = {}
    if not isinstance(refs_in, dict):
        raise refuse(f"{field}.authorizationRefs", "must be an object")
    refuse_unknown(refs_in, REF_KEYS, f"{field}.authorizationRefs")
    refs: dict[str, Any] = {
        name: optional_identifier(refs_in.get(name), f"{field}.authorizationRefs.{name}")
        for name in ("decisionId", "policyRevision")
    }
    for name in REF_LISTS:
        listed = refs_in.get(name)
        refs[name] = identifier_list([] if listed is None else listed, f"{field}.authorizationRefs.{name}")
    if refs_in.get(REF) is not None:
        ref = identifier(refs_in[REF], f"{field}.authorizationRefs.{REF}")
        if not BOUND_REF.match(ref):
            raise refuse(f"{field}.authorizationRefs.{REF}", "must look like 'scheduler-authority:<N>'")
        refs[REF] = ref
    principal = value.get("principal")
    if not isinstance(principal, dict):
        raise refuse(f"{field}.principal", "must be an object with type and id")
    refuse_unknown(principal, frozenset({"type", "id"}), f"{field}.principal")
    envelope: dict[str, Any] = {
        "schemaVersion": 1,
        "principal": {
            "type": identifier(principal.get("type"), f"{field}.principal.type", max_length=64),
            "id": identifier(principal.get("id"), f"{field}.principal.id"),
        },
        "tenantId": optional_identifier(value.get("tenantId"), f"{field}.tenantId"),
        "workspaceId": optional_identifier(value.get("workspaceId"), f"{field}.workspaceId"),
        "requestedCapabilities": identifier_list(
            [] if value.get("requestedCapabilities") is None else value["requestedCapabilities"],
            f"{field}.requestedCapabilities",
        ),
        "authorizationRefs": refs,
    }
    if "*" in envelope["requestedCapabilities"]:
        raise refuse(f"{field}.requestedCapabilities", "must list exact capabilities; '*' is not allowed")
    # Canonical JSON orders keys differently; its size is the same.
    size = len(json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > MAX_BYTES:
        raise refuse(field, f"is {size} bytes as canonical JSON, over the {MAX_BYTES} byte limit")
    return envelope


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
        update_columns(Job, schema_editor, rows, "authority")
    for rows in batches(Occurrence, alias, ["authority", "status"]):
        pending = []
        for row in rows:
            if row.status in TERMINAL:
                normalize(row.authority, f"occurrence {row.pk} authority")
            else:
                bind(row, "occurrence")
                pending.append(row)
        update_columns(Occurrence, schema_editor, pending, "authority")
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
            update_columns(model, schema_editor, changed, "authority")


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0002_authority")]
    operations = [migrations.RunPython(forward, backward, elidable=False)]
