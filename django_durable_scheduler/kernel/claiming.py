"""Claiming: taking due occurrences for a worker, fairly across principals, and handing the
batch to the authority checks before any handler starts (docs/design.md, "Fair claiming").

This module owns the claim transaction, from the worker's call to the commit: the
principals with work are read before it (:func:`plan_claim`); inside it, the fair batch is
locked without blocking other claimers (``candidates``, whose statements are
``claim_sql``'s), made running and its events appended; :func:`claim_authorized` then has
``reservations.authorize_claimed`` charge or refuse them in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from .. import conf
from ..db import guarded
from ..db.dialect import alias_for, write_transaction
from ..exceptions import InvalidArgument
from ..models import Occurrence, OccurrenceStatus
from ..rules.lifecycle import Action, applied, event_of
from ..rules.throttles import Throttle
from ..rules.validation import iso_ms, normalize_bool, normalize_identifier, normalize_int, to_duration_ms
from . import claim_sql, leases, throttles
from .authority import reservations
from .authority.reservations import AuthorizedClaim, Units
from .candidates import claim_candidates, last_claimed_principal, waiting_work
from .events import new_event
from .transitions import writes
from .writing import writing


def _kinds(kinds: Any) -> list[str] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise InvalidArgument("kinds", "must be a list of kinds or None")
    return sorted({normalize_identifier(k, f"kinds[{i}]", max_length=128) for i, k in enumerate(kinds)})


@dataclass(frozen=True)
class ClaimPlan:
    """A checked claim request and what was read before its transaction (see
    :func:`plan_claim`)."""

    owner: str
    now: datetime
    expires: datetime
    kinds: list[str] | None
    limit: int
    after_principal: str | None
    waiting: dict[str, datetime]
    prioritized: bool | None  # whether a waiting row has a priority, read with ``waiting``


def plan_claim(
    *,
    owner: str,
    lease: float | timedelta,
    limit: int = 1,
    kinds: Iterable[str] | None = None,
    after_principal: str | None = None,
    sweep_expired: bool = True,
    using: str | None = None,
) -> ClaimPlan | None:
    """The arguments of :func:`claim_batch` checked, and the principals with work read
    before the transaction; None when nobody has any (an idle worker's every turn is then one
    statement and no transaction). The rows are re-checked under the lock anyway."""
    owner = normalize_identifier(owner, "owner")
    lease_ms = to_duration_ms(lease, "lease", minimum_ms=1, maximum_ms=leases.MAX_LEASE_MS)
    limit = normalize_int(limit, "limit", minimum=1, maximum=conf.settings.MAX_CLAIM_BATCH)
    kind_list = _kinds(kinds)
    if after_principal is not None and not isinstance(after_principal, str):
        # Only compared with principal keys in Python, never stored or sent to the database.
        raise InvalidArgument("after_principal", "must be a principal key (a string) or None")
    if normalize_bool(sweep_expired, "sweep_expired"):
        # The worker sweeps on its own schedule instead of before every claim.
        leases.dead_letter_expired(using=using)
    now = conf.now()
    waiting, prioritized = waiting_work(alias_for(using), now)
    if not waiting:
        return None
    if after_principal is None and len(waiting) > 1:  # with one principal there is no turn to take
        after_principal = last_claimed_principal(alias_for(using))
    return ClaimPlan(
        owner,
        now,
        now + timedelta(milliseconds=lease_ms),
        kind_list,
        limit,
        after_principal,
        waiting,
        prioritized,
    )


def claim_planned(
    plan: ClaimPlan,
    alias: str,
    *,
    before_lock: Callable[[list[str]], None] | None = None,
    max_running_of: Callable[[list[str]], dict[str, int]] | None = None,
    throttles_of: Callable[[list[str]], dict[str, Throttle]] | None = None,
    waits: list[datetime] | None = None,
) -> list[Occurrence]:
    """The body of :func:`claim_batch`, inside the caller's write transaction on ``alias``:
    lock the fair batch, make it running and append its events. ``before_lock`` is called
    with the candidates' principal keys before any occurrence row is locked (see
    :func:`claim_candidates`, which also says what ``waits`` receives)."""
    owner, now, expires = plan.owner, plan.now, plan.expires
    rows = claim_candidates(
        alias,
        now,
        plan.kinds,
        plan.limit,
        plan.after_principal,
        plan.waiting,
        before_lock=before_lock,
        max_running_of=max_running_of,
        prioritized=plan.prioritized,
        throttles_of=throttles_of,
        waits=waits,
    )
    if not rows:
        return []
    # The lease runs from this write, not from the plan: the time the transaction waited for
    # its locks and chose its rows is not taken from it.
    expires += conf.now() - now
    # Claim and reclaim set the same columns (lifecycle.TRANSITIONS): one UPDATE for both.
    values = writes(Action.CLAIM, now, lease_owner=owner, lease_expires_at=expires)
    update = claim_sql.claim_update(alias, values, [row.pk for row in rows])
    events = []
    for row in rows:
        reclaimed = row.status == OccurrenceStatus.RUNNING
        data: dict[str, Any] = {
            "attempt": row.attempt + 1,
            "maxAttempts": row.max_attempts,
            "leaseExpiresAt": iso_ms(expires),
        }
        if reclaimed:
            data.update(previousOwner=row.lease_owner, previousFence=row.fence)
        events.append(
            new_event(
                row.job_id,
                event_of(Action.RECLAIM if reclaimed else Action.CLAIM),
                now,
                occurrence_id=row.pk,
                owner_id=owner,
                fence=row.fence + 1,
                data=data,
            )
        )
        applied(Action.CLAIM, row, values)
    # The UPDATE and its events in one round trip where the database can.
    with writing(Action.CLAIM):
        guarded.insert_after(alias, [update], events)
    return rows


def claim_batch(
    *,
    owner: str,
    lease: float | timedelta,
    limit: int = 1,
    kinds: Iterable[str] | None = None,
    after_principal: str | None = None,
    sweep_expired: bool = True,
    using: str | None = None,
) -> list[Occurrence]:
    """Claim up to ``limit`` due occurrences in one transaction, fairly across principals:
    the first due occurrence of every principal before the second of any, principals in
    round-robin order after ``after_principal`` (the ``principal_key`` served last). Without
    one, the rotation continues after the principal of the newest claim in the event log,
    so separate calls from any number of processes go round the principals too.

    Due: queued/retry_wait whose time has come, or running with an expired lease and
    attempts left (a reclaim). Each becomes running with attempt+1 and fence+1.
    """
    plan = plan_claim(
        owner=owner,
        lease=lease,
        limit=limit,
        kinds=kinds,
        after_principal=after_principal,
        sweep_expired=sweep_expired,
        using=using,
    )
    if plan is None:
        return []
    with write_transaction(using) as alias:
        return claim_planned(plan, alias)


def claim(
    *, owner: str, lease: float | timedelta, kinds: Iterable[str] | None = None, using: str | None = None
) -> Occurrence | None:
    """Claim the next due occurrence, or return None when nothing is due: a batch of one
    (:func:`claim_batch`), so successive claims go round the principals with due work."""
    rows = claim_batch(owner=owner, lease=lease, limit=1, kinds=kinds, using=using)
    return rows[0] if rows else None


def has_due(*, kinds: Iterable[str] | None = None, using: str | None = None) -> bool:
    """Whether anything is claimable now (a read without locks: rows another claimer holds
    count too)."""
    kind_list = _kinds(kinds)
    alias = alias_for(using)
    now = claim_sql.adapted(alias, conf.now())
    job = [True, *(kind_list or [])]
    return bool(claim_sql.fetch(alias, claim_sql.sql_of(alias, kind_list)["due"], [now, *job, now, *job]))


def claim_authorized(
    *,
    owner: str,
    lease: float | timedelta,
    limit: int = 1,
    kinds: Iterable[str] | None = None,
    units_of: Callable[[Occurrence], Units] | None = None,
    after_principal: str | None = None,
    sweep_expired: bool = True,
    using: str | None = None,
) -> AuthorizedClaim:
    """:func:`claim_batch`, then ``reservations.authorize_claimed``, in one transaction (one
    commit between a due occurrence and its handler's start): the batch is claimed fairly,
    then each claimed occurrence is authorized, denied (dead-lettered) or deferred (queued
    again until its window ends, no attempt used) before the commit. What the worker calls.

    ``units_of(occurrence)`` gives the units of the occurrence's handler registration (an
    int or a function of the occurrence, as ``reservations.resolve_units`` takes); default 1.
    It runs inside the transaction, while it holds its locks: it should only look at the
    occurrence. The principals' policy rows are locked before any occurrence row, the order
    ``set_policy`` and ``reservations.authorize`` use, so neither can wait on this in a cycle.
    """
    if units_of is not None and not callable(units_of):
        raise InvalidArgument("units_of", "must be a function of the occurrence or None")
    plan = plan_claim(
        owner=owner,
        lease=lease,
        limit=limit,
        kinds=kinds,
        after_principal=after_principal,
        sweep_expired=sweep_expired,
        using=using,
    )
    if plan is None:
        return AuthorizedClaim([], [], [], [])
    policies: reservations.LockedPolicies = {}
    with write_transaction(using) as alias:

        def lock_policies(keys: list[str]) -> None:
            policies.update(reservations.lock_policies_of(keys, alias))

        def max_running(keys: list[str]) -> dict[str, int]:
            # The policies just locked: a claim that caps nothing reads nothing more.
            return {
                principal.key: policy.max_running
                for principal, policy in policies.items()
                if policy.max_running is not None
            }

        def throttled(keys: list[str]) -> dict[str, Throttle]:
            return throttles.policy_throttles(policies.values())

        waits: list[datetime] = []
        claimed = claim_planned(
            plan,
            alias,
            before_lock=lock_policies,
            max_running_of=max_running,
            throttles_of=throttled,
            waits=waits,
        )
        authorized = reservations.authorize_claimed(claimed, units_of, plan.owner, policies, alias)
    return replace(authorized, throttled_until=min(waits)) if waits else authorized
