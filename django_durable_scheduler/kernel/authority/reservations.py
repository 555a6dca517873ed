"""Authority reservations: charging a run against its principal's budget
(``docs/design.md``, "Authority checks" and "Budgets and reservations").

``reserve_authority`` is the reservation primitive on its own. ``authorize`` runs between the
claim of an occurrence and its handler's start: the policy checks in their order, then
a reservation (or the reuse of the one a previous attempt made); the worker's claim runs
it in the claim's own transaction (``claiming.claim_authorized`` calls
:func:`authorize_claimed`). Denials
dead-letter the occurrence without retry (``settling.deny``); an exhausted budget puts it
back to wait for the next window without using an attempt (``settling.defer``). The charge
itself is ``budgets.charge``.

Concurrency: every reservation of a principal locks that principal's policy row before the
occurrence row, the order ``set_policy`` uses too (see ``policies.py``), and then the window's
usage row (``SELECT ... FOR UPDATE``, in ``budgets.charge``), so reservations of one principal
are serialized and two workers racing for the last unit of a budget cannot both get it. A
claim's policy lock is shared on PostgreSQL (:func:`lock_policies_of`), so claims of one
principal queue only for the usage row, from their charge to their commit; the other paths
lock the policy exclusively. SQLite has one writer at a time (``dialect.write_transaction``
takes the database write lock first).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import connections

from ... import conf
from ...db import dialect
from ...db.dialect import alias_for, column_max, write_transaction
from ...exceptions import (
    AuthorityBudgetExhausted,
    AuthorityBudgetStateInvalid,
    AuthorityOccurrenceNotRunning,
    AuthorityPermissionDenied,
    AuthorityPolicyRequired,
    AuthorityPolicyStale,
    AuthorityPolicyUnbound,
    AuthorityReservationMismatch,
    InvalidArgument,
    LeaseLost,
    NotFound,
    SchedulerError,
)
from ...models import AuthorityPolicy, AuthorityReservation, Occurrence, OccurrenceStatus
from ...rules.authority import (
    MAX_BUDGET,
    Envelope,
    Principal,
    bound_revision,
    missing_capabilities,
    policy_ref,
)
from ...rules.validation import normalize_identifier, normalize_int, preview, to_ms
from .. import settling
from . import budgets
from .policies import lock_policy


class Verdict(StrEnum):
    """What the authority check made of a claimed occurrence: its handler may run when the
    budget was charged (``reserved``), a retry keeps its reservation (``reused``) or its policy
    has no budget (``authorized``); else it
    was ``denied`` (dead-lettered), ``deferred`` (waits for the next window), or its lease
    was lost meanwhile (``lease_lost``, nothing written)."""

    RESERVED = "reserved"
    REUSED = "reused"
    # Passed the checks under a policy with no budget: nothing charged, no reservation written.
    AUTHORIZED = "authorized"
    DENIED = "denied"
    DEFERRED = "deferred"
    LEASE_LOST = "lease_lost"


RESERVED = Verdict.RESERVED
REUSED = Verdict.REUSED
AUTHORIZED = Verdict.AUTHORIZED
DENIED = Verdict.DENIED
DEFERRED = Verdict.DEFERRED
LEASE_LOST = Verdict.LEASE_LOST

# Denial reasons (stored on the occurrence and in the ``authority_denied`` event).
REASONS: dict[type[SchedulerError], str] = {
    AuthorityPolicyRequired: "policy_required",
    AuthorityPolicyUnbound: "policy_unbound",
    AuthorityPolicyStale: "policy_stale",
    AuthorityPermissionDenied: "permission_denied",
    AuthorityBudgetStateInvalid: "budget_state_invalid",
    AuthorityReservationMismatch: "reservation_mismatch",
}
_DENIALS = tuple(REASONS)
# The verdicts under which the handler may run.
RUNNABLE = (RESERVED, REUSED, AUTHORIZED)

Units = int | Callable[[Occurrence], int]
# The policies a transaction has locked, by principal.
LockedPolicies = dict[Principal, AuthorityPolicy]
MAX_POLICY_REVISION = column_max(AuthorityReservation, "policy_revision")


@dataclass(frozen=True)
class Authorization:
    """One occurrence's verdict; for ``"denied"``, the error stored on the occurrence
    (``reason``, ``code``, ``details``, ``message``); for ``"deferred"``, why it waits
    (``reason``, ``message``, ``details`` with ``windowEndsAt``), for the log."""

    verdict: Verdict
    error: dict[str, Any] | None = None


# --------------------------------------------------------------------------- pieces


def _units(value: Any, field: str = "units") -> int:
    return normalize_int(value, field, minimum=1, maximum=MAX_BUDGET)


def _read_occurrence(occurrence_id: str, alias: str) -> Occurrence:
    # Unlocked: only the principal is needed before the policy row is locked, and an
    # occurrence's principal never changes. The row is locked (and re-read) afterwards.
    row = Occurrence.objects.using(alias).filter(pk=occurrence_id).only("pk", "authority").first()
    if row is None:
        raise NotFound(f"occurrence {occurrence_id!r} does not exist", {"occurrence_id": occurrence_id})
    return row


def _require(policy: AuthorityPolicy | None, principal: Principal) -> AuthorityPolicy:
    if policy is None or not policy.enabled:
        state = "missing" if policy is None else "disabled"
        raise AuthorityPolicyRequired(
            f"authority policy of {principal.label} is {state}",
            {**principal.details(), "policy": state},
        )
    return policy


def _not_granted(denied: list[str]) -> str:
    return f"; it does not grant {', '.join(denied)}" if denied else ""


def _check_revision(policy: AuthorityPolicy, expected: int, authority: Envelope) -> None:
    # A stale binding is the reason; what the current revision lacks is named too, so the
    # operator sees what to grant (or what a change took away).
    if policy.revision != expected:
        principal = Principal.of(authority)
        denied = missing_capabilities(policy.capabilities, authority)
        raise AuthorityPolicyStale(
            f"authority policy of {principal.label} is at revision {policy.revision}, not {expected}"
            + _not_granted(denied),
            {
                **principal.details(),
                "expected_revision": expected,
                "actual_revision": policy.revision,
                **({"denied": denied} if denied else {}),
            },
        )


def _check_capabilities(policy: AuthorityPolicy, authority: Envelope) -> None:
    denied = missing_capabilities(policy.capabilities, authority)
    if denied:
        principal = Principal.of(authority)
        raise AuthorityPermissionDenied(
            f"authority policy of {principal.label} (revision {policy.revision}) does not grant "
            + ", ".join(denied),
            {**principal.details(), "policy_revision": policy.revision, "denied": denied},
        )


def _existing(occurrence_id: str, alias: str) -> AuthorityReservation | None:
    return AuthorityReservation.objects.using(alias).select_for_update().filter(pk=occurrence_id).first()


def _same_owner(reservation: AuthorityReservation, occurrence: Occurrence, principal: Principal) -> bool:
    """Whether the reservation was made for this occurrence's job and ``principal`` (its own)."""
    return reservation.job_id == occurrence.job_id and Principal.of_row(reservation) == principal


