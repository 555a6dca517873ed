"""Batches: a set of occurrences with a callback enqueued exactly once, when every member is
terminal (docs/design.md, "Chains and batches").

A batch is opened, given members (``enqueue(..., batch=...)``, ``enqueue_many``), and closed
(``enqueue_batch`` does all three in one call). Settling a member never writes the batch row,
so a batch drained by many workers has no row they all update. Instead, once a transaction
that ended members commits, it looks whether their batch has a live member left (one indexed
probe); the transaction that finds none locks the batch row, looks again, counts the members
by status, enqueues the callback (trigger key ``batch:<batch_id>``) and marks the batch
completed, all at once. A member can only become terminal, and a closed batch gains none,
so the last member's look always sees the others; a look lost to a crash is made by the
workers' sweep (:func:`complete_due`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Count

from .. import conf
from ..db.dialect import alias_for, write_transaction
from ..exceptions import Conflict, InvalidArgument, InvalidState, NotFound
from ..models import ACTIVE_STATUSES, Batch, BatchStatus, Job, Occurrence, OccurrenceStatus
from ..rules.causes import BatchSummary
from ..rules.events import BATCH_CLOSED, BATCH_COMPLETED, BATCH_OPENED
from ..rules.identity import canonical_json, normalize_json
from ..rules.validation import normalize_identifier, normalize_int, to_ms
from .events import new_event
from .inserting import JOB_PAYLOAD, insert_occurrence
from .notices import batch_completed

logger = logging.getLogger("django_durable_scheduler")

CALLBACK_PREFIX = "batch:"
MAX_BATCH_ID = 200  # so that the callback's trigger key fits
MAX_DESCRIPTION = 256
# Closed batches the workers' sweep looks at per turn.
SWEEP_LIMIT = 100


def checked_batch_id(value: Any) -> str:
    return normalize_identifier(value, "batch_id", max_length=MAX_BATCH_ID)


def locked(batch_id: str, alias: str) -> Batch:
    """The batch, locked until the caller's transaction ends, or ``NotFound``."""
    batch = Batch.objects.using(alias).select_for_update().filter(pk=batch_id).first()
    if batch is None:
        raise NotFound(f"batch {batch_id!r} does not exist", {"field": "batch", "batch_id": batch_id})
    return batch


def get_batch(batch_id: str, *, using: str | None = None) -> Batch:
    """The batch, or ``NotFound``."""
    batch_id = checked_batch_id(batch_id)
    batch = Batch.objects.using(alias_for(using)).filter(pk=batch_id).first()
    if batch is None:
        raise NotFound(f"batch {batch_id!r} does not exist", {"field": "batch", "batch_id": batch_id})
    return batch


def batch_event(batch: Batch, event_type: str, now: datetime, **data: Any) -> Any:
    """A batch's event, recorded under its callback's job (every event names a job)."""
    return new_event(batch.callback_job_id, event_type, now, data={"batchId": batch.batch_id, **data})


def open_batch(
    callback: str,
    *,
    payload: Any = JOB_PAYLOAD,
    batch_id: str | None = None,
    description: str = "",
    created_by: str | None = None,
    using: str | None = None,
) -> Batch:
    """Open a batch whose callback is an occurrence of the job ``callback`` (run as that
    job's principal) with ``payload`` (default: the job's). ``batch_id``: the caller's id for
    it (default: a new one); opening the same id again with the same callback and payload
    returns the batch, another definition is a ``Conflict``. ``created_by`` names who opened
    it, in its event. Add members with ``enqueue(..., batch=batch.batch_id)``, then
    :func:`close_batch`."""
    callback = normalize_identifier(callback, "callback")
    batch_id = checked_batch_id(batch_id) if batch_id is not None else f"batch_{uuid.uuid4().hex}"
    stored_payload = None if payload is JOB_PAYLOAD else normalize_json(payload, "payload")
    if not isinstance(description, str):
        raise InvalidArgument("description", "must be a string")
    description = normalize_json(description.strip(), "description")
    if len(description) > MAX_DESCRIPTION:
        raise InvalidArgument("description", f"must be at most {MAX_DESCRIPTION} characters")
    created_by = None if created_by is None else _creator(created_by)
    now = conf.now()
    with write_transaction(using) as alias:
        if not Job.objects.using(alias).filter(pk=callback).exists():
            raise NotFound(
                f"callback: job {callback!r} does not exist", {"field": "callback", "job_id": callback}
            )
        existing = Batch.objects.using(alias).filter(pk=batch_id).first()
        if existing is not None:
            same = existing.callback_job_id == callback and existing.has_callback_payload == (
                payload is not JOB_PAYLOAD
            )
            if same and canonical_json(existing.callback_payload) == canonical_json(stored_payload):
                return existing
            raise Conflict(
                f"batch {batch_id!r} already exists with another callback",
                {"field": "batch_id", "batch_id": batch_id},
            )
        batch = Batch(
            batch_id=batch_id,
            callback_job_id=callback,
            callback_payload=stored_payload,
            has_callback_payload=payload is not JOB_PAYLOAD,
            description=description,
            created_by=created_by,
            created_at=now,
        )
        batch.save(using=alias, force_insert=True)
        batch_event(batch, BATCH_OPENED, now, createdBy=created_by, description=description).save(using=alias)
    return batch


