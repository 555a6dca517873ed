"""Authority envelopes: who a job runs as and what it asks to do.

An envelope is stored normalized: unknown keys refused at every level, lists
deduplicated and sorted, absent optional values written as explicit nulls. The normalized
form is an :class:`Envelope`: a dict (it is stored as JSON, and handlers read it as
``ctx.authority``) whose keys and value types are named once, here. A dict given at the API's
edge becomes one through :func:`normalize_authority`, and only that function makes one.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple, TypedDict

from ..exceptions import InvalidArgument
from .identity import canonical_json
from .validation import field_key, normalize_identifier

SCHEMA_VERSION = 1
MAX_CAPABILITIES = 256
MAX_TYPE_LENGTH = 64  # AuthorityPolicy.principal_type
MIN_WINDOW_MS = 60_000
MAX_WINDOW_MS = 31 * 24 * 60 * 60 * 1000
MAX_BUDGET = 1_000_000
DEFAULT_WINDOW_MS = 24 * 60 * 60 * 1000
# No budget unless one is configured: a policy made without one never holds work back.
DEFAULT_MAX_RUNS: int | None = None
DEFAULT_MAX_UNITS: int | None = None
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


class EnvelopePrincipal(TypedDict):
    """An envelope's ``principal``: what :class:`Principal` is as stored."""

    type: str
    id: str


class _CallerRefs(TypedDict):
    decisionId: str | None
    policyRevision: str | None
    grantIds: list[str]
    approvalIds: list[str]
    delegationIds: list[str]


# Its optional key in a class of its own (total=False) rather than as NotRequired[...]: under
# postponed annotations Python 3.11 cannot see NotRequired, and would call it required.
class AuthorizationRefs(_CallerRefs, total=False):
    """An envelope's ``authorizationRefs``: the caller's references (``decisionId``,
    ``policyRevision``, ``grantIds``, ``approvalIds``, ``delegationIds``), and the policy
    revision the scheduler bound it to (``schedulerPolicyRevision``,
    ``scheduler-authority:<N>``; absent while unbound)."""

    schedulerPolicyRevision: str


class Envelope(TypedDict):
    """A normalized authority envelope (``Job.authority``, ``Occurrence.authority``,
    ``ctx.authority``): who runs (``principal``) and what it asks to do
    (``requestedCapabilities``), lists sorted and deduplicated, absent values null."""

    schemaVersion: int
    principal: EnvelopePrincipal
    tenantId: str | None
    workspaceId: str | None
    requestedCapabilities: list[str]
    authorizationRefs: AuthorizationRefs


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


_new_tuple = tuple.__new__


