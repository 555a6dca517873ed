"""Budgets: a principal's per-window usage (:func:`current_usage`), charging runs against
it, and settling the reservations those charges made (``docs/design.md``, "Budgets and
reservations").

This sits below the lease code: the kernel settles reservations when an occurrence ends,
and authorization (``reservations.py``) charges them, each inside its own transaction.
Usage per (principal, policy revision, window) must always equal the count and unit sum of
that window's reservations; :func:`charge` checks it before writing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Field

from ... import conf
from ...db import dialect, guarded
from ...exceptions import (
    AuthorityBudgetExhausted,
    AuthorityBudgetStateInvalid,
    AuthoritySettlementConflict,
    InvalidArgument,
)
from ...models import (
    AuthorityPolicy,
    AuthorityReservation,
    AuthorityUsage,
    Occurrence,
    OccurrenceStatus,
    ReservationStatus,
)
from ...rules.authority import Principal
from ...rules.validation import from_ms, iso_ms, to_ms


@dataclass(frozen=True)
class WindowUsage:
    """A policy's usage in the window that contains ``now``."""

    principal_type: str
    principal_id: str
    policy_revision: int
    window_started_at: datetime
    window_ends_at: datetime
    runs: int
    units: int
    max_runs: int | None  # None: no limit
    max_units: int | None

    @property
    def remaining_runs(self) -> int | None:
        return None if self.max_runs is None else max(0, self.max_runs - self.runs)

    @property
    def remaining_units(self) -> int | None:
        return None if self.max_units is None else max(0, self.max_units - self.units)

    @property
    def held(self) -> bool:
        """Whether the window's runs or units are spent: its claims wait for the next one."""
        return self.remaining_runs == 0 or self.remaining_units == 0


def window_bounds(window_ms: int, now: datetime) -> tuple[datetime, datetime]:
    """The epoch-aligned window containing ``now``: ``floor(now / window) * window``."""
    start_ms = to_ms(now, "now") // window_ms * window_ms
    return from_ms(start_ms), from_ms(start_ms + window_ms)


def current_usage(
    policy: AuthorityPolicy, now: datetime | None = None, *, using: str | None = None
) -> WindowUsage:
    """Runs and units reserved under the policy's current revision in the window holding ``now``."""
    if not isinstance(policy, AuthorityPolicy):
        raise InvalidArgument("policy", "must be an AuthorityPolicy")
    at = conf.now() if now is None else from_ms(to_ms(now, "now"))
    start, end = window_bounds(policy.window_ms, at)
    principal = Principal.of_row(policy)
    row = (
        AuthorityUsage.objects.using(dialect.alias_for(using))
        .filter(**principal.columns(), policy_revision=policy.revision, window_started_at=start)
        .values_list("runs", "units")
        .first()
    )
    runs, units = row if row is not None else (0, 0)
    return WindowUsage(
        *principal,
        policy_revision=policy.revision,
        window_started_at=start,
        window_ends_at=end,
        runs=runs,
        units=units,
        max_runs=policy.max_runs,
        max_units=policy.max_units,
    )


def _exhausted(
    principal: Principal,
    policy: AuthorityPolicy,
    window: tuple[datetime, datetime],
    used: tuple[int, int],
    units: int,
) -> AuthorityBudgetExhausted:
    start, end = window
    return AuthorityBudgetExhausted(
        f"authority budget of {principal.label} is spent until {iso_ms(end)}",
        {
            "windowStartedAt": iso_ms(start),
            "windowEndsAt": iso_ms(end),
            "usedRuns": used[0],
            "usedUnits": used[1],
            "requestedUnits": units,
            "maxRuns": policy.max_runs,
            "maxUnits": policy.max_units,
        },
    )


def _window_key(policy: AuthorityPolicy, now: datetime) -> tuple[str, str, int, datetime]:
    start, _ = window_bounds(policy.window_ms, now)
    return policy.principal_type, policy.principal_id, policy.revision, start


