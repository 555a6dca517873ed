"""Enqueue: entering occurrences (one, many, once per trigger, the retry of a dead letter),
making pending ones due now and withdrawing them (cancel). Part of the kernel, the only
writer of occurrence state; each change is a transition of ``lifecycle.TRANSITIONS``.

An occurrence's identity is derived from its job's revision, its slot and trigger key
(``identity.py``), so enqueueing the same slot twice finds the first occurrence instead of
writing a second. Every occurrence is built as a model instance (its other columns take the
model's defaults) and written by ``dialect.insert`` or one of ``guarded``'s inserts, whose
column lists come from the model: a field added to ``Occurrence`` needs no edit here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections

from .. import conf
from ..db import dialect, guarded
from ..db.wakeup import notify_new_work
from ..exceptions import DataCorrupt, InvalidArgument, InvalidState, JobDisabled, NotFound
from ..models import Batch, BatchStatus, Job, Occurrence
from ..rules.chains import EDGES, normalize_specs
from ..rules.identity import canonical_json, normalize_json
from ..rules.lifecycle import Action, check, event_of
from ..rules.validation import iso_ms, key_label, normalize_identifier, normalize_int, to_ms
from ..telemetry import tracing
from ..telemetry.metrics import count_enqueued
from . import batches
from .cancelling import cancel_reason
from .chaining import check_jobs_exist
from .events import new_event
from .inserting import JOB_PAYLOAD, Builder, Enqueued, found, insert_occurrence, payload_mismatch
from .jobs import get_job
from .transitions import writes
from .unique import UniqueRequest, answered, find_live, lock_job, payload_digest, record, unique_request
from .unique import debounce as debounce_waiting
from .writing import writing

MIN_PRIORITY, MAX_PRIORITY = -100, 100
_ITEM_KEYS = frozenset({"scheduled_for", "trigger_key", "available_at", "payload"})


def _enqueue_args(
    job_id: Any, scheduled_for: Any, trigger_key: Any, available_at: Any
) -> tuple[str, int, str, int]:
    return (normalize_identifier(job_id, "job_id"), *_slot_args(scheduled_for, trigger_key, available_at))


def _slot_args(scheduled_for: Any, trigger_key: Any, available_at: Any) -> tuple[int, str, int]:
    scheduled_ms = to_ms(scheduled_for, "scheduled_for")
    key = normalize_identifier(trigger_key, "trigger_key")
    available_ms = scheduled_ms if available_at is None else to_ms(available_at, "available_at")
    return scheduled_ms, key, available_ms


# The job columns an enqueued occurrence copies (its identity comes from the revision): an
# enqueue from a remembered job inserts only while the stored row still has these values,
# so it writes exactly what reading the job first would have written. The kind and the key
# templates are among them: the concurrency and throttle keys are computed from them, and a job deleted and
# made again starts at the same revision.
_JOB_GUARD = (
    "revision",
    "enabled",
    "max_attempts",
    "authority",
    "kind",
    "concurrency_key",
    "throttle",
    *EDGES,
)


class _Remembered:
    """A job row this process read, the guards that check it is unchanged, and the builder
    of its occurrences."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.guards: dict[bool, tuple[str, list[Any]]] = {}
        self.builder = Builder(job)

    def guard(self, alias: str, *, default_payload: bool) -> tuple[str, list[Any]]:
        guard = self.guards.get(default_payload)
        if guard is None:
            names = (*_JOB_GUARD, "payload") if default_payload else _JOB_GUARD
            guard = self.guards[default_payload] = guarded.guard_for(alias, self.job, names)
        return guard


_REMEMBERED: dict[tuple[str, str], _Remembered] = {}
_REMEMBERED_MAX = 1024


def _remember(alias: str, job: Job) -> None:
    if guarded.supports_guarded_insert(alias):
        if len(_REMEMBERED) >= _REMEMBERED_MAX:
            _REMEMBERED.clear()
        _REMEMBERED[(alias, job.job_id)] = _Remembered(job)