class Principal(NamedTuple):
    """Who a job runs as. A tuple ``(type, id)``, so it compares, sorts and hashes as the
    ``(principal_type, principal_id)`` pairs the policy tables are keyed by.

    Its stored forms: the envelope's ``{"type", "id"}`` (:meth:`as_dict`, also the
    ``principal`` of error details and event payloads), the occurrences' ``principal_key``
    (:attr:`key`, canonical JSON of ``[type, id]``) and the policy tables' two columns
    (:meth:`columns`); logs, metrics and messages show :attr:`label` (``type:id``).
    """

    type: str
    id: str

    @classmethod
    def parse(cls, value: Any, field: str = "principal") -> Principal:
        """Validate a principal given as an envelope's ``{"type", "id"}`` (refusing
        ``field.type``/``field.id``; its key must fit ``Occurrence.principal_key``), as a
        ``principal_key`` string (refusing ``field``), or as a ``(type, id)`` pair (refusing
        ``field_type``/``field_id``, the policy functions' parameters and columns)."""
        if isinstance(value, dict):
            return cls.parse_dict(value, field)
        if isinstance(value, str):
            return cls._parse_key(value, field)
        if isinstance(value, tuple | list) and len(value) == 2:
            return cls(
                normalize_identifier(value[0], f"{field}_type", max_length=MAX_TYPE_LENGTH),
                normalize_identifier(value[1], f"{field}_id"),
            )
        raise InvalidArgument(
            field, "must be an object with type and id, a principal key or a (type, id) pair"
        )

    @classmethod
    def parse_dict(cls, value: Any, field: str = "authority.principal") -> Principal:
        """Validate the envelope's shape only, ``{"type", "id"}`` (see :meth:`parse`)."""
        if not isinstance(value, dict):
            raise InvalidArgument(field, "must be an object with type and id")
        _refuse_unknown(value, {"type", "id"}, field)
        principal = cls(
            normalize_identifier(value.get("type"), f"{field}.type", max_length=MAX_TYPE_LENGTH),
            normalize_identifier(value.get("id"), f"{field}.id"),
        )
        length, limit = len(principal.key), PRINCIPAL_KEY_LENGTH
        if length > limit:
            raise InvalidArgument(
                field,
                f"type and id are {length} characters as a principal key (JSON-escaped), "
                f"over the {limit} its column holds",
            )
        return principal

    @classmethod
    def _parse_key(cls, value: str, field: str) -> Principal:
        try:
            principal = cls.from_key(value)
        except ValueError:
            principal = None
        if principal is not None:
            principal = cls.parse_dict(principal.as_dict(), field)
        # The key of the normalized principal, byte for byte: the key a row stores.
        if principal is None or principal.key != value:
            raise InvalidArgument(field, "must be a principal key: the canonical JSON of [type, id]")
        return principal

    @classmethod
    def of(cls, authority: Envelope) -> Principal:
        """The principal of a normalized (stored) envelope, unchecked. Once per row on the
        claim, so built as the generated constructor would, without its extra call."""
        principal = authority["principal"]
        return _new_tuple(cls, (principal["type"], principal["id"]))

    @classmethod
    def of_row(cls, row: Any) -> Principal:
        """The principal of a row with ``principal_type`` and ``principal_id`` columns."""
        return cls(row.principal_type, row.principal_id)

    @classmethod
    def from_key(cls, key: str) -> Principal | None:
        """The principal of a stored ``principal_key`` (None if it is not a [type, id] pair)."""
        value = json.loads(key)
        if isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) for part in value):
            return cls(value[0], value[1])
        return None

    @classmethod
    def found_in(cls, authority: Any) -> Principal | None:
        """What a stored envelope names, as it is (None when it has no principal object):
        for the readers that must not fail on a row, whatever it holds."""
        principal = authority.get("principal") if isinstance(authority, dict) else None
        if not isinstance(principal, dict):
            return None
        # As stored: a row written outside the kernel may hold anything.
        return cls(principal.get("type"), principal.get("id"))  # type: ignore[arg-type]

    @classmethod
    def label_of(cls, authority: Any) -> str:
        """The label of an envelope's principal, for logs and metrics ("" if it has none)."""
        principal = cls.found_in(authority)
        return "" if principal is None else principal.label

    @property
    def key(self) -> str:
        """The occurrences' ``principal_key`` (their fairness partition)."""
        return canonical_json([self.type, self.id])

    @property
    def label(self) -> str:
        return f"{self.type}:{self.id}"

    def as_dict(self) -> EnvelopePrincipal:
        return {"type": self.type, "id": self.id}

    def details(self) -> dict[str, Any]:
        """The ``principal`` entry of an error's details."""
        return {"principal": self.as_dict()}

    def columns(self) -> dict[str, str]:
        """The policy tables' columns, for a query's filter or a new row."""
        return {"principal_type": self.type, "principal_id": self.id}


def normalize_principal(value: Any, field: str = "authority.principal") -> EnvelopePrincipal:
    """An envelope's principal, validated (:meth:`Principal.parse_dict`), as it is stored."""
    return Principal.parse_dict(value, field).as_dict()


# The length of ``Occurrence.principal_key``: quotes and backslashes in a type or id are
# escaped in the key, so a principal within both identifier limits can exceed it.
PRINCIPAL_KEY_LENGTH = 400