_KEY_FIELDS = ("principal_type", "principal_id", "policy_revision", "window_started_at")
Key = tuple[str, str, int, datetime]


def _match(keys: list[Key], alias: str) -> tuple[str, list[Any]]:
    """A WHERE clause matching the (principal, revision, window) ``keys``, and its parameters."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    one = " AND ".join(f"{quote(field)} = %s" for field in _KEY_FIELDS)
    params: list[Any] = []
    for principal_type, principal_id, revision, start in keys:
        params += [principal_type, principal_id, revision, connection.ops.adapt_datetimefield_value(start)]
    return " OR ".join([f"({one})"] * len(keys)), params


def _lock_usage(keys: list[Key], alias: str, *, lock: bool = True) -> dict[tuple[str, str], AuthorityUsage]:
    """For each (principal, revision, window) of ``keys``: its usage row, locked (in principal
    order) unless ``lock`` is false, keyed by principal (one window each). One statement
    however many principals there are; it reads the usage rows only, never the reservations,
    so its cost does not grow with the runs a window has had."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    match, params = _match(keys, alias)
    principal = f"{quote('principal_type')}, {quote('principal_id')}"
    lock_clause = " FOR UPDATE" if lock and connection.features.has_select_for_update else ""
    usages: dict[tuple[str, str], AuthorityUsage] = {}
    sql = (
        f"SELECT {quote(str(AuthorityUsage._meta.pk.column))}, {principal}, {quote('runs')},"
        f" {quote('units')}, {quote('mismatch')} FROM {quote(AuthorityUsage._meta.db_table)}"
        f" WHERE {match} ORDER BY {principal}{lock_clause}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    for pk, principal_type, principal_id, runs, units, seen in found:
        seen = json.loads(seen) if isinstance(seen, str | bytes) else seen  # a driver's JSON as text
        usages[principal_type, principal_id] = AuthorityUsage(pk=pk, runs=runs, units=units, mismatch=seen)
    return usages


def _reserved_in(keys: list[Key], alias: str) -> set[tuple[str, str]]:
    """The principals among ``keys`` (windows whose usage is zero) whose window has a
    reservation all the same: each an ``EXISTS`` that stops at the first index entry, in one
    statement. A window's first charge makes its usage non-zero, so this runs about once
    per principal and window, not per claim."""
    if not keys:
        return set()
    connection = connections[alias]
    quote = connection.ops.quote_name
    table = quote(AuthorityReservation._meta.db_table)
    probes: list[str] = []
    params: list[Any] = []
    for key in keys:
        match, key_params = _match([key], alias)
        probes.append(f"EXISTS (SELECT 1 FROM {table} WHERE {match})")
        params += key_params
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(probes)}", params)
        found = cursor.fetchone()
    return {key[:2] for key, exists in zip(keys, found, strict=True) if exists}