def enqueue(
    job_id: str,
    *,
    scheduled_for: datetime | int,
    trigger_key: str,
    available_at: datetime | int | None = None,
    payload: Any = JOB_PAYLOAD,
    priority: int = 0,
    unique_key: str | None = None,
    unique_while: str | None = None,
    debounce: float | timedelta | None = None,
    debounce_max_wait: float | timedelta | None = None,
    then: Any = None,
    on_dead_letter: Any = None,
    batch: str | None = None,
    using: str | None = None,
) -> Enqueued:
    """Insert an occurrence, or return the existing one with the same identity.

    Returns an :class:`Enqueued`, the named tuple ``(occurrence, deduplicated)``. The identity
    is derived from the job's current revision, ``scheduled_for`` and ``trigger_key``; reusing
    it with another payload raises ``SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH``. ``priority``
    (-100..100): higher first among its principal's due occurrences (not in the identity).

    ``unique_key`` (per job): if an occurrence of the job with that key is waiting (queued
    or retry_wait; with ``unique_while="active"`` also running), return it instead of adding
    one. With ``debounce`` (seconds or timedelta, >= 0) give the waiting one this payload
    and move its start to ``debounce`` from now (never earlier), or add one due then; never
    past the first call plus ``debounce_max_wait`` (>= ``debounce``), when given. The call's
    identity still comes first: the same call again (same slot, trigger key and payload)
    returns the occurrence it returned the first time, untouched, whatever its status now;
    with another payload it raises ``SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH``.

    ``then`` / ``on_dead_letter``: the follow-ups enqueued when it succeeds / is
    dead-lettered, after its job's own (a job id, a dict ``{"job_id", "payload"?, "then"?,
    "on_dead_letter"?}``, or a list of them; see ``chains``). ``batch``: the id of an open
    batch it joins (``batches``). Neither combines with ``unique_key``.

    On PostgreSQL and SQLite, a job this process has enqueued before is not read again: the
    insert is guarded to happen only while the job row still holds what it copies (on
    PostgreSQL one statement, with its event and wake-up).
    """
    job_id, scheduled_ms, key, available_ms = _enqueue_args(job_id, scheduled_for, trigger_key, available_at)
    priority = normalize_int(priority, "priority", minimum=MIN_PRIORITY, maximum=MAX_PRIORITY)
    unique = unique_request(unique_key, unique_while, debounce, available_at, debounce_max_wait)
    follow_ups = _follow_ups(then, on_dead_letter)
    if unique is not None and (follow_ups is not None or batch is not None):
        raise InvalidArgument("unique_key", "cannot be combined with then, on_dead_letter or batch")
    now = conf.now()
    alias = dialect.alias_for(using)
    args: dict[str, Any] = {
        "scheduled_ms": scheduled_ms,
        "trigger_key": key,
        "available_ms": available_ms,
        "payload": payload,
        "now": now,
        "alias": alias,
        "priority": priority,
        "trace_context": tracing.capture(),
    }
    if unique is not None:
        return _enqueue_unique(job_id, unique, args)
    if follow_ups is not None or batch is not None:
        return _enqueue_linked(job_id, follow_ups, batch, args)
    remembered = _REMEMBERED.get((alias, job_id))
    if remembered is not None and remembered.job.enabled:
        guard = remembered.guard(alias, default_payload=payload is JOB_PAYLOAD)
        try:
            if connections[alias].vendor == "postgresql":
                return insert_occurrence(remembered.job, guard=guard, builder=remembered.builder, **args)
            with dialect.write_transaction(alias):
                return insert_occurrence(remembered.job, guard=guard, builder=remembered.builder, **args)
        except (guarded.GuardFailed, InvalidArgument):
            # A job changed since: also one whose old key template cannot key this payload
            # (nothing is written before the key is computed). The current row decides.
            _REMEMBERED.pop((alias, job_id), None)
    with dialect.write_transaction(alias):
        job = get_job(job_id, using=alias)
        _remember(alias, job)
        return insert_occurrence(job, **args)