def _creator(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument("created_by", "must be a non-empty string or None")
    return normalize_identifier(value, "created_by", max_length=256)


def join(batch_id: Any, alias: str) -> Batch:
    """The open batch new members join, locked until the caller's transaction ends (a close
    waits for the members being added). ``InvalidState`` once it is closed."""
    batch = locked(checked_batch_id(batch_id), alias)
    if batch.status != BatchStatus.OPEN:
        raise InvalidState(
            f"batch {batch.batch_id!r} is {batch.status}: it takes no more members",
            {"field": "batch", "batch_id": batch.batch_id, "status": batch.status},
        )
    return batch


def grew(batch: Batch, added: int, alias: str) -> None:
    """Count ``added`` new members (inside the transaction that :func:`join` locked it in)."""
    if added:
        batch.size += added
        Batch.objects.using(alias).filter(pk=batch.pk).update(size=batch.size)


def not_a_member_elsewhere(occurrence: Occurrence, batch: Batch) -> None:
    """An enqueue into ``batch`` that found an occurrence already stored with its identity:
    fine if that one is a member already (the same call again), else a ``Conflict``."""
    if occurrence.batch_id != batch.batch_id:
        where = "no batch" if occurrence.batch_id is None else f"batch {occurrence.batch_id!r}"
        raise Conflict(
            f"occurrence {occurrence.pk!r} already exists in {where}; it cannot join {batch.batch_id!r}",
            {"field": "batch", "occurrence_id": occurrence.pk, "batch_id": batch.batch_id},
        )


def close_batch(batch_id: str, *, using: str | None = None) -> Batch:
    """Close an open batch: it takes no more members, and completes once every member is
    terminal (at once if it has none). Closing a closed or completed batch does nothing."""
    batch_id = checked_batch_id(batch_id)
    now = conf.now()
    with write_transaction(using) as alias:
        batch = locked(batch_id, alias)
        if batch.status != BatchStatus.OPEN:
            return batch
        batch.status, batch.closed_at = BatchStatus.CLOSED, now
        batch.save(using=alias, update_fields=["status", "closed_at"])
        batch_event(batch, BATCH_CLOSED, now, size=batch.size).save(using=alias)
        look_after_commit([batch_id], alias)
    return batch


def mark_cancelled(batch_id: str, requested_by: str | None, now: datetime, using: str | None) -> Batch:
    """The batch marked cancelled (closed if it was open), in a transaction of its own;
    ``InvalidState`` once it is completed. Its waiting members are ``cancelling``'s."""
    with write_transaction(using) as alias:
        batch = locked(batch_id, alias)
        if batch.status == BatchStatus.COMPLETED:
            raise InvalidState(
                f"batch {batch_id!r} is completed: there is nothing left to cancel",
                {"field": "batch", "batch_id": batch_id, "status": batch.status},
            )
        if batch.cancelled_at is None:
            batch.cancelled_at, batch.cancelled_by = now, requested_by
            if batch.status == BatchStatus.OPEN:
                batch.status, batch.closed_at = BatchStatus.CLOSED, now
            batch.save(using=alias, update_fields=["status", "closed_at", "cancelled_at", "cancelled_by"])
    return batch


def progress(batch_id: str, *, using: str | None = None) -> dict[str, int]:
    """The batch's members by status (every status, 0 for none), and ``total``."""
    batch_id = checked_batch_id(batch_id)
    counts = {status.value: 0 for status in OccurrenceStatus}
    for status, n in (
        Occurrence.objects.using(alias_for(using))
        .filter(batch_id=batch_id)
        .values_list("status")
        .annotate(n=Count("pk"))
        .order_by()
    ):
        counts[status] = n
    return {**counts, "total": sum(counts.values())}


def members(batch_id: str, *, status: str | None = None, using: str | None = None) -> list[str]:
    """The ids of the batch's members (of ``status``, if given), in id order. Members are
    kept while their batch is not completed; after that, retention may prune them."""
    batch_id = checked_batch_id(batch_id)
    rows = Occurrence.objects.using(alias_for(using)).filter(batch_id=batch_id)
    if status is not None:
        if status not in OccurrenceStatus.values:
            raise InvalidArgument("status", f"must be one of {', '.join(OccurrenceStatus.values)}")
        rows = rows.filter(status=status)
    return list(rows.order_by("pk").values_list("pk", flat=True))


# --------------------------------------------------------------------------- completion


def look_after_commit(batch_ids: Iterable[str], alias: str) -> None:
    """Once the current transaction commits, complete those of ``batch_ids`` that are done."""
    ids = sorted(set(batch_ids))
    transaction.on_commit(lambda: complete_if_done(ids, alias), using=alias)


def complete_if_done(batch_ids: Iterable[str], alias: str) -> int:
    """Complete each closed batch of ``batch_ids`` without a live member; how many it did.
    Never raises a database error (it runs after a commit, whose caller must not see one):
    what it could not do, the workers' sweep does."""
    done = 0
    for batch_id in batch_ids:
        try:
            if _done(batch_id, alias) and _complete(batch_id, alias):
                done += 1
        except DatabaseError as exc:
            logger.warning("batch %s: could not look for its completion (%s); the sweep will", batch_id, exc)
    return done


def _done(batch_id: str, alias: str) -> bool:
    closed = Batch.objects.using(alias).filter(pk=batch_id, status=BatchStatus.CLOSED).exists()
    return closed and not _has_live(batch_id, alias)


def _has_live(batch_id: str, alias: str) -> bool:
    return Occurrence.objects.using(alias).filter(batch_id=batch_id, status__in=ACTIVE_STATUSES).exists()


def _complete(batch_id: str, alias: str) -> bool:
    """In one transaction: the batch locked, found closed with no live member, its members
    counted, its callback enqueued and the batch completed. False if another did it first."""
    now = conf.now()
    with write_transaction(alias):
        batch = Batch.objects.using(alias).select_for_update().filter(pk=batch_id).first()
        if batch is None or batch.status != BatchStatus.CLOSED or _has_live(batch_id, alias):
            return False
        counts = {
            status: 0
            for status in (
                OccurrenceStatus.SUCCEEDED,
                OccurrenceStatus.DEAD_LETTER,
                OccurrenceStatus.CANCELLED,
            )
        }
        for status, n in (
            Occurrence.objects.using(alias)
            .filter(batch_id=batch_id)
            .values_list("status")
            .annotate(n=Count("pk"))
            .order_by()
        ):
            counts[status] = n
        counted = {str(status): n for status, n in counts.items()}
        cause: BatchSummary = {
            "batch_id": batch_id,
            "description": batch.description,
            "size": batch.size,
            "counts": counted,
            "cancelled": batch.cancelled_at is not None,
        }
        job = Job.objects.using(alias).get(pk=batch.callback_job_id)
        callback, _ = insert_occurrence(
            job,
            scheduled_ms=to_ms(batch.created_at, "created_at"),
            trigger_key=f"{CALLBACK_PREFIX}{batch_id}",
            available_ms=to_ms(now, "available_at"),
            payload=batch.callback_payload if batch.has_callback_payload else JOB_PAYLOAD,
            now=now,
            alias=alias,
            links={"cause": cause},
            disabled_waits=True,
        )
        batch.status, batch.completed_at = BatchStatus.COMPLETED, now
        batch.counts, batch.callback = counted, callback.pk
        batch.save(using=alias, update_fields=["status", "completed_at", "counts", "callback"])
        batch_event(batch, BATCH_COMPLETED, now, counts=counted, callback=callback.pk).save(using=alias)
        batch_completed(batch, job, alias)
    logger.info(
        "batch %s completed: %s; callback %s (job %s)",
        batch_id,
        ", ".join(f"{n} {status}" for status, n in counted.items()),
        callback.pk,
        batch.callback_job_id,
    )
    return True


def complete_due(*, limit: int = SWEEP_LIMIT, using: str | None = None) -> int:
    """Complete the closed batches that are done (the workers' sweep: it finds a batch whose
    last member's look was lost to a crash). How many it completed."""
    limit = normalize_int(limit, "limit", minimum=1, maximum=10_000)
    alias = alias_for(using)
    closed = Batch.objects.using(alias).filter(status=BatchStatus.CLOSED).order_by("created_at")
    ids = list(closed.values_list("pk", flat=True)[:limit])
    return complete_if_done(ids, alias) if ids else 0
