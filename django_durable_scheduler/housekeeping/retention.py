"""Retention: deleting settled history, by the workers on a period (``DURABLE_SCHEDULER_RETENTION``)
and by hand (``manage.py scheduler_prune``, through ``ops.prune``), with one engine.

What goes: terminal occurrences settled longer ago than their status's age, with their events
and reservations, and events of no occurrence older than theirs. What stays, however old: an
occurrence whose reservation's budget window is still open (usage must keep equalling that
window's reservations), and, for the workers, an occurrence whose row still dedupes an enqueue
(docs/design.md, "Slot identity and idempotency"): one enqueued under a key its caller chose,
unless ``caller_keys`` gives an age, and a ``retry:<id>`` one while dead letter ``<id>`` is
kept. Jobs are never deleted, so ``Job.last_slot_at`` keeps refusing pruned slots.

Deleting is throttled so that claiming never waits on it: candidates are read without locks,
each batch is its own short transaction that locks only its rows (skipping rows others hold),
with a pause between batches. With an archive (:mod:`.archive`), each chunk of up to
``CHUNK`` occurrences of one day is written and verified before its batches go.

In ``runscheduler``, :class:`RetentionThread` runs it off the claim loop, on a thread with its own
database connection, under the ``retention`` lease (:mod:`.maintenance`): one worker at a time
across hosts, once per period. A thread rather than a step of the loop, because an archive
write to remote storage or a batch waiting on a row lock may take seconds that the loop
would otherwise spend not claiming.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, Model, OuterRef, Q, QuerySet

from .. import conf
from ..db import dialect
from ..kernel import budgets
from ..kernel.batches import CALLBACK_PREFIX
from ..kernel.followups import FOLLOW_UP_PREFIX
from ..models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    AuthorityPolicy,
    AuthorityReservation,
    Batch,
    BatchStatus,
    Event,
    Occurrence,
    ReservationStatus,
)
from ..rules.validation import iso_ms
from . import archive, maintenance, partitions

logger = logging.getLogger("django_durable_scheduler")

LEASE_NAME = "retention"
DEFAULT_BATCH = 500
MAX_BATCH = 10_000
# Candidates read per query, and occurrences per archive file (their events and
# reservations go in files of their own); deleted in batches of the setting's batch_size.
CHUNK = 10_000
# Ids per query when reading a chunk's rows (under every database's limit of bound values).
IDS_PER_QUERY = 900
# Trigger keys the scheduler makes itself: slots (guarded by Job.last_slot_at), django.tasks
# enqueues (a fresh random key each) and dead-letter retries (see _dedupe_kept).
# A chain's follow-ups and a batch's callback have keys made from what caused them, which
# settles or completes once (followups.py, batches.py): nothing could enqueue them again.
OWN_KEY_PREFIXES = ("schedule:", "task:", "retry:", FOLLOW_UP_PREFIX, CALLBACK_PREFIX)
RETRY_PREFIX = "retry:"
# How often a worker looks whether a run is due, at most (the period may be shorter).
CHECK_EVERY = 60.0
# How often a worker makes sure the coming days' event partitions exist (partitions.AHEAD ahead).
AHEAD_EVERY = 3600.0
ARCHIVED_SHOWN = 50  # archive file names a run records (the count is always exact)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


# --------------------------------------------------------------------------- what goes


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


def _slices(ids: list[Any]) -> Iterator[list[Any]]:
    """``ids`` in slices that every database takes as the values of one ``IN``."""
    for start in range(0, len(ids), IDS_PER_QUERY):
        yield ids[start : start + IDS_PER_QUERY]


def _kept_for_window(ids: list[str], now: datetime, alias: str) -> set[str]:
    """The occurrences among ``ids`` whose reservation must stay (see ``_open_window``)."""
    reservations = [
        row
        for part in _slices(ids)
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


# --------------------------------------------------------------------------- results


@dataclass
class PruneResult:
    cutoff: datetime | None  # the one age of a manual prune (None: the setting's ages)
    dry_run: bool
    occurrences: int = 0
    events: int = 0
    reservations: int = 0
    job_events: int = 0
    # Old enough, but kept: their reservation's budget window is still open.
    kept: int = 0
    # Old enough, but kept: their row still dedupes an enqueue (workers' retention only).
    kept_for_keys: int = 0
    # Old enough, but kept: their batch has not completed.
    kept_for_batches: int = 0
    batches: int = 0  # completed batches deleted (no member left)
    by_status: dict[str, int] = field(default_factory=dict)
    archiving: bool = False
    archived: list[str] = field(default_factory=list)
    stopped: bool = False  # the worker stopped or lost the lease before the end
    # Whole days of events dropped (time-partitioned history) and how long that locked the table.
    partitions: list[str] = field(default_factory=list)
    partition_lock_seconds: float = 0.0
    budget_mismatches: int = 0  # current budget windows whose usage and reservations differ

    @property
    def removed(self) -> int:
        return self.occurrences + self.events + self.reservations + self.job_events

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "cutoff": None if self.cutoff is None else iso_ms(self.cutoff),
            "dry_run": self.dry_run,
            "occurrences": self.occurrences,
            "events": self.events,
            "reservations": self.reservations,
            "job_events": self.job_events,
            "kept": self.kept,
        }
        if self.archiving:
            found["archived"] = self.archived
        return found

    def __str__(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        settled = "" if self.cutoff is None else f" settled before {iso_ms(self.cutoff)}"
        text = (
            f"{verb} {self.occurrences} occurrences{settled}, "
            f"{self.events} of their events, {self.reservations} reservations, "
            f"{self.job_events} job events"
        )
        if self.kept:
            text += f"; kept {self.kept} whose budget window is still open"
        if self.archiving:
            text += f"; archived to {len(self.archived)} files"
        return text

    def summary(self) -> str:
        """What a worker's run removed, for its log line."""
        statuses = ", ".join(f"{status} {n}" for status, n in sorted(self.by_status.items()) if n)
        days = f" ({len(self.partitions)} days of them dropped whole)" if self.partitions else ""
        text = (
            f"{self.occurrences} occurrences ({statuses or 'none'}), {self.events} events{days}, "
            f"{self.reservations} reservations, {self.job_events} job events"
        )
        if self.batches:
            text += f", {self.batches} completed batches"
        return text + (f"; archived to {len(self.archived)} files" if self.archiving else "")

    def record(self, seconds: float) -> dict[str, Any]:
        """What the lease row keeps of the run (the dashboard and the status command show it)."""
        return {
            "ok": True,
            "seconds": round(seconds, 3),
            "occurrences": self.occurrences,
            "by_status": {status: n for status, n in sorted(self.by_status.items()) if n},
            "events": self.events,
            "reservations": self.reservations,
            "job_events": self.job_events,
            "kept_open_window": self.kept,
            "kept_for_keys": self.kept_for_keys,
            "kept_for_batches": self.kept_for_batches,
            "batches": self.batches,
            "archived_files": len(self.archived),
            "archived": self.archived[:ARCHIVED_SHOWN],
            "stopped": self.stopped,
            "partitions_dropped": self.partitions,
            "partition_lock_seconds": round(self.partition_lock_seconds, 3),
            "budget_mismatches": self.budget_mismatches,
        }