def _mismatch(reservation: AuthorityReservation, occurrence_id: str) -> AuthorityReservationMismatch:
    return AuthorityReservationMismatch(
        f"the existing authority reservation of {occurrence_id!r} does not match",
        {
            "occurrence_id": occurrence_id,
            "reservation": {
                "job_id": reservation.job_id,
                "principal": Principal.of_row(reservation).as_dict(),
                "policy_revision": reservation.policy_revision,
                "units": reservation.units,
            },
        },
    )


# --------------------------------------------------------------------------- public


def get_reservation(occurrence_id: str, *, using: str | None = None) -> AuthorityReservation | None:
    """The occurrence's reservation, or None."""
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    return AuthorityReservation.objects.using(alias_for(using)).filter(pk=occurrence_id).first()


def reserve_authority(
    occurrence_id: str, *, policy_revision: int, units: int = 1, using: str | None = None
) -> AuthorityReservation:
    """Reserve one run and ``units`` units of the running occurrence's principal budget,
    under policy revision ``policy_revision``.

    An existing reservation of the occurrence with the same job, principal, revision and
    units is returned (``.deduplicated`` is True; no second charge); any other is
    ``SCHEDULER_AUTHORITY_RESERVATION_MISMATCH``. Then, in order: policy missing or disabled
    (``..._POLICY_REQUIRED``), another revision (``..._POLICY_STALE``), a requested capability
    not granted (``..._PERMISSION_DENIED``, ``details["denied"]``), usage not matching the
    window's reservations (``..._BUDGET_STATE_INVALID``), over a budget
    (``..._BUDGET_EXHAUSTED``, with the window and the counts).
    """
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    revision = normalize_int(policy_revision, "policy_revision", minimum=1, maximum=MAX_POLICY_REVISION)
    requested = _units(units)
    alias = alias_for(using)
    now = conf.now()
    with write_transaction(alias):
        principal = Principal.of(_read_occurrence(occurrence_id, alias).authority)
        policy = lock_policy(principal, alias)
        occurrence = Occurrence.objects.using(alias).select_for_update().filter(pk=occurrence_id).first()
        if occurrence is None:
            raise NotFound(f"occurrence {occurrence_id!r} does not exist", {"occurrence_id": occurrence_id})
        if occurrence.status != OccurrenceStatus.RUNNING:
            raise AuthorityOccurrenceNotRunning(
                f"occurrence {occurrence_id!r} is {occurrence.status}; only a running one can reserve",
                {"occurrence_id": occurrence_id, "status": occurrence.status},
            )
        existing = _existing(occurrence_id, alias)
        if existing is not None:
            if (
                not _same_owner(existing, occurrence, principal)
                or existing.policy_revision != revision
                or existing.units != requested
            ):
                raise _mismatch(existing, occurrence_id)
            existing.deduplicated = True  # type: ignore[attr-defined]
            return existing
        policy = _require(policy, principal)
        _check_revision(policy, revision, occurrence.authority)
        _check_capabilities(policy, occurrence.authority)
        (group,) = budgets.charge([(policy, [(occurrence, requested)])], now, alias)
        if isinstance(group, AuthorityBudgetStateInvalid):
            raise group
        (charged,) = group
        if isinstance(charged, AuthorityBudgetExhausted):
            raise charged
        reservation = charged
    reservation.deduplicated = False  # type: ignore[attr-defined]
    return reservation


