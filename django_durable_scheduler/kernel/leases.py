"""Leases: renewing a held lease, recording what a running handler did (its metadata and
receipt), and the expiry sweep that ends the final attempts whose leases expired. Part of
the kernel, the only writer of occurrence state: each operation is one short transaction.

A lease is held by (owner, fence) until it expires at ``lease_expires_at <= now``; every
operation on a held occurrence checks all three (the fence rule, ``lifecycle.held``), so a
worker that lost its lease can never overwrite the newer owner's writes. Settling a held
occurrence, giving it back and the authority verdicts are ``settling``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, QuerySet
from django.db.models.functions import Greatest

from .. import conf
from ..db.dialect import alias_for, insert_rows, lock_rows, write_transaction
from ..exceptions import InvalidArgument
from ..models import Occurrence, OccurrenceStatus
from ..rules.events import new_event
from ..rules.identity import normalize_json
from ..rules.lifecycle import Action, applied, cancel_requested, event_of, held, lease_lost, writes
from ..rules.lifecycle import expired as lifecycle_expired
from ..rules.outcomes import MAX_RESULT_BYTES
from ..rules.validation import iso_ms, normalize_int, to_duration_ms
from .budgets import settle_cancelled, settle_reservations
from .cancelling import CANCELLED_WHILE_RUNNING, cancelled_error
from .followups import TERMINAL_FIELDS, reached_terminal
from .settling import lease_args

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
        Occurrence.objects.using(alias).filter(pk__in=ids).update(**values)
        for row in group:
            applied(action, row, values)
        if action is Action.EXPIRE:
            outcome = {"status": "dead_letter", "error": error}
            settle_reservations(ids, OccurrenceStatus.DEAD_LETTER, outcome, now, alias)
        else:
            settle_cancelled(ids, CANCELLED_WHILE_RUNNING, now, alias)
    insert_rows(alias, events)
    reached_terminal(rows, now, alias)


def dead_letter_expired(*, limit: int = 500, using: str | None = None) -> int:
    """Dead-letter running occurrences whose lease expired on their final attempt (the
    ``expire`` transition), or cancel them where a cancel was requested for that attempt
    (``expire_cancelled``: the request made it the final one)."""
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
    """The occurrence, if ``owner`` holds its lease at ``fence`` (``lifecycle.held``)."""
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
        updated = _held(alias, occurrence_id, owner, fence, now).update(
            **writes(Action.RECORD_EXECUTION, now, **values)
        )
        current = Occurrence.objects.using(alias).filter(pk=occurrence_id).first()
        if not updated or current is None:
            raise lease_lost(occurrence_id, current, owner, fence, now)
    return current