# --------------------------------------------------------------------------- the engine


@dataclass
class Plan:
    """One pass of retention: what goes, how fast, and where it is archived first."""

    now: datetime
    cutoffs: dict[str, datetime | None]  # by terminal status
    job_events: datetime | None  # events of no occurrence older than this go (None: none)
    caller_keys: datetime | None  # see ``protect_keys``
    protect_keys: bool  # keep rows that dedupe an enqueue (caller keys settled after caller_keys)
    batch_size: int = DEFAULT_BATCH
    pause: float = 0.0
    dry_run: bool = False
    sink: archive.Sink | None = None
    keep_going: Callable[[], bool] = lambda: True  # False: stop before the next batch
    stopping: threading.Event = field(default_factory=threading.Event)

    def rest(self) -> bool:
        """The pause between two batches; False when the run should stop instead."""
        if self.pause and self.stopping.wait(self.pause):
            return False
        return self.keep_going()


def apply(plan: Plan, alias: str, result: PruneResult) -> PruneResult:
    """Carry out ``plan`` on database ``alias``, adding up what went in ``result``."""
    drop_partitions(plan, alias, result)
    for status, cutoff in plan.cutoffs.items():
        if cutoff is not None and not result.stopped:
            _prune_status(plan, status, cutoff, alias, result)
    if plan.job_events is not None and not result.stopped:
        _prune_job_events(plan, plan.job_events, alias, result)
    if not result.stopped:
        _prune_batches(plan, alias, result)
    return result