def _follow_ups(then: Any, on_dead_letter: Any) -> dict[str, Any] | None:
    """An enqueue's own follow-ups, as stored (None: it names none)."""
    specs = {
        "then": normalize_specs(then, "then"),
        "on_dead_letter": normalize_specs(on_dead_letter, "on_dead_letter"),
    }
    return {edge: value for edge, value in specs.items() if value} or None


def _enqueue_linked(
    job_id: str, follow_ups: dict[str, Any] | None, batch_id: str | None, args: dict[str, Any]
) -> Enqueued:
    """``enqueue`` with follow-ups or into a batch: the jobs the chain names checked, the
    batch locked open while the member joins it."""
    alias = args["alias"]
    with dialect.write_transaction(alias):
        job = get_job(job_id, using=alias)
        check_jobs_exist(follow_ups, alias)
        joined = None if batch_id is None else batches.join(batch_id, alias)
        links = None if joined is None else {"batch_id": joined.batch_id}
        occurrence, deduplicated = insert_occurrence(job, follow_ups=follow_ups, links=links, **args)
        if joined is not None:
            if deduplicated:
                batches.not_a_member_elsewhere(occurrence, joined)
            else:
                batches.grew(joined, 1, alias)
        return Enqueued(occurrence, deduplicated)


def _enqueue_unique(job_id: str, unique: UniqueRequest, args: dict[str, Any]) -> Enqueued:
    """``enqueue`` with a unique key, under the job's unique lock: every unique or debounced
    enqueue of the job waits for the one before it to commit, so the one that looks for its own
    record or a live occurrence of its key sees every other's (the only writers of both)."""
    alias, now = args["alias"], args["now"]
    with dialect.write_transaction(alias):
        # Locked before the first read: MySQL/MariaDB under repeatable read fix a transaction's
        # snapshot at its first read, which then sees what the lock's last holder committed.
        lock_job(job_id, now, alias)
        job = get_job(job_id, using=alias)
        if not job.enabled:
            raise JobDisabled(f"job {job_id!r} is disabled", {"job_id": job_id})
        if unique.debounce_ms is not None:
            args["available_ms"] = to_ms(unique.start(now), "available_at")
        payload = args["payload"]
        if payload is not JOB_PAYLOAD:
            args["payload"] = payload = normalize_json(payload, "payload")
        build = Builder(job)
        wanted = build.occurrence(
            args["scheduled_ms"], args["trigger_key"], args["available_ms"], payload, now
        )
        # The same call again is answered as it was, whatever its occurrence became since.
        digest = payload_digest(wanted.payload)
        earlier = answered(job, wanted, digest, alias)
        if earlier is not None:
            return Enqueued(earlier, True)
        # Then the slot's identity, as without a key: a slot a plain enqueue stored.
        if Occurrence.objects.using(alias).filter(idempotency_key=wanted.idempotency_key).exists():
            return found(job, wanted, alias)
        live = find_live(job.job_id, unique, alias)
        if live is None:
            occurrence, deduplicated = insert_occurrence(job, builder=build, unique_key=unique.key, **args)
        else:
            if unique.debounce_ms is not None:
                debounce_waiting(live, unique, wanted.payload, wanted.trigger_key, now, alias)
            occurrence, deduplicated = live, True
        record(wanted, occurrence, digest, now, alias)
        return Enqueued(occurrence, deduplicated)


