"""One pass of retention: which rows it deletes, in which chunks and batches, and what it did.

Deleting is throttled so that claiming never waits on it: candidates are read without locks,
each batch is its own short transaction that locks only its rows (skipping rows others hold),
with a pause between batches. With an archive (:mod:`..archive`), each chunk of up to
``CHUNK`` occurrences of one day is written and verified before its batches go. Where history
is partitioned by time, whole days go first (:mod:`..partitions`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, Model, OuterRef, Q

from ... import conf
from ...db import dialect
from ...models import (
    TERMINAL_STATUSES,
    AuthorityReservation,
    Batch,
    BatchStatus,
    Event,
    Occurrence,
    UniqueCall,
)
from ...rules.validation import iso_ms
from .. import archive, partitions
from .rules import (
    dedupe_kept,
    keep_job_events,
    kept_for_batch,
    kept_for_window,
    kept_occurrences,
    kept_with_keys,
    slices,
    youngest_cutoff,
)

DEFAULT_BATCH = 500
MAX_BATCH = 10_000
# Candidates read per query, and occurrences per archive file (their events and
# reservations go in files of their own); deleted in batches of the setting's batch_size.
CHUNK = 10_000
ARCHIVED_SHOWN = 50  # archive file names a run records (the count is always exact)


@dataclass
class PruneResult:
    cutoff: datetime | None  # the one age of a manual prune (None: the setting's ages)
    dry_run: bool
    occurrences: int = 0
    events: int = 0
    reservations: int = 0
    job_events: int = 0
    unique_calls: int = 0  # the records of the keyed enqueues of the occurrences deleted
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
            "unique_calls": self.unique_calls,
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
    keep = kept_for_window(ids, plan.now, alias)
    result.kept += len(keep)
    waiting = kept_for_batch(ids, alias) - keep
    result.kept_for_batches += len(waiting)
    keep |= waiting
    if plan.protect_keys:
        protected = dedupe_kept(rows, plan.caller_keys, alias) - keep
        result.kept_for_keys += len(protected)
        keep |= protected
    return [pk for pk in ids if pk not in keep]


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


def _count(doomed: list[str], status: str, alias: str, result: PruneResult) -> None:
    """A dry run's tally of what ``doomed`` would take with it."""
    for part in slices(doomed):
        result.events += Event.objects.using(alias).filter(occurrence_id__in=part).count()
        result.reservations += (
            AuthorityReservation.objects.using(alias).filter(occurrence_id__in=part).count()
        )
        result.unique_calls += UniqueCall.objects.using(alias).filter(occurrence_id__in=part).count()
    result.occurrences += len(doomed)
    result.by_status[status] = result.by_status.get(status, 0) + len(doomed)


def _rows(model: type[Model], column: str, ids: list[Any], alias: str) -> Iterator[Model]:
    """The rows of ``model`` whose ``column`` is one of ``ids``, a query per slice of ids."""
    for part in slices(ids):
        yield from model._default_manager.using(alias).filter(**{f"{column}__in": part}).order_by("pk")


def _any(model: type[Model], doomed: list[str], alias: str) -> bool:
    """Whether any row of ``model`` belongs to one of the ``doomed`` occurrences."""
    rows = model._default_manager.using(alias)
    return any(rows.filter(occurrence_id__in=part).exists() for part in slices(doomed))


def _archive(
    sink: archive.Sink, day: tuple[datetime, datetime], doomed: list[str], alias: str, result: PruneResult
) -> int:
    """Write ``doomed`` with their reservations and events to the archive (each file verified);
    returns the highest event id written: events added later keep their occurrence for now.
    Their keyed enqueues' records are not history (each debounce is an event, with its call's
    trigger key): they go unarchived."""
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
        result.unique_calls += dialect.delete_rows(alias, UniqueCall, "occurrence", ids)
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


def drop_partitions(plan: Plan, alias: str, result: PruneResult) -> None:
    """Where history is partitioned by time (the events, on PostgreSQL), the days entirely
    before the youngest cutoff go whole, before the batched deletes (which then find only the
    events the drop kept back). The events of what stays are copied out first; with an archive,
    the rest is written to it before anything is dropped."""
    youngest = youngest_cutoff(plan.cutoffs)
    if plan.dry_run or youngest is None or not partitions.is_partitioned(alias):
        return
    if plan.protect_keys:
        kept = kept_with_keys(alias, plan.now, plan.cutoffs, plan.caller_keys)
    else:
        kept = kept_occurrences(alias, plan.now, plan.cutoffs)
    dropped = partitions.drop_before(
        alias,
        youngest,
        kept=kept,
        keep_job_events=keep_job_events(plan.cutoffs, plan.job_events),
        archive=plan.sink,
    )
    result.events += dropped.rows
    result.partitions += dropped.partitions
    result.partition_lock_seconds += dropped.lock_seconds


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
