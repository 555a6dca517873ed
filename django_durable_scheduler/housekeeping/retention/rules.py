"""What retention may delete and what it must keep.

What goes: terminal occurrences settled longer ago than their status's age, with their events
and reservations, and events of no occurrence older than theirs. What stays, however old: an
occurrence whose reservation's budget window is still open (usage must keep equalling that
window's reservations), a member of a batch not yet completed (its completion counts it), and,
for the workers, an occurrence whose row still dedupes an enqueue (docs/design.md, "Slot
identity and idempotency"): one enqueued under a key its caller chose, unless ``caller_keys``
gives an age, and a ``retry:<id>`` one while dead letter ``<id>`` is kept. Jobs are never
deleted, so ``Job.last_slot_at`` keeps refusing pruned slots.

These only read; :mod:`.plan` deletes what they leave.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet

from ... import conf
from ...kernel.batches import CALLBACK_PREFIX
from ...kernel.followups import FOLLOW_UP_PREFIX
from ...models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    AuthorityPolicy,
    AuthorityReservation,
    Batch,
    BatchStatus,
    Occurrence,
    ReservationStatus,
)

# Ids per query when reading a chunk's rows (under every database's limit of bound values).
IDS_PER_QUERY = 900
# Trigger keys the scheduler makes itself: slots (guarded by Job.last_slot_at), django.tasks
# enqueues (a fresh random key each) and dead-letter retries (see dedupe_kept).
# A chain's follow-ups and a batch's callback have keys made from what caused them, which
# settles or completes once (followups.py, batches.py): nothing could enqueue them again.
OWN_KEY_PREFIXES = ("schedule:", "task:", "retry:", FOLLOW_UP_PREFIX, CALLBACK_PREFIX)
RETRY_PREFIX = "retry:"
UNFINISHED = (BatchStatus.OPEN, BatchStatus.CLOSED)


def cutoffs(now: datetime, retention: conf.Retention | None = None) -> dict[str, datetime | None]:
    """By terminal status, the time before which a settled occurrence goes (None: kept
    forever), under ``retention`` (default: the setting; off keeps everything)."""
    settings = retention if retention is not None else conf.settings.RETENTION
    ages = settings.ages if settings is not None else {}
    return {str(s): None if ages.get(s) is None else now - ages[s] for s in TERMINAL_STATUSES}  # type: ignore[operator]


def _open_window(now: datetime, alias: str) -> Q:
    """Occurrences whose reservation must stay: still reserved, or in a budget window that
    has not ended. Principals are matched by type and id sets per window length (a superset,
    which only keeps more); a reservation whose policy is gone counts as ended."""
    by_window: dict[int, set[tuple[str, str]]] = defaultdict(set)
    for ptype, pid, window_ms in AuthorityPolicy.objects.using(alias).values_list(
        "principal_type", "principal_id", "window_ms"
    ):
        by_window[window_ms].add((ptype, pid))
    kept = Q(reservation__status=ReservationStatus.RESERVED)
    for window_ms, principals in by_window.items():
        kept |= Q(
            reservation__window_started_at__gt=now - timedelta(milliseconds=window_ms),
            reservation__principal_type__in={ptype for ptype, _ in principals},
            reservation__principal_id__in={pid for _, pid in principals},
        )
    return kept


def kept_occurrences(
    alias: str, now: datetime, by_status: dict[str, datetime | None] | None = None
) -> QuerySet[Occurrence]:
    """The occurrences whose events must survive a drop of history before the youngest
    cutoff: not settled, settled after their status's cutoff (``by_status``, default the
    setting's), kept for an open budget window, or members of a batch not yet completed."""
    by_status = cutoffs(now) if by_status is None else by_status
    young = Q(status__in=ACTIVE_STATUSES) | Q(batch__status__in=UNFINISHED)
    for status, cutoff in by_status.items():
        young |= Q(status=status) if cutoff is None else Q(status=status, settled_at__gte=cutoff)
    return Occurrence.objects.using(alias).filter(young | _open_window(now, alias))


