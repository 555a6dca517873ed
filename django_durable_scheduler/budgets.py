"""Budgets: charging runs against a principal's per-window usage, and settling the
reservations those charges made (``docs/design.md``, "Budgets and reservations").

This sits below the lease code: the kernel settles reservations when an occurrence ends,
and authorization (``reservations.py``) charges them, each inside its own transaction.
Usage per (principal, policy revision, window) must always equal the count and unit sum of
that window's reservations; :func:`charge` checks it before writing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections

from . import dialect
from .exceptions import AuthorityBudgetExhausted, AuthorityBudgetStateInvalid, AuthoritySettlementConflict
from .identity import iso_ms
from .models import (
    AuthorityPolicy,
    AuthorityReservation,
    AuthorityUsage,
    Occurrence,
    OccurrenceStatus,
    ReservationStatus,
)
from .policies import window_bounds


def principal_details(principal: dict[str, Any]) -> dict[str, Any]:
    return {"principal": {"type": principal["type"], "id": principal["id"]}}


def _exhausted(
    principal: dict[str, Any],
    policy: AuthorityPolicy,
    window: tuple[datetime, datetime],
    used: tuple[int, int],
    units: int,
) -> AuthorityBudgetExhausted:
    start, end = window
    return AuthorityBudgetExhausted(
        f"authority budget of {principal['type']}:{principal['id']} is spent until {iso_ms(end)}",
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


def _window_state(
    keys: list[tuple[str, str, int, datetime]], alias: str
) -> tuple[dict[tuple[str, str], AuthorityUsage], dict[tuple[str, str], tuple[int, int]]]:
    """For each (principal, revision, window) of ``keys``: its usage row, locked, and the
    count and units of its reservations, keyed by principal (one window each). Two plain
    statements however many principals there are."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    one = " AND ".join(f"{quote(field)} = %s" for field in _KEY_FIELDS)
    match = " OR ".join([f"({one})"] * len(keys))
    params: list[Any] = []
    for principal_type, principal_id, revision, start in keys:
        params += [principal_type, principal_id, revision, connection.ops.adapt_datetimefield_value(start)]
    principal = f"{quote('principal_type')}, {quote('principal_id')}"
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    usage_pk = quote(str(AuthorityUsage._meta.pk.column))
    usages: dict[tuple[str, str], AuthorityUsage] = {}
    counted: dict[tuple[str, str], tuple[int, int]] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {usage_pk}, {principal}, {quote('runs')}, {quote('units')}"
            f" FROM {quote(AuthorityUsage._meta.db_table)} WHERE {match} ORDER BY {principal}{lock}",
            params,
        )
        for pk, principal_type, principal_id, runs, units in cursor.fetchall():
            usages[principal_type, principal_id] = AuthorityUsage(pk=pk, runs=runs, units=units)
        cursor.execute(
            f"SELECT {principal}, COUNT(*), COALESCE(SUM({quote('units')}), 0)"
            f" FROM {quote(AuthorityReservation._meta.db_table)} WHERE {match} GROUP BY {principal}",
            params,
        )
        for principal_type, principal_id, runs, units in cursor.fetchall():
            counted[principal_type, principal_id] = (int(runs), int(units))
    return usages, counted


Charged = list[AuthorityReservation | AuthorityBudgetExhausted] | AuthorityBudgetStateInvalid


def _principal_of(policy: AuthorityPolicy) -> dict[str, Any]:
    return {"type": policy.principal_type, "id": policy.principal_id}


def _state_invalid(
    policy: AuthorityPolicy, start: datetime, used: tuple[int, int], reserved: tuple[int, int]
) -> AuthorityBudgetStateInvalid:
    principal = _principal_of(policy)
    return AuthorityBudgetStateInvalid(
        f"authority usage of {principal['type']}:{principal['id']} does not match its reservations",
        {
            **principal_details(principal),
            "policy_revision": policy.revision,
            "windowStartedAt": iso_ms(start),
            "usage": {"runs": used[0], "units": used[1]},
            "reservations": {"runs": reserved[0], "units": reserved[1]},
        },
    )


def _reserve(
    policy: AuthorityPolicy,
    charges: list[tuple[Occurrence, int]],
    window: tuple[datetime, datetime],
    used: tuple[int, int],
    now: datetime,
) -> tuple[list[AuthorityReservation | AuthorityBudgetExhausted], tuple[int, int]]:
    """Reserve, in order, each occurrence that still fits the window's budget (unsaved
    reservations), or say why it does not; and the window's usage after them."""
    principal = _principal_of(policy)
    used_runs, used_units = used
    out: list[AuthorityReservation | AuthorityBudgetExhausted] = []
    for occurrence, units in charges:
        if used_runs + 1 > policy.max_runs or used_units + units > policy.max_units:
            out.append(_exhausted(principal, policy, window, (used_runs, used_units), units))
            continue
        used_runs += 1
        used_units += units
        out.append(
            AuthorityReservation(
                occurrence_id=occurrence.pk,
                job_id=occurrence.job_id,
                principal_type=policy.principal_type,
                principal_id=policy.principal_id,
                policy_revision=policy.revision,
                window_started_at=window[0],
                units=units,
                status=ReservationStatus.RESERVED,
                created_at=now,
            )
        )
    return out, (used_runs, used_units)


def charge(
    groups: list[tuple[AuthorityPolicy, list[tuple[Occurrence, int]]]], now: datetime, alias: str
) -> list[Charged]:
    """Charge occurrences against their principals' current-window budgets, each group one
    principal's (its policy row locked by the caller), in order. For all groups at once:
    read the windows' usage rows (locked) and their reservations' totals, which must agree
    (else that group gets ``AuthorityBudgetStateInvalid`` and nothing is written for it);
    reserve each occurrence that still fits; write the usage rows and the reservations in
    bulk. The statements do not grow with the number of principals. Returns, per group,
    per occurrence, its reservation or why the budget refused it."""
    if not groups:
        return []
    keys = [_window_key(policy, now) for policy, _ in groups]
    usages, counted = _window_state(keys, alias)
    results: list[Charged] = []
    fresh: list[AuthorityReservation] = []
    created: list[AuthorityUsage] = []
    changed: list[AuthorityUsage] = []
    for (policy, charges), key in zip(groups, keys, strict=True):
        window = window_bounds(policy.window_ms, now)
        usage = usages.get(key[:2])
        used = (0, 0) if usage is None else (usage.runs, usage.units)
        reserved = counted.get(key[:2], (0, 0))
        if reserved != used:
            results.append(_state_invalid(policy, window[0], used, reserved))
            continue
        out, (runs, units) = _reserve(policy, charges, window, used, now)
        results.append(out)
        reservations = [entry for entry in out if isinstance(entry, AuthorityReservation)]
        if not reservations:
            continue
        fresh += reservations
        if usage is None:
            fields = dict(zip(_KEY_FIELDS, key, strict=True))
            created.append(AuthorityUsage(**fields, runs=runs, units=units, updated_at=now))
        else:
            usage.runs, usage.units, usage.updated_at = runs, units, now
            changed.append(usage)
    if created:
        AuthorityUsage.objects.using(alias).bulk_create(created)
    dialect.update_rows(alias, changed, ["runs", "units", "updated_at"])
    if fresh:
        dialect.insert_rows(alias, fresh)
    return results


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