def resolve_units(units: Units, occurrence: Occurrence) -> int:
    """The units a run of ``occurrence`` costs: ``units`` itself, or what the handler
    registration's function of the occurrence returns (``InvalidArgument`` if it fails or
    gives something that is not a positive int)."""
    if callable(units):
        try:
            value = units(occurrence)
        except Exception as exc:
            raise InvalidArgument(
                "units", f"the units function failed: {type(exc).__name__}: {preview(str(exc))}"
            ) from exc
        return _units(value)
    return _units(units)


def _check_held(held: Occurrence, policy: AuthorityPolicy | None, principal: Principal) -> AuthorityPolicy:
    """The first two authority checks on a held occurrence (of ``principal``), raising the denial.

    The policy must exist and be enabled, and the envelope must be bound to its current revision.
    """
    authority = held.authority
    policy = _require(policy, principal)
    bound = bound_revision(authority)
    if bound is None:
        denied = missing_capabilities(policy.capabilities, authority)
        raise AuthorityPolicyUnbound(
            f"occurrence {held.pk!r} is not bound to a scheduler policy revision" + _not_granted(denied),
            {
                **principal.details(),
                "expected": policy_ref(policy.revision),
                **({"denied": denied} if denied else {}),
            },
        )
    _check_revision(policy, bound, authority)
    _check_capabilities(policy, authority)
    return policy