def slices(ids: list[Any]) -> Iterator[list[Any]]:
    """``ids`` in slices that every database takes as the values of one ``IN``."""
    for start in range(0, len(ids), IDS_PER_QUERY):
        yield ids[start : start + IDS_PER_QUERY]


def kept_for_window(ids: list[str], now: datetime, alias: str) -> set[str]:
    """The occurrences among ``ids`` whose reservation must stay (see ``_open_window``)."""
    reservations = [
        row
        for part in slices(ids)
        for row in AuthorityReservation.objects.using(alias)
        .filter(occurrence_id__in=part)
        .values_list("occurrence_id", "status", "principal_type", "principal_id", "window_started_at")
    ]
    if not reservations:
        return set()
    windows = {
        (ptype, pid): window_ms
        for ptype, pid, window_ms in AuthorityPolicy.objects.using(alias)
        .filter(principal_id__in={r[3] for r in reservations})
        .values_list("principal_type", "principal_id", "window_ms")
    }
    keep = set()
    for occurrence_id, status, ptype, pid, started in reservations:
        window_ms = windows.get((ptype, pid))
        if status == ReservationStatus.RESERVED or (
            window_ms is not None and started + timedelta(milliseconds=window_ms) > now
        ):
            keep.add(occurrence_id)
    return keep


def kept_for_batch(ids: list[str], alias: str) -> set[str]:
    """The occurrences among ``ids`` whose batch has not completed: its completion counts
    them (a batch without members left completes with what remains)."""
    if not Batch.objects.using(alias).filter(status__in=UNFINISHED).exists():
        return set()
    return {
        pk
        for part in slices(ids)
        for pk in Occurrence.objects.using(alias)
        .filter(pk__in=part, batch__status__in=UNFINISHED)
        .values_list("pk", flat=True)
    }


def dedupe_kept(rows: list[tuple[str, datetime, str]], caller_keys: datetime | None, alias: str) -> set[str]:
    """The rows whose identity still dedupes an enqueue, so that deleting them could fire
    something twice: a key the caller chose (they may enqueue it again) unless settled before
    ``caller_keys``, and a dead letter's retry while that dead letter is kept (retrying it
    again must find the same retry)."""
    kept = {
        pk
        for pk, settled_at, key in rows
        if not key.startswith(OWN_KEY_PREFIXES) and (caller_keys is None or settled_at >= caller_keys)
    }
    retries = {key[len(RETRY_PREFIX) :]: pk for pk, _, key in rows if key.startswith(RETRY_PREFIX)}
    if retries:
        alive = Occurrence.objects.using(alias).filter(pk__in=list(retries)).values_list("pk", flat=True)
        kept.update(retries[dead] for dead in alive)
    return kept


def youngest_cutoff(by_status: dict[str, datetime | None]) -> datetime | None:
    """The latest of the cutoffs: history older than it may go whole, but for the events of
    ``kept_occurrences``."""
    found = [cutoff for cutoff in by_status.values() if cutoff is not None]
    return max(found) if found else None


def keep_job_events(by_status: dict[str, datetime | None], job_events: datetime | None) -> bool:
    """Whether a drop before the youngest cutoff must keep the events of no occurrence (those
    older than ``job_events`` go; None: none go)."""
    youngest = youngest_cutoff(by_status)
    return job_events is None or youngest is None or job_events < youngest


def kept_with_keys(
    alias: str, now: datetime, by_status: dict[str, datetime | None], caller_keys: datetime | None
) -> QuerySet[Occurrence]:
    """``kept_occurrences``, plus the rows the workers keep because they still dedupe an
    enqueue (a superset of ``dedupe_kept``'s: every ``retry:`` row), whose events must stay
    with them."""
    own = Q()
    for prefix in OWN_KEY_PREFIXES:
        if prefix != RETRY_PREFIX:
            own |= Q(trigger_key__startswith=prefix)
    keyed = ~own  # the caller's keys, and the retries of dead letters
    if caller_keys is not None:
        keyed = (keyed & ~Q(settled_at__lt=caller_keys)) | Q(trigger_key__startswith=RETRY_PREFIX)
    return kept_occurrences(alias, now, by_status) | Occurrence.objects.using(alias).filter(keyed)