def _day(moment: datetime) -> tuple[datetime, datetime]:
    start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def _candidates(
    status: str, cutoff: datetime, after: tuple[datetime, str] | None, limit: int, alias: str
) -> list[tuple[str, datetime, str]]:
    """The next ``limit`` occurrences of ``status`` settled before ``cutoff``, after
    ``after`` in (settled_at, id) order, the order of the settled index: read without locks."""
    rows = Occurrence.objects.using(alias).filter(status=status, settled_at__lt=cutoff)
    if after is not None:
        rows = rows.filter(Q(settled_at__gt=after[0]) | Q(settled_at=after[0], pk__gt=after[1]))
    found = rows.order_by("settled_at", "pk").values_list("pk", "settled_at", "trigger_key")[:limit]
    return [(pk, settled_at, key) for pk, settled_at, key in found if settled_at is not None]


def _prune_status(plan: Plan, status: str, cutoff: datetime, alias: str, result: PruneResult) -> None:
    """Remove the occurrences of ``status`` settled before ``cutoff``, a chunk at a time (one
    day's at most when archiving, so that a file holds one period)."""
    chunk = CHUNK
    after: tuple[datetime, str] | None = None
    while True:
        fetched = _candidates(status, cutoff, after, chunk, alias)
        if not fetched:
            return
        day = _day(fetched[0][1])
        rows = [row for row in fetched if row[1] < day[1]] if plan.sink is not None else fetched
        after = (rows[-1][1], rows[-1][0])
        doomed = _doomed(plan, rows, alias, result)
        if plan.dry_run:
            _count(doomed, status, alias, result)
        elif doomed:
            _remove(plan, (status, cutoff), day, doomed, alias, result)
        if result.stopped or (len(fetched) < chunk and len(rows) == len(fetched)):
            return
        # A chunk of kept rows only needs no pause, but the lease must still hold.
        if not plan.dry_run and not (plan.rest() if doomed else plan.keep_going()):
            result.stopped = True
            return


def _doomed(plan: Plan, rows: list[tuple[str, datetime, str]], alias: str, result: PruneResult) -> list[str]:
    """The ids among ``rows`` that go: not kept for an open budget window, nor for a key."""
    ids = [pk for pk, _, _ in rows]
    keep = _kept_for_window(ids, plan.now, alias)
    result.kept += len(keep)
    waiting = _kept_for_batch(ids, alias) - keep
    result.kept_for_batches += len(waiting)
    keep |= waiting
    if plan.protect_keys:
        protected = _dedupe_kept(plan, rows, alias) - keep
        result.kept_for_keys += len(protected)
        keep |= protected
    return [pk for pk in ids if pk not in keep]


UNFINISHED = (BatchStatus.OPEN, BatchStatus.CLOSED)


def _kept_for_batch(ids: list[str], alias: str) -> set[str]:
    """The occurrences among ``ids`` whose batch has not completed: its completion counts
    them (a batch without members left completes with what remains)."""
    if not Batch.objects.using(alias).filter(status__in=UNFINISHED).exists():
        return set()
    return {
        pk
        for part in _slices(ids)
        for pk in Occurrence.objects.using(alias)
        .filter(pk__in=part, batch__status__in=UNFINISHED)
        .values_list("pk", flat=True)
    }


def _prune_batches(plan: Plan, alias: str, result: PruneResult) -> None:
    """Delete the completed batches none of whose members is left, once they completed
    before the longest of the status cutoffs (their members went by then, or are kept)."""
    ages = [cutoff for cutoff in plan.cutoffs.values() if cutoff is not None]
    if not ages or len(ages) < len(plan.cutoffs):
        return  # some status is kept forever: its members, and their batches, stay
    done = Batch.objects.using(alias).filter(status=BatchStatus.COMPLETED, completed_at__lt=min(ages))
    gone = done.exclude(Exists(Occurrence.objects.using(alias).filter(batch_id=OuterRef("pk"))))
    if plan.dry_run:
        result.batches += gone.count()
        return
    while not result.stopped:
        ids = list(gone.values_list("pk", flat=True)[: plan.batch_size])
        if not ids:
            return
        with dialect.write_transaction(alias):
            result.batches += Batch.objects.using(alias).filter(pk__in=ids).delete()[0]
        if len(ids) < plan.batch_size or not plan.rest():
            return