def _recount(key: Key, alias: str) -> tuple[AuthorityUsage | None, tuple[int, int]]:
    """A window's usage row (unlocked) and the count and unit sum of its reservations, read
    by one statement, so from one snapshot even while charges go on: a charge adds to both
    in one transaction, so what they differ by there is what they differ by now. The one
    read that counts reservations; never on the claim path."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    match, params = _match([key], alias)
    on = " AND ".join(f"u.{quote(field)} = %s" for field in _KEY_FIELDS)
    sql = (
        f"SELECT u.{quote(str(AuthorityUsage._meta.pk.column))}, u.{quote('runs')}, u.{quote('units')},"
        f" r.n, r.s FROM (SELECT COUNT(*) AS n, COALESCE(SUM({quote('units')}), 0) AS s"
        f" FROM {quote(AuthorityReservation._meta.db_table)} WHERE {match}) r"
        f" LEFT JOIN {quote(AuthorityUsage._meta.db_table)} u ON {on}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params + params)
        pk, runs, units, count, total = cursor.fetchone()
    usage = None if pk is None else AuthorityUsage(pk=pk, runs=runs, units=units)
    return usage, (int(count), int(total))


def _mismatch_record(used: tuple[int, int], reserved: tuple[int, int], now: datetime) -> dict[str, Any]:
    return {
        "usage": {"runs": used[0], "units": used[1]},
        "reservations": {"runs": reserved[0], "units": reserved[1]},
        "checkedAt": iso_ms(now),
    }


Charged = list[AuthorityReservation | AuthorityBudgetExhausted] | AuthorityBudgetStateInvalid


def _state_invalid(
    policy: AuthorityPolicy, start: datetime, seen: dict[str, Any]
) -> AuthorityBudgetStateInvalid:
    """The refusal of a window whose usage was found not to match its reservations (``seen``:
    the counts the check saw, and when)."""
    principal = Principal.of_row(policy)
    return AuthorityBudgetStateInvalid(
        f"authority usage of {principal.label} does not match its reservations",
        {
            **principal.details(),
            "policy_revision": policy.revision,
            "windowStartedAt": iso_ms(start),
            **seen,
        },
    )


def over(limit: int | None, used: int) -> bool:
    """Whether ``used`` goes past ``limit`` (None: no limit)."""
    return limit is not None and used > limit


def _reserve(
    policy: AuthorityPolicy,
    charges: list[tuple[Occurrence, int]],
    window: tuple[datetime, datetime],
    used: tuple[int, int],
    now: datetime,
) -> tuple[list[AuthorityReservation | AuthorityBudgetExhausted], tuple[int, int]]:
    """Reserve, in order, each occurrence that still fits the window's budget (unsaved
    reservations), or say why it does not; and the window's usage after them."""
    principal = Principal.of_row(policy)
    columns = principal.columns()
    used_runs, used_units = used
    out: list[AuthorityReservation | AuthorityBudgetExhausted] = []
    for occurrence, units in charges:
        if over(policy.max_runs, used_runs + 1) or over(policy.max_units, used_units + units):
            out.append(_exhausted(principal, policy, window, (used_runs, used_units), units))
            continue
        used_runs += 1
        used_units += units
        out.append(
            AuthorityReservation(
                occurrence_id=occurrence.pk,
                job_id=occurrence.job_id,
                **columns,
                policy_revision=policy.revision,
                window_started_at=window[0],
                units=units,
                status=ReservationStatus.RESERVED,
                created_at=now,
            )
        )
    return out, (used_runs, used_units)


def _usage_rows(keys: list[Key], now: datetime, alias: str) -> dict[tuple[str, str], AuthorityUsage]:
    """The usage rows of ``keys``, locked in principal order: those missing (a window's first
    charge) are created at zero first. Claims of one principal may get here together (their
    policy lock is shared on PostgreSQL), so the insert skips a row another one created
    meanwhile. With several windows, the rows are read unlocked first and locked once they
    all exist: locking some, then creating and locking one that sorts before them, could
    wait in a cycle with a claim that locks them in order."""
    several = len(keys) > 1
    usages = _lock_usage(keys, alias, lock=not several)
    missing = sorted((key for key in keys if key[:2] not in usages), key=lambda key: key[:2])
    if missing:
        rows = [
            AuthorityUsage(**dict(zip(_KEY_FIELDS, key, strict=True)), runs=0, units=0, updated_at=now)
            for key in missing
        ]
        if dialect.can_skip_conflicts(alias):
            guarded.insert_new(alias, rows)
        else:
            dialect.insert(alias, rows)
    if several:
        return _lock_usage(keys, alias)
    if missing:
        usages.update(_lock_usage(missing, alias))
    return usages


def _check_empty(
    keys: list[Key], usages: dict[tuple[str, str], AuthorityUsage], now: datetime, alias: str
) -> None:
    """A window whose usage is still zero must have no reservations: one ``EXISTS`` over the
    index for all such windows (a window's first charge, mostly), never a count. One that
    has some is marked with the counts (counted once: the window is broken), so that this
    claim and every later one refuses it from the row alone."""
    empty = [key for key in keys if (u := usages[key[:2]]).runs == 0 and u.units == 0 and u.mismatch is None]
    reserved_already = _reserved_in(empty, alias)
    marked: list[AuthorityUsage] = []
    for key in empty:
        if key[:2] in reserved_already:
            usage = usages[key[:2]]
            usage.mismatch = _mismatch_record((0, 0), _recount(key, alias)[1], now)
            usage.verified_at = now
            marked.append(usage)
    if marked:
        AuthorityUsage.objects.using(alias).bulk_update(marked, ["mismatch", "verified_at"])


