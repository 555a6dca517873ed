"""Leases: renewing held leases (one, or everything a worker holds at once), recording what
a running handler did (its metadata and receipt), and the expiry sweep that ends the final
attempts whose leases expired. Part of the kernel, the only writer of occurrence state: each
operation is one short transaction.

A lease is held by (owner, fence) until it expires at ``lease_expires_at <= now``; every
operation on a held occurrence checks all three (the fence rule, ``transitions.held``), so a
worker that lost its lease can never overwrite the newer owner's writes. Settling a held
occurrence, giving it back and the authority verdicts are ``settling``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import reduce
from operator import or_
from typing import Any, NamedTuple

from django.db.models import F, Q, QuerySet
from django.db.models.functions import Greatest

from .. import conf
from ..db.dialect import (
    alias_for,
    insert,
    lock_rows,
    write_transaction,
)
from ..exceptions import InvalidArgument
from ..models import Occurrence, OccurrenceStatus
from ..rules.identity import normalize_json
from ..rules.lifecycle import (
    Action,
    applied,
    cancel_requested,
    event_of,
    holds_lease,
    lease_lost,
)
from ..rules.outcomes import MAX_RESULT_BYTES
from ..rules.validation import iso_ms, normalize_identifier, normalize_int, to_duration_ms
from .authority.budgets import settle_cancelled, settle_reservations
from .cancelling import CANCELLED_WHILE_RUNNING, cancelled_error
from .events import new_event
from .followups import TERMINAL_FIELDS, reached_terminal
from .settling import lease_args
from .transitions import expired as lifecycle_expired
from .transitions import held, writes
from .writing import writing

MAX_LEASE_MS = conf.MAX_LEASE_MS


_UNSET: Any = object()


# What the expiry sweep reads of each row it ends.
EXPIRY_FIELDS = (
    "pk",
    "job_id",
    "lease_owner",
    "fence",
    "attempt",
    "max_attempts",
    "cancel_requested_fence",
    *TERMINAL_FIELDS,
)


def _lease_ms(lease: Any) -> int:
    return to_duration_ms(lease, "lease", minimum_ms=1, maximum_ms=MAX_LEASE_MS)


def _dead_letter_rows(rows: Sequence[Occurrence], now: datetime, alias: str, *, reason: str) -> None:
    """End expired final attempts: dead-lettered (``expire``), or cancelled where a cancel
    was requested for the attempt (``expire_cancelled``)."""
    cancelled = [row for row in rows if cancel_requested(row)]
    expired = [row for row in rows if not cancel_requested(row)]
    error = {"code": "SCHEDULER_LEASE_EXPIRED", "message": "lease expired on the final attempt"}
    events = []
    for action, group, stored in (
        (Action.EXPIRE, expired, error),
        (Action.EXPIRE_CANCELLED, cancelled, cancelled_error(error)),
    ):
        if not group:
            continue
        ids = [row.pk for row in group]
        events += [
            new_event(
                row.job_id,
                event_of(action),
                now,
                occurrence_id=row.pk,
                owner_id=row.lease_owner,  # the holder whose lease expired
                fence=row.fence,
                data={"reason": reason, "attempt": row.attempt, "maxAttempts": row.max_attempts},
            )
            for row in group
        ]
        values = writes(action, now, last_error=stored)
        with writing(action):
            Occurrence.objects.using(alias).filter(pk__in=ids).update(**values)
        for row in group:
            applied(action, row, values)
        if action is Action.EXPIRE:
            outcome = {"status": "dead_letter", "error": error}
            settle_reservations(ids, OccurrenceStatus.DEAD_LETTER, outcome, now, alias)
        else:
            settle_cancelled(ids, CANCELLED_WHILE_RUNNING, now, alias)
    insert(alias, events)
    reached_terminal(rows, now, alias)


def dead_letter_expired(*, limit: int | None = None, using: str | None = None) -> int:
    """Dead-letter running occurrences whose lease expired on their final attempt (the
    ``expire`` transition), or cancel them where a cancel was requested for that attempt
    (``expire_cancelled``: the request made it the final one); at most ``limit`` (default
    MAX_CLAIM_BATCH, so that a lowered setting does not refuse the worker's own sweep)."""
    limit = conf.settings.MAX_CLAIM_BATCH if limit is None else limit
    limit = normalize_int(limit, "limit", minimum=1, maximum=conf.settings.MAX_CLAIM_BATCH)
    now = conf.now()
    expired = Occurrence.objects.using(alias_for(using)).filter(lifecycle_expired(now))
    # Usually there is nothing to do: find out without taking a write lock.
    if not expired.exists():
        return 0
    with write_transaction(using) as alias:
        rows = list(
            lock_rows(
                expired.using(alias).order_by("lease_expires_at", "pk").only(*EXPIRY_FIELDS),
                alias,
            )[:limit]
        )
        if rows:
            _dead_letter_rows(rows, now, alias, reason="lease_expired")
    return len(rows)


def _held(alias: str, occurrence_id: str, owner: str, fence: int, now: datetime) -> QuerySet[Occurrence]:
    """The occurrence, if ``owner`` holds its lease at ``fence`` (``transitions.held``)."""
    return Occurrence.objects.using(alias).filter(held(owner, fence, now), pk=occurrence_id)


def renew(
    occurrence_id: str, *, owner: str, fence: int, lease: float | timedelta, using: str | None = None
) -> Occurrence:
    """Extend a held lease to at least now + ``lease`` (never shortens it)."""
    occurrence_id, owner, fence = lease_args(occurrence_id, owner, fence)
    lease_ms = _lease_ms(lease)
    now = conf.now()
    wanted = now + timedelta(milliseconds=lease_ms)
    with write_transaction(using) as alias:
        with writing(Action.RENEW):
            updated = _held(alias, occurrence_id, owner, fence, now).update(
                **writes(Action.RENEW, now, lease_expires_at=Greatest(F("lease_expires_at"), wanted))
            )
        current = Occurrence.objects.using(alias).filter(pk=occurrence_id).first()
        if not updated or current is None:
            raise lease_lost(occurrence_id, current, owner, fence, now)
        new_event(
            current.job_id,
            event_of(Action.RENEW),
            now,
            occurrence_id=occurrence_id,
            owner_id=owner,
            fence=fence,
            data={"leaseExpiresAt": iso_ms(current.lease_expires_at or wanted)},
        ).save(using=alias)
    return current


# What a batched renewal reads back of each row: enough to judge the fence rule, to see a
# cancel request for the attempt and to write the renewal's event.
RENEWAL_FIELDS = (
    "occurrence_id",
    "job_id",
    "status",
    "lease_owner",
    "fence",
    "lease_expires_at",
    "cancel_requested_fence",
)
# Leases renewed per statement: bounds a statement's parameters (SQLite's limit among them).
RENEW_CHUNK = 500


class Renewals(NamedTuple):
    """What :func:`renew_many` did: the occurrence ids whose leases it extended, and among
    them those with a cancel requested for the attempt held."""

    renewed: set[str]
    cancel_requested: set[str]


def renew_many(
    held_leases: Sequence[tuple[str, int]],
    *,
    owner: str,
    lease: float | timedelta,
    using: str | None = None,
) -> Renewals:
    """Extend to at least now + ``lease`` every lease of ``held_leases`` ((occurrence id,
    fence) pairs) that ``owner`` still holds at that fence, as :func:`renew` does one: per
    chunk of them, one locking read, one UPDATE and their ``occurrence_renewed`` events in
    one insert, however many it holds. A lease not held is left as it
    is and missing from the answer, which the caller asks why where it matters."""
    fences: dict[str, int] = {}
    for given_pk, given_fence in held_leases:
        pk, owner, fence = lease_args(given_pk, owner, given_fence)
        fences[pk] = fence
    lease_ms = _lease_ms(lease)
    pairs = list(fences.items())
    result = Renewals(set(), set())
    for start in range(0, len(pairs), RENEW_CHUNK):
        _renew_chunk(dict(pairs[start : start + RENEW_CHUNK]), owner, lease_ms, using, result)
    return result


def _renew_chunk(
    fences: dict[str, int], owner: str, lease_ms: int, using: str | None, result: Renewals
) -> None:
    now = conf.now()
    wanted = now + timedelta(milliseconds=lease_ms)
    by_fence: dict[int, list[str]] = {}
    for pk, fence in fences.items():
        by_fence.setdefault(fence, []).append(pk)
    condition = reduce(or_, (held(owner, fence, now) & Q(pk__in=ids) for fence, ids in by_fence.items()))
    with write_transaction(using) as alias:
        # Locked in primary-key order, the order every multi-row writer of the kernel locks in,
        # so that a renewal and a grouped settle never deadlock; what is read is the row as it
        # stands (a locking read), so the fence rule is judged on it.
        locked = Occurrence.objects.using(alias).filter(condition).select_for_update().order_by("pk")
        rows = locked.only(*RENEWAL_FIELDS)
        renewed = [row for row in rows if holds_lease(row, owner, fences[row.pk], now)]
        if renewed:
            values = writes(Action.RENEW, now, lease_expires_at=Greatest(F("lease_expires_at"), wanted))
            with writing(Action.RENEW):
                Occurrence.objects.using(alias).filter(pk__in=[row.pk for row in renewed]).update(**values)
        insert(
            alias,
            [
                new_event(
                    row.job_id,
                    event_of(Action.RENEW),
                    now,
                    occurrence_id=row.pk,
                    owner_id=owner,
                    fence=fences[row.pk],
                    data={"leaseExpiresAt": iso_ms(max(row.lease_expires_at or now, wanted))},
                )
                for row in renewed
            ],
        )
    result.renewed.update(row.pk for row in renewed)
    result.cancel_requested.update(row.pk for row in renewed if cancel_requested(row))


def record_execution(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    metadata: Any = _UNSET,
    receipt: Any = _UNSET,
    using: str | None = None,
) -> Occurrence:
    """Persist a running handler's metadata and/or execution receipt (64 KiB each) at once.
    ``SCHEDULER_LEASE_LOST`` unless the caller still holds the lease."""
    occurrence_id, owner, fence = lease_args(occurrence_id, owner, fence)
    values: dict[str, Any] = {}
    if metadata is not _UNSET:
        values["metadata"] = normalize_json(metadata, "metadata", max_bytes=MAX_RESULT_BYTES)
    if receipt is not _UNSET:
        values["receipt"] = normalize_json(receipt, "receipt", max_bytes=MAX_RESULT_BYTES)
    if not values:
        raise InvalidArgument("metadata", "give metadata or receipt")
    for column in ("metadata", "receipt"):
        values.setdefault(column, F(column))  # the one not given is kept
    now = conf.now()
    with write_transaction(using) as alias:
        with writing(Action.RECORD_EXECUTION):
            updated = _held(alias, occurrence_id, owner, fence, now).update(
                **writes(Action.RECORD_EXECUTION, now, **values)
            )
        current = Occurrence.objects.using(alias).filter(pk=occurrence_id).first()
        if not updated or current is None:
            raise lease_lost(occurrence_id, current, owner, fence, now)
    return current


def abandon(owner: str, *, using: str | None = None) -> int:
    """End now every unexpired lease ``owner`` holds, because its process is known to have
    ended (its supervisor saw it exit): its occurrences are reclaimed at once, each as an
    attempt like any reclaim, instead of waiting out their leases (``docs/design.md``,
    "Stranded work and second runs"). Only for an owner that can no longer write; returns
    how many leases ended, each with an ``occurrence_abandoned`` event."""
    owner = normalize_identifier(owner, "owner")
    now = conf.now()
    with write_transaction(using) as alias:
        leases = Occurrence.objects.using(alias).filter(
            status=OccurrenceStatus.RUNNING, lease_owner=owner, lease_expires_at__gt=now
        )
        # Locked in primary-key order, as every multi-row writer of the kernel locks.
        rows = list(leases.select_for_update().order_by("pk").only("pk", "job_id", "fence"))
        if not rows:
            return 0
        with writing(Action.ABANDON):
            leases.update(**writes(Action.ABANDON, now, lease_expires_at=now))
        insert(
            alias,
            [
                new_event(
                    row.job_id,
                    event_of(Action.ABANDON),
                    now,
                    occurrence_id=row.pk,
                    owner_id=owner,
                    fence=row.fence,
                    data={"leaseExpiresAt": iso_ms(now)},
                )
                for row in rows
            ],
        )
    return len(rows)
