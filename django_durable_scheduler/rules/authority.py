"""Authority envelopes: who a job runs as and what it asks to do.

An envelope is stored normalized: unknown keys refused at every level, lists
deduplicated and sorted, absent optional values written as explicit nulls.
"""

from __future__ import annotations

import re
from typing import Any

from ..exceptions import InvalidArgument
from .identity import canonical_json
from .validation import field_key, normalize_identifier

SCHEMA_VERSION = 1
MAX_CAPABILITIES = 256
MIN_WINDOW_MS = 60_000
MAX_WINDOW_MS = 31 * 24 * 60 * 60 * 1000
MAX_BUDGET = 1_000_000
DEFAULT_WINDOW_MS = 24 * 60 * 60 * 1000
DEFAULT_MAX_RUNS = 100_000
DEFAULT_MAX_UNITS = 100_000
POLICY_REF_PREFIX = "scheduler-authority:"
_POLICY_REF = re.compile(r"^scheduler-authority:([1-9][0-9]{0,17})$")

_ENVELOPE_KEYS = {
    "schemaVersion",
    "principal",
    "tenantId",
    "workspaceId",
    "requestedCapabilities",
    "authorizationRefs",
}
_REF_KEYS = {
    "decisionId",
    "policyRevision",
    "schedulerPolicyRevision",
    "grantIds",
    "approvalIds",
    "delegationIds",
}
_REF_LISTS = ("approvalIds", "delegationIds", "grantIds")


def _refuse_unknown(value: dict[str, Any], allowed: set[str], field: str) -> None:
    for key in value:
        if key not in allowed:
            raise InvalidArgument(field_key(field, key), "is not a known key")


def _optional_identifier(value: Any, field: str) -> str | None:
    return None if value is None else normalize_identifier(value, field)


def normalize_identifier_list(value: Any, field: str, *, allow_empty: bool = True) -> list[str]:
    if not isinstance(value, list | tuple):
        raise InvalidArgument(field, f"must be a list, not {type(value).__name__}")
    if len(value) > MAX_CAPABILITIES:
        raise InvalidArgument(field, f"must have at most {MAX_CAPABILITIES} entries (got {len(value)})")
    items = sorted({normalize_identifier(item, f"{field}[{index}]") for index, item in enumerate(value)})
    if not allow_empty and not items:
        raise InvalidArgument(field, "must contain between 1 and 256 entries")
    return items


def normalize_capabilities(
    value: Any, field: str = "capabilities", *, allow_empty: bool = False
) -> list[str]:
    """A sorted, deduplicated list of exact capability identifiers (``*`` is refused)."""
    items = normalize_identifier_list(value, field, allow_empty=allow_empty)
    if "*" in items:
        raise InvalidArgument(field, "must list exact capabilities; '*' is not allowed")
    return items


def normalize_principal(value: Any, field: str = "authority.principal") -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be an object with type and id")
    _refuse_unknown(value, {"type", "id"}, field)
    principal = {
        "type": normalize_identifier(value.get("type"), f"{field}.type", max_length=64),
        "id": normalize_identifier(value.get("id"), f"{field}.id"),
    }
    length, limit = len(principal_key({"principal": principal})), _principal_key_length()
    if length > limit:
        raise InvalidArgument(
            field,
            f"type and id are {length} characters as a principal key (JSON-escaped), "
            f"over the {limit} its column holds",
        )
    return principal


def _principal_key_length() -> int:
    """The length of ``Occurrence.principal_key``: quotes and backslashes in a type or id
    are escaped in the key, so a principal within both identifier limits can exceed it."""
    from ..models import Occurrence  # the app registry is ready when envelopes are checked

    length = Occurrence._meta.get_field("principal_key").max_length
    assert length is not None
    return length