def charge(
    groups: list[tuple[AuthorityPolicy, list[tuple[Occurrence, int]]]], now: datetime, alias: str
) -> list[Charged]:
    """Charge occurrences against their principals' current-window budgets, each group one
    principal's (its policy row locked by the caller, shared or not), in order. For all
    groups at once: lock the windows' usage rows, the lock that serializes the charges of
    one principal (created at zero for a window's first charge); refuse a window an audit
    marked as not matching its reservations, or an empty one that has reservations, with
    ``AuthorityBudgetStateInvalid`` (nothing is written for that group); reserve each
    occurrence that still fits; write the usage rows and the reservations in bulk. The
    statements do not grow with the number of principals, nor read the reservations of a
    window that has been charged. Returns, per group, per occurrence, its reservation or why
    the budget refused it."""
    if not groups:
        return []
    keys = [_window_key(policy, now) for policy, _ in groups]
    usages = _usage_rows(keys, now, alias)
    _check_empty(keys, usages, now, alias)
    results: list[Charged] = []
    fresh: list[AuthorityReservation] = []
    changed: list[AuthorityUsage] = []
    for (policy, charges), key in zip(groups, keys, strict=True):
        window = window_bounds(policy.window_ms, now)
        usage = usages[key[:2]]
        if usage.mismatch is not None:
            results.append(_state_invalid(policy, window[0], usage.mismatch))
            continue
        out, (runs, units) = _reserve(policy, charges, window, (usage.runs, usage.units), now)
        results.append(out)
        reservations = [entry for entry in out if isinstance(entry, AuthorityReservation)]
        if reservations:
            fresh += reservations
            usage.runs, usage.units, usage.updated_at = runs, units, now
            changed.append(usage)
    # The usage rows and the reservations in one round trip where the database can.
    guarded.insert_after(alias, [_usage_update(alias, usage) for usage in changed], fresh)
    return results