def enqueue_many(
    job_id: str,
    items: Iterable[dict[str, Any]],
    *,
    then: Any = None,
    on_dead_letter: Any = None,
    batch: str | None = None,
    using: str | None = None,
) -> list[Enqueued]:
    """Enqueue many occurrences of one job in one transaction (bulk insert).

    Each item is a dict with ``scheduled_for``, ``trigger_key`` and optionally
    ``available_at`` and ``payload``; the result is ``(occurrence, deduplicated)`` per item,
    in order, with the same dedupe and payload-mismatch rules as :func:`enqueue`.
    ``then``, ``on_dead_letter`` and ``batch``: as :func:`enqueue`'s, for every item.
    """
    follow_ups = _follow_ups(then, on_dead_letter)
    job_id = normalize_identifier(job_id, "job_id")
    parsed = _parse_items(items)
    now = conf.now()
    trace_context = tracing.capture()
    with dialect.write_transaction(using) as alias:
        job = get_job(job_id, using=alias)
        if not job.enabled:
            raise JobDisabled(f"job {job_id!r} is disabled", {"job_id": job_id})
        check_jobs_exist(follow_ups, alias)
        joined = None if batch is None else batches.join(batch, alias)
        links: dict[str, Any] = {} if joined is None else {"batch_id": joined.batch_id}
        build = Builder(job)
        rows = [build.occurrence(*item, now, 0, trace_context, None, follow_ups, **links) for item in parsed]
        fresh, firsts = _split_fresh(job, rows)
        if dialect.can_skip_conflicts(alias):
            inserted = guarded.insert_new(alias, _in_key_order(fresh))
            present = _present(alias, [pk for pk in fresh if pk not in inserted])
            if len(present) + len(inserted) != len(fresh):
                raise IntegrityError("occurrences were neither inserted nor found")
        else:
            # MySQL/MariaDB: no insert that skips only duplicates; the job's rows are not
            # locked, so a racing enqueue of the same identity fails this one loudly.
            present = _present(alias, list(fresh))
            inserted = {pk for pk in fresh if pk not in present}
            dialect.insert(alias, [row for row in _in_key_order(fresh) if row.pk in inserted])
        results = _judge_present(job, rows, firsts, present)
        new = [row for row in _in_key_order(fresh) if row.pk in inserted]
        if joined is not None:
            for prior in present.values():
                batches.not_a_member_elsewhere(prior, joined)
            batches.grew(joined, len(new), alias)
        dialect.insert(alias, [build.event(row) for row in new])
        if new:
            notify_new_work(alias)
            count_enqueued(job.kind, job.authority, len(new))
    return results


def _parse_items(items: Any) -> list[tuple[int, str, int, Any]]:
    """``enqueue_many``'s items as (scheduled ms, trigger key, available ms, payload)."""
    if isinstance(items, dict | str) or not isinstance(items, Iterable):
        raise InvalidArgument("items", "must be a list of dicts")
    parsed: list[tuple[int, str, int, Any]] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidArgument(f"items[{index}]", "must be a dict")
        unknown = sorted(key_label(key) for key in item if key not in _ITEM_KEYS)
        if unknown:
            raise InvalidArgument(f"items[{index}].{unknown[0]}", "is not an enqueue argument")
        scheduled_ms, key, available_ms = _slot_args(
            item.get("scheduled_for"), item.get("trigger_key"), item.get("available_at")
        )
        payload = (
            normalize_json(item["payload"], f"items[{index}].payload") if "payload" in item else JOB_PAYLOAD
        )
        parsed.append((scheduled_ms, key, available_ms, payload))
    return parsed


def _present(alias: str, ids: list[str]) -> dict[str, Occurrence]:
    """The stored occurrences among ``ids``, read 500 keys per query."""
    present: dict[str, Occurrence] = {}
    for start in range(0, len(ids), 500):
        present.update(Occurrence.objects.using(alias).in_bulk(ids[start : start + 500]))
    return present


def _split_fresh(job: Job, rows: list[Occurrence]) -> tuple[dict[str, Occurrence], list[Occurrence]]:
    """The first row of each identity, and per row the row standing for it; a repeated
    identity with another payload is refused."""
    fresh: dict[str, Occurrence] = {}
    firsts: list[Occurrence] = []
    for row in rows:
        prior = fresh.get(row.occurrence_id)
        if prior is None:
            fresh[row.occurrence_id] = prior = row
        elif canonical_json(prior.payload) != canonical_json(row.payload):
            raise payload_mismatch(job, row.trigger_key)
        firsts.append(prior)
    return fresh, firsts