def _dedupe_kept(plan: Plan, rows: list[tuple[str, datetime, str]], alias: str) -> set[str]:
    """The rows whose identity still dedupes an enqueue, so that deleting them could fire
    something twice: a key the caller chose (they may enqueue it again) unless settled before
    ``plan.caller_keys``, and a dead letter's retry while that dead letter is kept (retrying
    it again must find the same retry)."""
    kept = {
        pk
        for pk, settled_at, key in rows
        if not key.startswith(OWN_KEY_PREFIXES)
        and (plan.caller_keys is None or settled_at >= plan.caller_keys)
    }
    retries = {key[len(RETRY_PREFIX) :]: pk for pk, _, key in rows if key.startswith(RETRY_PREFIX)}
    if retries:
        alive = Occurrence.objects.using(alias).filter(pk__in=list(retries)).values_list("pk", flat=True)
        kept.update(retries[dead] for dead in alive)
    return kept


def _count(doomed: list[str], status: str, alias: str, result: PruneResult) -> None:
    """A dry run's tally of what ``doomed`` would take with it."""
    for part in _slices(doomed):
        result.events += Event.objects.using(alias).filter(occurrence_id__in=part).count()
        result.reservations += (
            AuthorityReservation.objects.using(alias).filter(occurrence_id__in=part).count()
        )
    result.occurrences += len(doomed)
    result.by_status[status] = result.by_status.get(status, 0) + len(doomed)


def _rows(model: type[Model], column: str, ids: list[Any], alias: str) -> Iterator[Model]:
    """The rows of ``model`` whose ``column`` is one of ``ids``, a query per slice of ids."""
    for part in _slices(ids):
        yield from model._default_manager.using(alias).filter(**{f"{column}__in": part}).order_by("pk")


def _any(model: type[Model], doomed: list[str], alias: str) -> bool:
    """Whether any row of ``model`` belongs to one of the ``doomed`` occurrences."""
    rows = model._default_manager.using(alias)
    return any(rows.filter(occurrence_id__in=part).exists() for part in _slices(doomed))


def _archive(
    sink: archive.Sink, day: tuple[datetime, datetime], doomed: list[str], alias: str, result: PruneResult
) -> int:
    """Write ``doomed`` with their reservations and events to the archive (each file verified);
    returns the highest event id written: events added later keep their occurrence for now."""
    result.archived.append(sink.write(Occurrence, day, _rows(Occurrence, "pk", doomed, alias)))
    if _any(AuthorityReservation, doomed, alias):
        result.archived.append(
            sink.write(AuthorityReservation, day, _rows(AuthorityReservation, "occurrence_id", doomed, alias))
        )
    if not _any(Event, doomed, alias):
        return 0
    highest = 0

    def events() -> Iterator[Model]:
        nonlocal highest
        for event in _rows(Event, "occurrence_id", doomed, alias):
            highest = max(highest, event.pk)
            yield event

    result.archived.append(sink.write(Event, day, events()))
    return highest


def _remove(
    plan: Plan,
    rule: tuple[str, datetime],
    day: tuple[datetime, datetime],
    doomed: list[str],
    alias: str,
    result: PruneResult,
) -> None:
    """Archive ``doomed`` (when there is an archive), then delete them in batches."""
    highest = None if plan.sink is None else _archive(plan.sink, day, doomed, alias, result)
    for start in range(0, len(doomed), plan.batch_size):
        if start and not plan.rest():
            result.stopped = True
            return
        _delete_batch(rule, doomed[start : start + plan.batch_size], highest, alias, result)