def _usage_update(alias: str, usage: AuthorityUsage) -> guarded.Write:
    """The write of one charged window's new counts (its row locked by this transaction)."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    meta = AuthorityUsage._meta
    sets, params = [], []
    for name in ("runs", "units", "updated_at"):
        field = meta.get_field(name)
        assert isinstance(field, Field)
        sets.append(f"{quote(str(field.column))} = %s")
        params.append(field.get_db_prep_save(getattr(usage, name), connection))
    pk = meta.pk
    assert pk is not None
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {quote(str(pk.column))} = %s"
    return sql, [*params, pk.get_db_prep_value(usage.pk, connection)]


def settle_reservations(
    occurrence_ids: list[str], status: str, outcome: dict[str, Any], now: datetime, alias: str
) -> dict[str, dict[str, Any]]:
    """Settle the ``reserved`` reservations of occurrences that reached a terminal status.

    Called by the kernel inside its transaction. Returns, by occurrence id, the event data
    the terminal event carries for each settled reservation (policy revision and units).
    """
    if not occurrence_ids:
        return {}
    new_status = (
        ReservationStatus.SUCCEEDED if status == OccurrenceStatus.SUCCEEDED else ReservationStatus.FAILED
    )
    returned = dialect.update_returning(
        alias,
        AuthorityReservation,
        {"status": new_status.value, "outcome": outcome, "settled_at": now},
        {"status": ReservationStatus.RESERVED.value},
        ("occurrence", occurrence_ids),
        ("occurrence", "policy_revision", "units"),
    )
    if returned is not None:
        return {
            pk: {"authorityPolicyRevision": int(revision), "authorityUnits": int(units)}
            for pk, revision, units in returned
        }
    reservations = list(
        AuthorityReservation.objects.using(alias)
        .select_for_update()
        .filter(occurrence_id__in=occurrence_ids, status=ReservationStatus.RESERVED)
    )
    if not reservations:
        return {}
    updated = (
        AuthorityReservation.objects.using(alias)
        .filter(occurrence_id__in=[r.pk for r in reservations], status=ReservationStatus.RESERVED)
        .update(status=new_status, outcome=outcome, settled_at=now)
    )
    if updated != len(reservations):
        raise AuthoritySettlementConflict("authority reservation could not be settled")
    return {
        r.occurrence_id: {"authorityPolicyRevision": r.policy_revision, "authorityUnits": r.units}
        for r in reservations
    }


def settle_cancelled(ids: list[str], reason: str | None, now: datetime, alias: str) -> None:
    """A cancelled retry_wait occurrence may hold the reservation of its earlier attempt:
    it is terminal now, so the reservation settles (failed)."""
    settle_reservations(
        ids, OccurrenceStatus.CANCELLED, {"status": "cancelled", "reason": reason}, now, alias
    )


@dataclass(frozen=True)
class WindowCheck:
    """One window's recount by :func:`audit_budgets`: its usage row's runs and units, and the
    count and unit sum of its reservations, which must be equal."""

    principal_type: str
    principal_id: str
    policy_revision: int
    window_started_at: datetime
    usage: tuple[int, int]
    reservations: tuple[int, int]

    @property
    def matches(self) -> bool:
        return self.usage == self.reservations

    def describe(self) -> str:
        return (
            f"{Principal.of_row(self).label} revision {self.policy_revision}, window"
            f" {iso_ms(self.window_started_at)}: usage {self.usage[0]} runs / {self.usage[1]} units,"
            f" reservations {self.reservations[0]} / {self.reservations[1]}"
        )


def _record(check: WindowCheck, usage: AuthorityUsage | None, key: Key, now: datetime, alias: str) -> None:
    """Write what the recount found on the window's usage row: when, and the counts if they
    differ (which the next claim refuses); agreeing counts clear an earlier mark."""
    seen = None if check.matches else _mismatch_record(check.usage, check.reservations, now)
    if usage is not None:
        AuthorityUsage.objects.using(alias).filter(pk=usage.pk).update(verified_at=now, mismatch=seen)
        return
    # Reservations without a usage row: the row is created at zero, marked. A claim that
    # created it meanwhile found the same reservations and marked it itself.
    fields = dict(zip(_KEY_FIELDS, key, strict=True))
    row = AuthorityUsage(**fields, runs=0, units=0, updated_at=now, verified_at=now, mismatch=seen)
    AuthorityUsage.objects.using(alias).bulk_create([row], ignore_conflicts=True)


def audit_budgets(*, using: str | None = None) -> list[WindowCheck]:
    """Recount the reservations of every window a claim can charge now (each policy's
    current revision and window) and compare them with the window's usage row, which the
    claims trust without counting. A window whose counts differ is marked on its usage row
    (``mismatch``), and from then on its claims are refused with ``budget_state_invalid``
    until a recount finds them equal again (after an operator repaired the rows). Returns
    the windows that have a usage row or reservations, mismatched or not.

    Each recount is one statement (one snapshot, no lock), so claims go on meanwhile; it reads
    the window's reservations, as many as the window has had runs: run it off the claim path
    (``manage.py scheduler_status --check-budgets``)."""
    alias = dialect.alias_for(using)
    now = conf.now()
    checks: list[WindowCheck] = []
    for policy in AuthorityPolicy.objects.using(alias).order_by("principal_type", "principal_id"):
        key = _window_key(policy, now)
        usage, reserved = _recount(key, alias)
        if usage is None and reserved == (0, 0):
            continue
        used = (0, 0) if usage is None else (usage.runs, usage.units)
        check = WindowCheck(*key, usage=used, reservations=reserved)
        _record(check, usage, key, now, alias)
        checks.append(check)
    return checks
