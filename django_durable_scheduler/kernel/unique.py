"""Unique while pending, and debounce: an enqueue given a ``unique_key`` adds an occurrence
only if none of the same job and key is waiting (or, with ``unique_while="active"``, waiting
or running); with ``debounce`` it moves the waiting one's start later and gives it the newest
payload instead (the ``debounce`` row of ``lifecycle.TRANSITIONS``), never past its first
call plus ``debounce_max_wait`` when one is given.

Each such call is recorded (``UniqueCall``: its identity, the occurrence it resolved to, its
payload's digest), and the same call again is answered from that record, so a retried call
never debounces twice. Exactness under racing enqueuers rests on the job's ``UniqueLock`` row,
locked before looking (see docs/design.md, "Unique keys and debounce"); this module validates
the arguments, takes that lock, answers a recorded call, finds the live occurrence of a key
and writes the debounce and the record.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Case, Value, When

from ..exceptions import InvalidArgument
from ..models import (
    ACTIVE_STATUSES,
    PENDING_STATUSES,
    UNIQUE_LIVE,
    Job,
    Occurrence,
    OccurrenceStatus,
    UniqueCall,
    UniqueLock,
)
from ..rules.identity import canonical_json
from ..rules.lifecycle import Action, event_of
from ..rules.validation import iso_ms, normalize_identifier, to_duration_ms
from .events import new_event
from .inserting import payload_mismatch
from .transitions import writes
from .writing import writing

# What each ``unique_while`` counts as the occurrence that stands for the key.
UNIQUE_WHILE: dict[str, tuple[OccurrenceStatus, ...]] = {
    "pending": PENDING_STATUSES,
    "active": ACTIVE_STATUSES,
}
MAX_UNIQUE_KEY = 256  # the column's length
MAX_DEBOUNCE_MS = 31 * 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class UniqueRequest:
    """One enqueue's key, the statuses of the occurrence that stands for it, its debounce in
    milliseconds (None: unique, the waiting one is returned untouched) and the debounce's cap
    (None: none)."""

    key: str
    statuses: tuple[OccurrenceStatus, ...]
    debounce_ms: int | None = None
    max_wait_ms: int | None = None

    def start(self, now: datetime, first: datetime | None = None) -> datetime:
        """When a debounced occurrence is due: ``debounce`` after ``now``, but no later than
        ``debounce_max_wait`` after ``first``, the call that added it (default: this one)."""
        assert self.debounce_ms is not None
        start = now + timedelta(milliseconds=self.debounce_ms)
        if self.max_wait_ms is None:
            return start
        return min(start, (now if first is None else first) + timedelta(milliseconds=self.max_wait_ms))


def unique_request(
    unique_key: Any, unique_while: Any, debounce: Any, available_at: Any, debounce_max_wait: Any = None
) -> UniqueRequest | None:
    """The enqueue's unique or debounce request (None: neither was asked for); bad input is
    refused naming the argument, before anything is read or written."""
    if unique_key is None:
        if unique_while is not None:
            raise InvalidArgument("unique_while", "needs a unique_key")
        if debounce is not None:
            raise InvalidArgument("debounce", "needs a unique_key")
        if debounce_max_wait is not None:
            raise InvalidArgument("debounce_max_wait", "needs a unique_key and a debounce")
        return None
    key = normalize_identifier(unique_key, "unique_key", max_length=MAX_UNIQUE_KEY)
    if debounce is None:
        if debounce_max_wait is not None:
            raise InvalidArgument("debounce_max_wait", "needs a debounce, which it caps")
        mode = "pending" if unique_while is None else unique_while
        if not isinstance(mode, str) or mode not in UNIQUE_WHILE:
            raise InvalidArgument("unique_while", "must be 'pending' or 'active'")
        return UniqueRequest(key, UNIQUE_WHILE[mode])
    debounce_ms = to_duration_ms(debounce, "debounce", minimum_ms=0, maximum_ms=MAX_DEBOUNCE_MS)
    max_wait_ms = max_wait(debounce_max_wait, debounce_ms, "debounce_max_wait")
    if unique_while is not None:
        raise InvalidArgument(
            "unique_while", "must not be given with debounce, which changes only a waiting occurrence"
        )
    if available_at is not None:
        raise InvalidArgument(
            "available_at", "must not be given with debounce, which sets it to now + debounce"
        )
    return UniqueRequest(key, PENDING_STATUSES, debounce_ms, max_wait_ms)


def max_wait(value: Any, debounce_ms: int, field: str) -> int | None:
    """``debounce_max_wait`` in milliseconds (None: no cap): at least the debounce, which a
    smaller cap would silently shorten for every call."""
    if value is None:
        return None
    ms = to_duration_ms(value, field, minimum_ms=0, maximum_ms=MAX_DEBOUNCE_MS)
    if ms < debounce_ms:
        raise InvalidArgument(field, f"must be at least debounce ({debounce_ms / 1000:g} seconds)")
    return ms


def lock_job(job_id: str, now: datetime, alias: str) -> None:
    """Lock the job's ``UniqueLock`` row until the transaction ends, making it first if need
    be, in one upsert: on a row that exists it writes, and so waits for and then holds the
    row's lock (PostgreSQL's ON CONFLICT DO UPDATE, MariaDB's ON DUPLICATE KEY UPDATE; SQLite's
    transaction already holds the database's write lock). A select-then-insert would let
    two first enqueuers both find nothing, and their inserts deadlock on MariaDB."""
    # MySQL/MariaDB name no conflict target: any unique key (here only the primary key) is one.
    target = ["job_id"] if connections[alias].features.supports_update_conflicts_with_target else None
    UniqueLock.objects.using(alias).bulk_create(
        [UniqueLock(job_id=job_id, locked_at=now)],
        update_conflicts=True,
        unique_fields=target,
        update_fields=["locked_at"],
    )


def payload_digest(payload: Any) -> str:
    """What a call's record keeps of its payload: the sha256 of its canonical JSON, so that
    another payload is told apart without storing the payload twice."""
    return hashlib.sha256(canonical_json(payload, "payload").encode("utf-8")).hexdigest()


def answered(job: Job, wanted: Occurrence, digest: str, alias: str) -> Occurrence | None:
    """The occurrence a call with ``wanted``'s identity resolved to, if that call was recorded,
    whatever its status now; another payload for it is ``IdempotencyPayloadMismatch``. None:
    no such call yet. The caller holds the job's lock, which every writer of the job's records
    holds, so the read sees each one that committed before."""
    calls = UniqueCall.objects.using(alias).select_related("occurrence")
    call = calls.filter(pk=wanted.idempotency_key).first()
    if call is None:
        return None
    if call.payload_digest != digest:
        raise payload_mismatch(job, wanted.trigger_key)
    return call.occurrence


def record(wanted: Occurrence, occurrence: Occurrence, digest: str, now: datetime, alias: str) -> None:
    """Record the call with ``wanted``'s identity as resolved to ``occurrence``. Under the job's
    lock no other call of the job writes it meanwhile; a duplicate key here can only be a call
    recorded after a repeatable-read snapshot taken before the lock (MySQL/MariaDB inside a
    caller's transaction that read first), and fails the call rather than answer it twice."""
    row = UniqueCall(
        call_key=wanted.idempotency_key, occurrence_id=occurrence.pk, payload_digest=digest, created_at=now
    )
    row.save(using=alias, force_insert=True)


def find_live(job_id: str, request: UniqueRequest, alias: str) -> Occurrence | None:
    """The newest occurrence of ``job_id`` with the request's key in one of its statuses,
    locked (a locking read also sees what committed after the caller's snapshot). The
    caller holds the job's lock (``lock_job``), so no other unique enqueue of the job adds one
    meanwhile."""
    rows = Occurrence.objects.using(alias).select_for_update().filter(job_id=job_id, unique_key=request.key)
    if connections[alias].vendor == "mysql":
        # The status only inside a CASE, which no index serves: MariaDB then reads through
        # (job, key), whose entries no claim or settle rewrites. Through an index holding the
        # status it would lock entries that a claim's UPDATE must rewrite while that claim
        # holds the row this read waits for: a deadlock.
        live = Case(When(status__in=request.statuses, then=Value(1)), default=Value(0))
        rows = rows.alias(live=live).filter(live=1)
    else:
        rows = rows.filter(UNIQUE_LIVE, status__in=request.statuses)
    return rows.order_by("-created_at", "-occurrence_id").first()


def debounce(
    occurrence: Occurrence, request: UniqueRequest, payload: Any, trigger_key: str, now: datetime, alias: str
) -> Occurrence:
    """Give the waiting ``occurrence`` the newest ``payload`` and move its start to
    ``debounce`` after ``now``, but not past ``debounce_max_wait`` after the call that added it
    (its ``created_at``), and never earlier than it was (a retry's backoff is kept; running it
    sooner is ``run_now``'s job), and record it."""
    previous = occurrence.available_at
    start = request.start(now, occurrence.created_at)
    values = writes(Action.DEBOUNCE, now, available_at=max(previous, start), payload=payload)
    for name, value in values.items():
        setattr(occurrence, name, value)
    with writing(Action.DEBOUNCE):
        occurrence.save(using=alias, update_fields=list(values))
    data = {
        "uniqueKey": request.key,
        "triggerKey": trigger_key,
        "previousAvailableAt": iso_ms(previous),
        "availableAt": iso_ms(occurrence.available_at),
        "status": occurrence.status,
    }
    if request.max_wait_ms is not None:
        cap = occurrence.created_at + timedelta(milliseconds=request.max_wait_ms)
        data["maxWaitUntil"] = iso_ms(cap)
    new_event(
        occurrence.job_id, event_of(Action.DEBOUNCE), now, occurrence_id=occurrence.occurrence_id, data=data
    ).save(using=alias)
    return occurrence