def _delete_batch(
    rule: tuple[str, datetime], batch: list[str], highest_event: int | None, alias: str, result: PruneResult
) -> None:
    """Delete one batch in its own transaction: the rows that still match ``rule`` (status,
    settled before), locked (skipping rows someone else holds), children first."""
    status, cutoff = rule
    with transaction.atomic(using=alias):
        dialect.take_write_lock(connections[alias])
        # Terminal rows do not change, but an admin action could take one back: lock and
        # check them again while they go.
        still = Occurrence.objects.using(alias).filter(pk__in=batch, status=status, settled_at__lt=cutoff)
        ids = list(dialect.lock_rows(still, alias).order_by("pk").values_list("pk", flat=True))
        if highest_event is not None and ids:
            late = Event.objects.using(alias).filter(occurrence_id__in=ids, event_id__gt=highest_event)
            unarchived = set(late.values_list("occurrence_id", flat=True))
            ids = [pk for pk in ids if pk not in unarchived]
        # Children first (they PROTECT their occurrence); nothing else points at these rows.
        result.events += dialect.delete_rows(alias, Event, "occurrence", ids)
        result.reservations += dialect.delete_rows(alias, AuthorityReservation, "occurrence", ids)
        deleted = dialect.delete_rows(alias, Occurrence, "occurrence_id", ids)
    result.occurrences += deleted
    result.by_status[status] = result.by_status.get(status, 0) + deleted


def _prune_job_events(plan: Plan, cutoff: datetime, alias: str, result: PruneResult) -> None:
    """Remove events of no occurrence older than ``cutoff``, in chunks (archived first) and
    batches, oldest id first."""
    old = Event.objects.using(alias).filter(occurrence__isnull=True, occurred_at__lt=cutoff)
    if plan.dry_run:
        result.job_events += old.count()
        return
    chunk = CHUNK
    cursor = 0
    first = True
    while True:
        rows = list(old.filter(pk__gt=cursor).order_by("pk").values_list("pk", "occurred_at")[:chunk])
        if not rows:
            return
        cursor = rows[-1][0]
        ids = [pk for pk, _ in rows]
        if plan.sink is not None:
            period = (_day(min(t for _, t in rows))[0], _day(max(t for _, t in rows))[1])
            result.archived.append(plan.sink.write(Event, period, _rows(Event, "pk", ids, alias)))
        for start in range(0, len(ids), plan.batch_size):
            if not first and not plan.rest():
                result.stopped = True
                return
            first = False
            with transaction.atomic(using=alias):
                dialect.take_write_lock(connections[alias])
                result.job_events += dialect.delete_rows(
                    alias, Event, "event_id", ids[start : start + plan.batch_size]
                )
        if len(rows) < chunk:
            return


# ----------------------------------------------------------- partitions (merge point)


def youngest_cutoff(plan: Plan) -> datetime | None:
    """The latest of the plan's cutoffs: history older than it may go whole, but for the
    events of ``kept_occurrences``."""
    found = [cutoff for cutoff in plan.cutoffs.values() if cutoff is not None]
    return max(found) if found else None


def keep_job_events(plan: Plan) -> bool:
    """Whether a drop before the youngest cutoff must keep the events of no occurrence."""
    youngest = youngest_cutoff(plan)
    return plan.job_events is None or youngest is None or plan.job_events < youngest


def _kept_with_keys(plan: Plan, alias: str) -> QuerySet[Occurrence]:
    """``kept_occurrences``, plus the rows the workers keep because they still dedupe an
    enqueue (a superset of ``_dedupe_kept``'s: every ``retry:`` row), whose events must stay
    with them."""
    kept = kept_occurrences(alias, plan.now, plan.cutoffs)
    if not plan.protect_keys:
        return kept
    own = Q()
    for prefix in OWN_KEY_PREFIXES:
        if prefix != RETRY_PREFIX:
            own |= Q(trigger_key__startswith=prefix)
    keyed = ~own  # the caller's keys, and the retries of dead letters
    if plan.caller_keys is not None:
        keyed = (keyed & ~Q(settled_at__lt=plan.caller_keys)) | Q(trigger_key__startswith=RETRY_PREFIX)
    return kept | Occurrence.objects.using(alias).filter(keyed)


def drop_partitions(plan: Plan, alias: str, result: PruneResult) -> None:
    """Where history is partitioned by time (the events, on PostgreSQL), the days entirely
    before the youngest cutoff go whole, before the batched deletes (which then find only the
    events the drop kept back). The events of what stays are copied out first; with an archive,
    the rest is written to it before anything is dropped."""
    youngest = youngest_cutoff(plan)
    if plan.dry_run or youngest is None or not partitions.is_partitioned(alias):
        return
    dropped = partitions.drop_before(
        alias,
        youngest,
        kept=_kept_with_keys(plan, alias),
        keep_job_events=keep_job_events(plan),
        archive=plan.sink,
    )
    result.events += dropped.rows
    result.partitions += dropped.partitions
    result.partition_lock_seconds += dropped.lock_seconds