def _judge_present(
    job: Job, rows: list[Occurrence], firsts: list[Occurrence], present: dict[str, Occurrence]
) -> list[Enqueued]:
    results: list[Enqueued] = []
    seen: set[str] = set()
    for row, first in zip(rows, firsts, strict=True):
        prior = present.get(row.occurrence_id)
        if prior is not None and canonical_json(prior.payload) != canonical_json(row.payload):
            raise payload_mismatch(job, row.trigger_key)
        if prior is not None:
            results.append(Enqueued(prior, True))
        else:
            results.append(Enqueued(first, first.occurrence_id in seen))
            seen.add(first.occurrence_id)
    return results


def _in_key_order(rows: dict[str, Occurrence]) -> list[Occurrence]:
    """``rows`` (by occurrence id) in key order: a bulk enqueue inserts new occurrences, and
    writes their events, in this order. Both unique indexes (the ids and the idempotency
    keys share their digest) then take the new entries each next to the last instead of at
    random places, and the order of one bulk's events does not depend on how the caller
    happened to list the items."""
    return [rows[key] for key in sorted(rows)]


def enqueue_once_per_trigger(
    job_id: str,
    *,
    scheduled_for: datetime | int,
    trigger_key: str,
    available_at: datetime | int | None = None,
    payload: Any = JOB_PAYLOAD,
    using: str | None = None,
) -> Enqueued:
    """Like :func:`enqueue`, but dedupes on (job, trigger_key) across job revisions."""
    job_id, scheduled_ms, key, available_ms = _enqueue_args(job_id, scheduled_for, trigger_key, available_at)
    if payload is not JOB_PAYLOAD:
        payload = normalize_json(payload, "payload")
    now = conf.now()
    with dialect.write_transaction(using) as alias:
        try:
            # The job row lock serializes once-per-trigger enqueues of one job, so two
            # racing callers at different revisions cannot both insert.
            job = Job.objects.using(alias).select_for_update().get(pk=job_id)
        except Job.DoesNotExist:
            raise NotFound(f"job {job_id!r} does not exist", {"job_id": job_id}) from None
        prior = list(
            Occurrence.objects.using(alias).filter(job=job, trigger_key=key).order_by("created_at", "pk")[:2]
        )
        if len(prior) > 1:
            raise DataCorrupt(
                "several occurrences exist for a once-per-trigger key", {"job_id": job_id, "trigger_key": key}
            )
        if prior:
            return Enqueued(prior[0], True)
        return insert_occurrence(
            job,
            scheduled_ms=scheduled_ms,
            trigger_key=key,
            available_ms=available_ms,
            payload=payload,
            now=now,
            alias=alias,
            trace_context=tracing.capture(),
        )


# --------------------------------------------------------------------------- schedules


def run_now(occurrence_id: str, *, reason: str | None = None, using: str | None = None) -> Occurrence:
    """Make a queued or retry_wait occurrence due now (its ``available_at`` moves to now, if
    it was later), so that the next claim may take it; a running or settled one raises
    ``InvalidState``. Workers are woken as by an enqueue."""
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    reason = cancel_reason(reason)
    now = conf.now()
    with dialect.write_transaction(using) as alias:
        occurrence = _locked(Action.RUN_NOW, occurrence_id, alias)
        previous = occurrence.available_at
        if previous > now:
            values = writes(Action.RUN_NOW, now, available_at=now)
            for name, value in values.items():
                setattr(occurrence, name, value)
            with writing(Action.RUN_NOW):
                occurrence.save(using=alias, update_fields=list(values))
            new_event(
                occurrence.job_id,
                event_of(Action.RUN_NOW),
                now,
                occurrence_id=occurrence_id,
                data={"reason": reason, "previousAvailableAt": iso_ms(previous), "status": occurrence.status},
            ).save(using=alias)
            notify_new_work(alias)
    return occurrence


def _locked(action: Action, occurrence_id: str, alias: str) -> Occurrence:
    """The occurrence, locked, if it may make the ``action`` transition (else ``NotFound`` or
    ``InvalidState``)."""
    occurrence = Occurrence.objects.using(alias).select_for_update().filter(pk=occurrence_id).first()
    check(action, occurrence_id, occurrence)
    assert occurrence is not None  # check refuses a missing row
    return occurrence