def normalize_authority(value: Any, field: str = "authority") -> Envelope:
    """Validate and normalize an authority envelope (a dict, or an :class:`Envelope`):
    ``InvalidArgument`` naming the first bad field."""
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
    lists = {
        name: normalize_identifier_list(
            [] if refs_in.get(name) is None else refs_in[name], f"{field}.authorizationRefs.{name}"
        )
        for name in _REF_LISTS
    }
    refs: AuthorizationRefs = {
        "decisionId": _optional_identifier(
            refs_in.get("decisionId"), f"{field}.authorizationRefs.decisionId"
        ),
        "policyRevision": _optional_identifier(
            refs_in.get("policyRevision"), f"{field}.authorizationRefs.policyRevision"
        ),
        "approvalIds": lists["approvalIds"],
        "delegationIds": lists["delegationIds"],
        "grantIds": lists["grantIds"],
    }
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
    envelope: Envelope = {
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


def compact_envelope(value: Any) -> Any:
    """A normalized envelope without its members that hold their default (schema version 1,
    no tenant or workspace, empty lists, null references): the form an occurrence's snapshot
    is stored in, since every occurrence copies its job's envelope. :func:`expand_envelope`
    gives the full one back; anything that is not an object is stored as it is."""
    if type(value) is not dict:
        return value
    # Written out rather than through a helper: this runs once per occurrence written.
    # ``is True``: True == 1, but an envelope of schemaVersion true is not one of version 1.
    out = {
        key: item
        for key, item in value.items()
        if key not in _ENVELOPE_DEFAULTS or item != _ENVELOPE_DEFAULTS[key] or item is True
    }
    refs = out.pop("authorizationRefs", None)
    if type(refs) is dict:
        refs = {
            key: item for key, item in refs.items() if key not in _REF_DEFAULTS or item != _REF_DEFAULTS[key]
        }
    if refs:
        out["authorizationRefs"] = refs
    return out


def expand_envelope(value: Any) -> Any:
    """The normalized envelope of a stored snapshot (:func:`compact_envelope`). A stored
    object with a ``schemaVersion`` was stored whole and is read as it is."""
    if not isinstance(value, dict) or "schemaVersion" in value:
        return value
    refs = value.get("authorizationRefs")
    return {
        "schemaVersion": SCHEMA_VERSION,
        "tenantId": None,
        "workspaceId": None,
        "requestedCapabilities": [],
        **value,
        "authorizationRefs": {
            "decisionId": None,
            "policyRevision": None,
            "approvalIds": [],
            "delegationIds": [],
            "grantIds": [],
            **(refs or {}),
        }
        if refs is None or isinstance(refs, dict)
        else refs,
    }


# What compact_envelope leaves out: the normalized envelope's defaults, by member.
_ENVELOPE_DEFAULTS: dict[str, Any] = {
    "schemaVersion": SCHEMA_VERSION,
    "tenantId": None,
    "workspaceId": None,
    "requestedCapabilities": [],
}
_REF_DEFAULTS: dict[str, Any] = {
    "decisionId": None,
    "policyRevision": None,
    **{name: [] for name in _REF_LISTS},
}


def default_authority(kind: str, principal: Any) -> Envelope:
    """The envelope of a job created without one: the app's default principal
    (``DURABLE_SCHEDULER_DEFAULT_PRINCIPAL``), requesting the job's kind as its capability."""
    return normalize_authority(
        {
            "principal": normalize_principal(principal, "DURABLE_SCHEDULER_DEFAULT_PRINCIPAL"),
            "requestedCapabilities": [kind],
        }
    )


def missing_capabilities(capabilities: list[str], authority: Envelope) -> list[str]:
    """The capabilities ``authority`` requests that ``capabilities`` (a policy's) do not grant."""
    granted = set(capabilities)
    return [c for c in authority.get("requestedCapabilities") or [] if c not in granted]


def policy_ref(revision: int) -> str:
    return f"{POLICY_REF_PREFIX}{revision}"


def bound_revision(authority: Envelope) -> int | None:
    """The policy revision an envelope is bound to, or None when unbound."""
    # Read as a stored row may hold it: a row written outside the kernel reads as unbound.
    refs = authority.get("authorizationRefs") or {}
    ref = refs.get("schedulerPolicyRevision")
    match = _POLICY_REF.match(ref) if isinstance(ref, str) else None
    return int(match.group(1)) if match else None


def bind(authority: Envelope, revision: int) -> Envelope:
    """``authority`` bound to policy revision ``revision`` (a new envelope)."""
    refs: AuthorizationRefs = {
        **authority["authorizationRefs"],
        "schedulerPolicyRevision": policy_ref(revision),
    }
    return {**authority, "authorizationRefs": refs}