# --------------------------------------------------------------------------- by hand


def prune(
    older_than: timedelta,
    *,
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    include_job_events: bool = False,
    using: str | None = None,
) -> PruneResult:
    """Delete terminal occurrences settled more than ``older_than`` ago, with their events
    and reservations, in batches of ``batch_size`` (each its own short transaction), archived
    first when ``DURABLE_SCHEDULER_ARCHIVE`` is set.

    Jobs are never deleted, so each job's ``last_slot_at`` keeps refusing the slots whose
    occurrences are gone: pruning cannot make a slot fire twice. Explicit trigger keys have
    no such guard here (the workers' retention keeps them, see ``caller_keys``): once pruned,
    ``enqueue``/``enqueue_once_per_trigger`` with the same key create a new occurrence, so keep
    keys you dedupe on longer than the prune age. With ``include_job_events``, events not tied
    to an occurrence older than the age go too. ``dry_run`` counts and writes nothing.
    """
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH}")
    alias = dialect.alias_for(using)
    now = conf.now()
    cutoff = now - older_than
    plan = Plan(
        now=now,
        cutoffs={str(status): cutoff for status in TERMINAL_STATUSES},
        job_events=cutoff if include_job_events else None,
        caller_keys=cutoff,
        protect_keys=False,
        batch_size=batch_size,
        dry_run=dry_run,
        sink=None if dry_run else archive.sink(alias),
    )
    return apply(plan, alias, PruneResult(cutoff=cutoff, dry_run=dry_run, archiving=plan.sink is not None))


# --------------------------------------------------------------------------- in the workers


def _worker_plan(
    settings: conf.Retention, now: datetime, alias: str, held: maintenance.Held, stopping: threading.Event
) -> Plan:
    lease = timedelta(seconds=settings.lease)
    caller_age = settings.ages["caller_keys"]
    job_events_age = settings.ages["job_events"]
    return Plan(
        now=now,
        cutoffs=cutoffs(now, settings),
        job_events=None if job_events_age is None else now - job_events_age,
        caller_keys=None if caller_age is None else now - caller_age,
        protect_keys=True,
        batch_size=settings.batch_size,
        pause=settings.pause,
        sink=archive.sink(alias),
        keep_going=lambda: not stopping.is_set() and held.renew(conf.now(), lease),
        stopping=stopping,
    )


def _audit_budgets(alias: str, result: PruneResult) -> None:
    """Recount the current budget windows (claims trust the usage rows without counting), one
    worker at a time like the rest of this run; a mismatch is marked, so its claims are refused."""
    for check in budgets.audit_budgets(using=alias):
        if not check.matches:
            result.budget_mismatches += 1
            logger.warning("budget usage does not match its reservations: %s", check.describe())


def run_once(
    worker_id: str, *, using: str | None = None, stopping: threading.Event | None = None
) -> PruneResult | None:
    """One retention run by worker ``worker_id``, if retention is on and this worker takes the
    lease (nobody holds it and the period has passed); None otherwise. Logs what it removed
    (INFO) or why it failed (WARNING: the next period tries again), and records either on the
    lease row."""
    settings = conf.settings.RETENTION
    if settings is None:
        return None
    alias = dialect.alias_for(using)
    now = conf.now()
    period = timedelta(seconds=settings.period)
    held = maintenance.take(
        LEASE_NAME, worker_id, now=now, lease=timedelta(seconds=settings.lease), period=period, alias=alias
    )
    if held is None:
        return None
    started = time.monotonic()
    plan = _worker_plan(settings, now, alias, held, stopping or threading.Event())
    result = PruneResult(cutoff=None, dry_run=False, archiving=plan.sink is not None)
    try:
        apply(plan, alias, result)
        _audit_budgets(alias, result)
    except Exception as exc:
        record = {**result.record(time.monotonic() - started), "ok": False, "error": _one_line(exc)}
        logger.warning(
            "retention by %s failed after removing %s: %s; nothing of the failed chunk was deleted, "
            "the next run (in %g s) tries again",
            worker_id,
            result.summary(),
            _one_line(exc),
            settings.period,
        )
        held.release(conf.now(), record)
        return None
    seconds = time.monotonic() - started
    if not held.release(conf.now(), result.record(seconds)):
        logger.warning(
            "retention by %s lost its lease before the end; another worker took it over", worker_id
        )
    if result.removed:
        logger.info("retention by %s removed %s in %.2f s", worker_id, result.summary(), seconds)
    return result