def normalize_authority(value: Any, field: str = "authority") -> dict[str, Any]:
    """Validate and normalize an authority envelope."""
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be an object (the authority envelope)")
    _refuse_unknown(value, _ENVELOPE_KEYS, field)
    version = value.get("schemaVersion", SCHEMA_VERSION)
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise InvalidArgument(f"{field}.schemaVersion", f"must be {SCHEMA_VERSION}")
    refs_in = value.get("authorizationRefs")
    if refs_in is None:
        refs_in = {}
    if not isinstance(refs_in, dict):
        raise InvalidArgument(f"{field}.authorizationRefs", "must be an object")
    _refuse_unknown(refs_in, _REF_KEYS, f"{field}.authorizationRefs")
    refs: dict[str, Any] = {
        "decisionId": _optional_identifier(
            refs_in.get("decisionId"), f"{field}.authorizationRefs.decisionId"
        ),
        "policyRevision": _optional_identifier(
            refs_in.get("policyRevision"), f"{field}.authorizationRefs.policyRevision"
        ),
    }
    for name in _REF_LISTS:
        listed = refs_in.get(name)
        refs[name] = normalize_identifier_list(
            [] if listed is None else listed, f"{field}.authorizationRefs.{name}"
        )
    if refs_in.get("schedulerPolicyRevision") is not None:
        ref = normalize_identifier(
            refs_in["schedulerPolicyRevision"], f"{field}.authorizationRefs.schedulerPolicyRevision"
        )
        if not _POLICY_REF.match(ref):
            raise InvalidArgument(
                f"{field}.authorizationRefs.schedulerPolicyRevision",
                "must look like 'scheduler-authority:<N>'",
            )
        refs["schedulerPolicyRevision"] = ref
    envelope = {
        "schemaVersion": SCHEMA_VERSION,
        "principal": normalize_principal(value.get("principal"), f"{field}.principal"),
        "tenantId": _optional_identifier(value.get("tenantId"), f"{field}.tenantId"),
        "workspaceId": _optional_identifier(value.get("workspaceId"), f"{field}.workspaceId"),
        "requestedCapabilities": normalize_capabilities(
            [] if value.get("requestedCapabilities") is None else value["requestedCapabilities"],
            f"{field}.requestedCapabilities",
            allow_empty=True,
        ),
        "authorizationRefs": refs,
    }
    canonical_json(envelope, field)  # size limit
    return envelope


def default_authority(kind: str, principal: Any) -> dict[str, Any]:
    """The envelope of a job created without one: the app's default principal
    (``DURABLE_SCHEDULER_DEFAULT_PRINCIPAL``), requesting the job's kind as its capability."""
    return normalize_authority(
        {
            "principal": normalize_principal(principal, "DURABLE_SCHEDULER_DEFAULT_PRINCIPAL"),
            "requestedCapabilities": [kind],
        }
    )


def principal_key(authority: dict[str, Any]) -> str:
    """The fairness partition key of an envelope: canonical JSON of [type, id]."""
    principal = authority["principal"]
    return canonical_json([principal["type"], principal["id"]])


def principal_label(authority: Any) -> str:
    """``type:id`` of an envelope's principal, for logs and metrics ("" if it has none)."""
    principal = authority.get("principal") if isinstance(authority, dict) else None
    if not isinstance(principal, dict):
        return ""
    return f"{principal.get('type')}:{principal.get('id')}"


def missing_capabilities(capabilities: list[str], authority: dict[str, Any]) -> list[str]:
    """The capabilities ``authority`` requests that ``capabilities`` (a policy's) do not grant."""
    granted = set(capabilities)
    return [c for c in authority.get("requestedCapabilities") or [] if c not in granted]


def policy_ref(revision: int) -> str:
    return f"{POLICY_REF_PREFIX}{revision}"


def bound_revision(authority: dict[str, Any]) -> int | None:
    """The policy revision an envelope is bound to, or None when unbound."""
    ref = (authority.get("authorizationRefs") or {}).get("schedulerPolicyRevision")
    match = _POLICY_REF.match(ref) if isinstance(ref, str) else None
    return int(match.group(1)) if match else None


def bind(authority: dict[str, Any], revision: int) -> dict[str, Any]:
    refs = dict(authority.get("authorizationRefs") or {})
    refs["schedulerPolicyRevision"] = policy_ref(revision)
    return {**authority, "authorizationRefs": refs}
