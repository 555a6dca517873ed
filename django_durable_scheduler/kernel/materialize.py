"""Materialization: turning due schedule slots into occurrences. Part of the kernel.

Each slot of a job fires at most once, ever: the job rows are locked (SKIP LOCKED, so
racing schedulers split the jobs between them; SQLite serializes writers), the occurrence
is written and the job's next fire time advanced in one transaction, and ``last_slot_at``
refuses any slot at or before one already materialized, across edits and pruning.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Min, Q

from .. import conf
from ..db.dialect import alias_for, insert, lock_rows, write_transaction
from ..models import PENDING_STATUSES, Job, Occurrence, OccurrenceStatus
from ..rules.events import SLOT_SKIPPED
from ..rules.schedules import plan_slots
from ..rules.triggers.fire_times import slot_trigger_key
from ..rules.validation import normalize_int, to_ms
from .events import new_event
from .inserting import JOB_PAYLOAD, insert_occurrence


def materialize_due(*, limit: int = 50, using: str | None = None) -> int:
    """Write the occurrences of every enabled job whose next fire time has come, and advance
    its next fire time in the same transaction. Returns the number of occurrences written.

    Each slot fires at most once, ever: the job rows are locked (SKIP LOCKED, so racing
    schedulers split the jobs between them; SQLite serializes writers), the next fire time
    only moves forward, and ``last_slot_at`` refuses any slot at or before one already
    materialized, across edits and pruning.
    """
    limit = normalize_int(limit, "limit", minimum=1, maximum=1000)
    now = conf.now()
    alias = alias_for(using)
    due = Job.objects.using(alias).filter(enabled=True, next_fire_at__lte=now)
    # The common case, nothing due, costs this one indexed query and no write transaction.
    if not due.exists():
        return 0
    written = 0
    with write_transaction(using) as alias:
        jobs = list(lock_rows(due.order_by("next_fire_at", "job_id"), alias)[:limit])
        for job in jobs:
            written += _materialize_job(job, now, alias)
    return written


def _materialize_job(job: Job, now: datetime, alias: str) -> int:
    assert job.next_fire_at is not None
    running, earliest_pending = _overlap_state(job, alias)
    plan = plan_slots(
        job.trigger,
        next_fire_at=job.next_fire_at,
        now=now,
        anchor=job.created_at,
        last_slot_at=job.last_slot_at,
        running=running,
        earliest_pending=earliest_pending,
    )
    written = 0
    for slot in plan.fire:
        slot_ms = to_ms(slot, "slot")
        _, deduplicated = insert_occurrence(
            job,
            scheduled_ms=slot_ms,
            trigger_key=slot_trigger_key(slot),
            available_ms=slot_ms,
            payload=JOB_PAYLOAD,
            now=now,
            alias=alias,
        )
        written += not deduplicated
    insert(
        alias,
        [new_event(job.job_id, SLOT_SKIPPED, now, data=skipped.event_data()) for skipped in plan.skipped],
    )
    last = max((slot for slot in (plan.last_slot_at, job.last_slot_at) if slot is not None), default=None)
    Job.objects.using(alias).filter(pk=job.pk).update(next_fire_at=plan.next_fire_at, last_slot_at=last)
    job.next_fire_at, job.last_slot_at = plan.next_fire_at, last
    return written


def _overlap_state(job: Job, alias: str) -> tuple[bool, datetime | None]:
    """Whether an occurrence of the job is running, and when its earliest pending one is
    scheduled: what ``overlap: skip`` needs (other jobs need no query)."""
    if job.trigger.get("overlap") != "skip":
        return False, None
    state = (
        Occurrence.objects.using(alias)
        .filter(job=job)
        .aggregate(
            running=Count("pk", filter=Q(status=OccurrenceStatus.RUNNING)),
            earliest=Min("scheduled_for", filter=Q(status__in=PENDING_STATUSES)),
        )
    )
    return state["running"] > 0, state["earliest"]


def next_due_at(*, using: str | None = None) -> datetime | None:
    """The earliest next fire time of any enabled job (for the worker's sleep)."""
    row = (
        Job.objects.using(alias_for(using))
        .filter(enabled=True, next_fire_at__isnull=False)
        .order_by("next_fire_at")
        .values_list("next_fire_at", flat=True)
        .first()
    )
    return row