class RetentionThread:
    """The ``dsch-retention`` thread of a worker: looks every ``min(period, CHECK_EVERY)``
    seconds (the first time after a random part of that, so restarted workers spread out)
    whether a retention run is due, and runs it when this worker gets the lease. Where history
    is partitioned by time it also makes the coming days' partitions, retention on or off
    (every worker may: making one that exists is nothing)."""

    def __init__(self, worker_id: str, using: str | None = None) -> None:
        self.worker_id = worker_id
        self.using = using
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._ahead_at: float | None = None  # monotonic time of the last partitions.ensure_ahead

    def start(self) -> None:
        settings = conf.settings.RETENTION
        if settings is None:
            logger.info("retention off (DURABLE_SCHEDULER_RETENTION = None)")
        every = CHECK_EVERY if settings is None else min(settings.period, CHECK_EVERY)
        self._thread = threading.Thread(target=self._run, args=(every,), name="dsch-retention", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current batch (the lease is released with what was done)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, every: float) -> None:
        self._partitions_ahead()
        wait = every * random.uniform(0.5, 1.0)
        while not self._stopping.wait(wait):
            wait = every
            self._partitions_ahead()
            if conf.settings.RETENTION is None:
                continue
            try:
                run_once(self.worker_id, using=self.using, stopping=self._stopping)
            except Exception as exc:
                # The lease could not be read or taken (the database is away): next time.
                logger.warning("retention could not start: %s; trying again in %g s", _one_line(exc), every)
            finally:
                # This thread's own connection: not kept open between runs minutes apart.
                connections.close_all()

    def _partitions_ahead(self) -> None:
        """Make the coming days' partitions, at most once per ``AHEAD_EVERY``; a failure (locks
        not had, the database away) is tried again at the next look."""
        if self._ahead_at is not None and time.monotonic() - self._ahead_at < AHEAD_EVERY:
            return
        alias = dialect.alias_for(self.using)
        try:
            made = partitions.ensure_ahead(alias, conf.now())
        except Exception as exc:
            logger.warning(
                "could not make the coming days' event partitions: %s; trying again", _one_line(exc)
            )
            return
        finally:
            connections.close_all()
        self._ahead_at = time.monotonic()
        if made:
            logger.info("made event partitions %s", ", ".join(made))


# --------------------------------------------------------------------------- the last run


@dataclass
class LastRun:
    """The last retention run, as the dashboard and ``scheduler_status`` show it."""

    enabled: bool
    owner: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    running: bool = False
    result: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "worker": self.owner,
            "started_at": None if self.started_at is None else iso_ms(self.started_at),
            "finished_at": None if self.finished_at is None else iso_ms(self.finished_at),
            "running": self.running,
            "result": self.result,
        }

    def describe(self) -> str:
        """One line for people."""
        if self.started_at is None:
            return "not run yet" if self.enabled else "off"
        text = f"last run {iso_ms(self.started_at)} by {self.owner}"
        result = self.result or {}
        if self.running:
            text += " (running)"
        elif not result.get("ok", False):
            text += f": failed: {result.get('error', 'did not finish')}"
        else:
            by_status = ", ".join(f"{s} {n}" for s, n in (result.get("by_status") or {}).items())
            text += (
                f" ({result.get('seconds', 0):g} s): removed {result.get('occurrences', 0)} occurrences"
                f"{f' ({by_status})' if by_status else ''}, {result.get('events', 0)} events, "
                f"{result.get('reservations', 0)} reservations, {result.get('job_events', 0)} job events"
            )
            if result.get("archived_files"):
                text += f"; archived to {result['archived_files']} files"
        return text if self.enabled else f"off; {text}"


def last_run(alias: str, now: datetime) -> LastRun:
    """The last retention run recorded on database ``alias``."""
    enabled = conf.settings.raw("RETENTION") is not None
    row = maintenance.last_run(LEASE_NAME, alias)
    if row is None:
        return LastRun(enabled)
    running = row.expires_at is not None and row.expires_at > now
    result = row.last_result if isinstance(row.last_result, dict) else None
    return LastRun(enabled, row.owner, row.last_started_at, row.last_finished_at, running, result)