def retry_dead_letter(occurrence_id: str, *, using: str | None = None) -> Enqueued:
    """Enqueue a new occurrence of a dead letter's job with its payload and slot, due now,
    under trigger key ``retry:<occurrence_id>``; the dead letter stays as history. Returns
    ``(occurrence, deduplicated)``: retrying the same dead letter again, before its job's
    revision changes, finds the same new occurrence. ``InvalidState`` unless it is a dead
    letter; ``JobDisabled`` if its job is disabled."""
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    now = conf.now()
    with dialect.write_transaction(using) as alias:
        # Locked: the dead letter is read once, and nothing else moves it meanwhile.
        dead = _locked(Action.RETRY_DEAD_LETTER, occurrence_id, alias)
        scheduled_ms = to_ms(dead.scheduled_for, "scheduled_for")
        return insert_occurrence(
            get_job(dead.job_id, using=alias),
            scheduled_ms=scheduled_ms,
            trigger_key=f"retry:{occurrence_id}",
            available_ms=to_ms(now, "available_at"),
            payload=dead.payload,
            now=now,
            alias=alias,
            # The retry continues the dead letter's trace unless the caller's span is current.
            trace_context=tracing.capture() or dead.trace_context,
            # Its chain too (its dead-letter follow-ups already ran; its success ones may yet)
            # and its cause; not its batch, which counted the dead letter.
            follow_ups=dead.follow_ups,
            chain_as_stored=True,
            links={"caused_by": dead.caused_by, "cause": dead.cause},
        )


def _members_again(job_id: str, items: Any, batch: Batch, alias: str) -> list[Enqueued]:
    """The members a repeated ``enqueue_batch`` names, all found in its closed batch, or
    ``InvalidState``: a closed batch takes no new member."""
    job = get_job(job_id, using=alias)
    build = Builder(job)
    now = conf.now()
    rows = [build.occurrence(*item, now) for item in _parse_items(items)]
    fresh, firsts = _split_fresh(job, rows)
    present = _present(alias, list(fresh))
    if len(present) != len(fresh) or any(row.batch_id != batch.batch_id for row in present.values()):
        raise InvalidState(
            f"batch {batch.batch_id!r} is {batch.status}: it takes no more members",
            {"field": "batch", "batch_id": batch.batch_id, "status": batch.status},
        )
    return _judge_present(job, rows, firsts, present)


def enqueue_batch(
    job_id: str,
    items: Iterable[dict[str, Any]],
    *,
    callback: str,
    callback_payload: Any = JOB_PAYLOAD,
    batch_id: str | None = None,
    description: str = "",
    created_by: str | None = None,
    then: Any = None,
    on_dead_letter: Any = None,
    using: str | None = None,
) -> tuple[Batch, list[Enqueued]]:
    """Open a batch, enqueue ``items`` (as :func:`enqueue_many`) as its members and close
    it, in one transaction: its ``callback`` job gets one occurrence once every member is
    terminal (see ``batches.open_batch`` for the batch's arguments). The same call again
    (same ``batch_id`` and items) returns the batch and its members, deduplicated."""
    # Checked before the lookup: a malformed id (a lone surrogate) must be named, not sent.
    batch_id = None if batch_id is None else batches.checked_batch_id(batch_id)
    with dialect.write_transaction(using) as alias:
        existed = batch_id is not None and Batch.objects.using(alias).filter(pk=batch_id).exists()
        batch = batches.open_batch(
            callback,
            payload=callback_payload,
            batch_id=batch_id,
            description=description,
            created_by=created_by,
            using=alias,
        )
        if existed and batch.status != BatchStatus.OPEN:
            return batch, _members_again(job_id, items, batch, alias)
        results = enqueue_many(
            job_id, items, then=then, on_dead_letter=on_dead_letter, batch=batch.batch_id, using=alias
        )
        batch = batches.close_batch(batch.batch_id, using=alias)
    return batch, results