@functools.lru_cache(maxsize=64)
def _policies_statement(alias: str, count: int, clause: str) -> str:
    """The locking read of ``count`` principals' policy rows, sorted: columns from ``_meta``."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    meta = AuthorityPolicy._meta
    column = {field.name: quote(str(field.column)) for field in dialect.concrete_fields(AuthorityPolicy)}
    ptype, pid = column["principal_type"], column["principal_id"]
    match = " OR ".join([f"({ptype} = %s AND {pid} = %s)"] * count)
    return (
        f"SELECT {', '.join(column.values())} FROM {quote(meta.db_table)} WHERE {match}"
        f" ORDER BY {ptype}, {pid} {clause}"
    )


def _lock_policies(keys: set[Principal], alias: str, *, shared: bool = False) -> LockedPolicies:
    """Lock the policy rows of these principals, sorted, so that concurrent authorizers
    cannot deadlock. ``shared`` (a claim's): where the database has a shared row lock, take
    that, so that claims of one principal do not wait on each other here (it still keeps
    ``set_policy`` out); their charges then wait on the usage row instead, which
    ``budgets.charge`` locks at the end of the transaction."""
    if not keys:
        return {}
    clause = dialect.shared_lock_clause(alias) if shared else None
    if clause is None:
        # SQLite has no row locks: its transaction holds the database's write lock already.
        clause = "FOR UPDATE" if connections[alias].features.has_select_for_update else ""
    sql = _policies_statement(alias, len(keys), clause)
    params = [part for key in sorted(keys) for part in key]
    return {Principal.of_row(p): p for p in dialect.read_models(alias, AuthorityPolicy, sql, params)}


# A verdict in progress: (index of the item, the locked occurrence, why it is refused).
_Refusal = tuple[int, Occurrence, SchedulerError]


def _authorize_locked(
    items: list[tuple[Occurrence, int]],
    owner: str,
    now: datetime,
    alias: str,
    *,
    already: tuple[LockedPolicies, dict[str, Occurrence]] | None = None,
) -> list[Authorization | LeaseLost]:
    """Inside the transaction: lock the principals' policy rows (sorted, so concurrent
    authorizers cannot deadlock, and before the occurrence rows, the order ``set_policy``
    uses), then the occurrences, check each, charge what passes per principal, and write
    the refusals through the lease code. ``already``: the policies and occurrences this
    transaction has locked already (a claim's), which are then not read twice."""
    ids = [occurrence.pk for occurrence, _ in items]
    if already is not None:
        policies, locked = already
    else:
        policies = _lock_policies({Principal.of(occurrence.authority) for occurrence, _ in items}, alias)
        locked = {
            row.pk: row
            for row in Occurrence.objects.using(alias)
            .select_for_update()
            .filter(pk__in=ids)
            .order_by("pk")
            .only("pk", "job_id", "status", "lease_owner", "lease_expires_at", "fence", "authority")
        }
    if already is not None:
        # A reservation is made only for a running occurrence, so only an occurrence claimed
        # before can have one: one this claim took at fence 1 (its first claim ever) has none.
        ids = [pk for pk in ids if (held := locked.get(pk)) is not None and held.fence > 1]
    existing = (
        {
            r.pk: r
            for r in AuthorityReservation.objects.using(alias)
            .select_for_update()
            .filter(pk__in=ids)
            .order_by("pk")
        }
        if ids
        else {}
    )
    verdicts: list[Authorization | LeaseLost] = [Authorization(RESERVED)] * len(items)
    refused: list[_Refusal] = []
    charges: dict[Principal, list[tuple[int, Occurrence, int]]] = {}
    for index, (occurrence, units) in enumerate(items):
        held = locked.get(occurrence.pk)
        if held is None or not settling.holds_lease(held, owner, occurrence.fence, now):
            verdicts[index] = settling.lease_lost(occurrence.pk, held, owner, occurrence.fence, now)
            continue
        principal = Principal.of(held.authority)
        try:
            policy = _check_held(held, policies.get(principal), principal)
            # A retry reuses the reservation its earlier attempt made (charged under the
            # revision and window of that attempt): no second charge.
            reservation = existing.get(held.pk)
            if reservation is not None:
                if not _same_owner(reservation, held, principal):
                    raise _mismatch(reservation, held.pk)
                verdicts[index] = Authorization(REUSED)
                continue
        except _DENIALS as exc:
            refused.append((index, held, exc))
            continue
        if not policy.has_budget:
            verdicts[index] = Authorization(AUTHORIZED)
            continue
        charges.setdefault(principal, []).append((index, held, units))
    refused += _charge(charges, policies, now, alias)
    _write_refusals(items, refused, verdicts, owner, alias)
    return verdicts


def _charge(
    charges: dict[Principal, list[tuple[int, Occurrence, int]]],
    policies: LockedPolicies,
    now: datetime,
    alias: str,
) -> list[_Refusal]:
    """Charge each principal's passing items to its budget; the ones it refuses."""
    refused: list[_Refusal] = []
    groups = list(charges.items())
    charged = budgets.charge(
        [(policies[key], [(held, units) for _, held, units in group]) for key, group in groups], now, alias
    )
    for (_, group), outcome in zip(groups, charged, strict=True):
        if isinstance(outcome, AuthorityBudgetStateInvalid):
            refused += [(index, held, outcome) for index, held, _ in group]
            continue
        for (index, held, _), result in zip(group, outcome, strict=True):
            if isinstance(result, AuthorityBudgetExhausted):
                refused.append((index, held, result))
    return refused


def _write_refusals(
    items: list[tuple[Occurrence, int]],
    refused: list[_Refusal],
    verdicts: list[Authorization | LeaseLost],
    owner: str,
    alias: str,
) -> None:
    """Write each refusal through the lease code (an exhausted budget defers, the rest deny)
    and record its verdict: lease lost, when the lease ran out while this transaction ran
    (a lease shorter than the transaction), as for the items the lease check turned away."""
    for index, held, why in sorted(refused, key=lambda item: item[0]):
        try:
            verdicts[index] = _write_refusal(held, items[index][0].fence, why, owner, alias)
        except LeaseLost as lost:
            verdicts[index] = lost


def _write_refusal(
    held: Occurrence, fence: int, why: SchedulerError, owner: str, alias: str
) -> Authorization:
    """Defer (an exhausted budget) or deny (the rest) one refused item; raises LeaseLost."""
    if isinstance(why, AuthorityBudgetExhausted):
        until = to_ms(datetime.fromisoformat(why.details["windowEndsAt"]), "until")
        settling.defer(held.pk, owner=owner, fence=fence, until=until, details=why.details, using=alias)
        deferral = {"reason": "budget_exhausted", "message": why.message, "details": why.details}
        return Authorization(DEFERRED, deferral)
    denied = settling.deny(
        held.pk,
        owner=owner,
        fence=fence,
        code=why.code,
        reason=REASONS[type(why)],
        details=why.details,
        message=why.message,
        using=alias,
    )
    return Authorization(DENIED, denied.last_error)


def _claimed(occurrence: Any, field: str) -> tuple[Occurrence, int]:
    if not isinstance(occurrence, Occurrence):
        raise InvalidArgument(field, "must be a claimed Occurrence")
    return occurrence, normalize_int(
        occurrence.fence, f"{field}.fence", minimum=1, maximum=settling.MAX_FENCE
    )


def authorize(occurrence: Occurrence, *, units: Units = 1, owner: str, using: str | None = None) -> Verdict:
    """Authorize a claimed occurrence before its handler runs (``docs/design.md``, "Authority checks").

    Returns a :class:`Verdict`: ``"reserved"`` (budget charged), ``"reused"`` (a retry keeps its reservation),
    ``"authorized"`` (the policy has no budget: nothing charged, no reservation),
    ``"denied"`` (dead-lettered without retry: ``policy_required``, ``policy_unbound``,
    ``policy_stale``, ``permission_denied``, ``budget_state_invalid``) or ``"deferred"``
    (budget exhausted: queued again until the window ends, no attempt used). Only in the
    first three cases may the handler run. ``units`` is an int or a function of the
    occurrence (the handler registration's ``units``). ``SCHEDULER_LEASE_LOST`` unless
    ``owner`` holds the occurrence's lease at its claimed fence.
    """
    _claimed(occurrence, "occurrence")
    owner = normalize_identifier(owner, "owner")
    requested = resolve_units(units, occurrence)
    alias = alias_for(using)
    now = conf.now()
    with write_transaction(alias):
        (verdict,) = _authorize_locked([(occurrence, requested)], owner, now, alias)
    if isinstance(verdict, LeaseLost):
        raise verdict
    return verdict.verdict


def authorize_many(
    items: list[tuple[Occurrence, int]], *, owner: str, using: str | None = None
) -> list[Verdict]:
    """:func:`authorize` for a claimed batch in one transaction: ``items`` are
    ``(occurrence, units)`` pairs; returns a verdict per item, in order, where an
    occurrence whose lease is no longer held gets ``"lease_lost"`` (and nothing written)."""
    return [result.verdict for result in authorize_batch(items, owner=owner, using=using)]


def authorize_batch(
    items: list[tuple[Occurrence, int]], *, owner: str, using: str | None = None
) -> list[Authorization]:
    """:func:`authorize_many`, each verdict with the error a denial stored (what the
    worker's log line says)."""
    owner = normalize_identifier(owner, "owner")
    if not isinstance(items, list | tuple):
        raise InvalidArgument("items", "must be a list of (occurrence, units) pairs")
    checked: list[tuple[Occurrence, int]] = []
    for index, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgument(f"items[{index}]", "must be an (occurrence, units) pair")
        occurrence, _ = _claimed(item[0], f"items[{index}][0]")
        checked.append((occurrence, _units(item[1], f"items[{index}][1]")))
    if len({occurrence.pk for occurrence, _ in checked}) != len(checked):
        raise InvalidArgument("items", "an occurrence appears twice")
    if not checked:
        return []
    alias = alias_for(using)
    now = conf.now()
    with write_transaction(alias):
        verdicts = _authorize_locked(checked, owner, now, alias)
    return [Authorization(LEASE_LOST) if isinstance(v, LeaseLost) else v for v in verdicts]


@dataclass(frozen=True)
class AuthorizedClaim:
    """What a claimed batch came to (``claiming.claim_authorized``): ``claimed`` (all of it,
    in claim order), ``runnable`` (reserved or reused: the handlers may start), ``refused``
    (denied or deferred, already written, with their verdict) and ``unpriced`` (held, but
    the units function failed: the caller settles them as failed). ``throttled_until``: the
    earliest start the claim gave work over a throttle's rate, or found for it (None: none),
    so that the worker wakes then."""

    claimed: list[Occurrence]
    runnable: list[Occurrence]
    refused: list[tuple[Occurrence, Authorization]]
    unpriced: list[tuple[Occurrence, InvalidArgument]]
    throttled_until: datetime | None = None


def lock_policies_of(principal_keys: list[str], alias: str) -> LockedPolicies:
    """Lock the policy rows of the principals with these ``principal_key`` values, sorted:
    what a claim does before it locks any occurrence, so that it takes the locks in the order
    ``set_policy`` and :func:`authorize` do. Shared where the database can (PostgreSQL):
    claims of one principal then serialize only on their charge (``budgets.charge``)."""
    principals = {principal for key in principal_keys if (principal := Principal.from_key(key)) is not None}
    return _lock_policies(principals, alias, shared=True)


def authorize_claimed(
    claimed: list[Occurrence],
    units_of: Callable[[Occurrence], Units] | None,
    owner: str,
    policies: LockedPolicies,
    alias: str,
) -> AuthorizedClaim:
    """Authorize a batch just claimed by ``owner``, inside the claim's transaction on
    ``alias``, which has locked ``policies`` (:func:`lock_policies_of`) and the occurrences:
    price each with ``units_of`` (default 1), then check, charge, deny or defer it as
    :func:`authorize_batch` does."""
    items: list[tuple[Occurrence, int]] = []
    unpriced: list[tuple[Occurrence, InvalidArgument]] = []
    for occurrence in claimed:
        try:
            units = resolve_units(1 if units_of is None else units_of(occurrence), occurrence)
        except InvalidArgument as exc:
            unpriced.append((occurrence, exc))
            continue
        items.append((occurrence, units))
    # The claim locked these policies and occurrences and made this owner their holder.
    already = (policies, {occurrence.pk: occurrence for occurrence in claimed})
    verdicts = _authorize_locked(items, owner, conf.now(), alias, already=already) if items else []
    runnable: list[Occurrence] = []
    refused: list[tuple[Occurrence, Authorization]] = []
    for (occurrence, units), verdict in zip(items, verdicts, strict=True):
        if isinstance(verdict, LeaseLost):  # a lease shorter than the transaction
            refused.append((occurrence, Authorization(LEASE_LOST)))
        elif verdict.verdict in RUNNABLE:
            occurrence.charged_units = units if verdict.verdict == RESERVED else 0
            runnable.append(occurrence)
        else:
            refused.append((occurrence, verdict))
    return AuthorizedClaim(claimed, runnable, refused, unpriced)
