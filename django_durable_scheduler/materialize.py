"""Materialization: turning due schedule slots into occurrences. Part of the kernel.

Each slot of a job fires at most once, ever: the job rows are locked (SKIP LOCKED, so
racing schedulers split the jobs between them; SQLite serializes writers), the occurrence
is written and the job's next fire time advanced in one transaction, and ``last_slot_at``
refuses any slot at or before one already materialized, across edits and pruning.
"""

from __future__ import annotations

from datetime import datetime

from django.db import DEFAULT_DB_ALIAS

from . import conf
from .dialect import insert_rows, lock_rows, write_transaction
from .enqueuing import JOB_PAYLOAD, insert_occurrence
from .events import SLOT_SKIPPED, new_event
from .identity import iso_ms, normalize_int, to_ms
from .models import ACTIVE_STATUSES, Job, Occurrence
from .schedules import plan_slots
from .triggers import slot_trigger_key

# At most this many slot_skipped events per job and pass; the rest are counted in one more.
MAX_SKIP_EVENTS = 1000


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
    alias = using or DEFAULT_DB_ALIAS
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
    overlap_active = (
        job.trigger.get("overlap") == "skip"
        and Occurrence.objects.using(alias).filter(job=job, status__in=ACTIVE_STATUSES).exists()
    )
    plan = plan_slots(
        job.trigger,
        next_fire_at=job.next_fire_at,
        now=now,
        anchor=job.created_at,
        last_slot_at=job.last_slot_at,
        overlap_active=overlap_active,
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
    events = [
        new_event(job.job_id, SLOT_SKIPPED, now, data={"slot": iso_ms(slot), "reason": reason})
        for slot, reason in plan.skipped[:MAX_SKIP_EVENTS]
    ]
    if len(plan.skipped) > MAX_SKIP_EVENTS:
        rest = plan.skipped[MAX_SKIP_EVENTS:]
        events.append(
            new_event(
                job.job_id,
                SLOT_SKIPPED,
                now,
                data={
                    "reason": "many",
                    "count": len(rest),
                    "from": iso_ms(rest[0][0]),
                    "to": iso_ms(rest[-1][0]),
                },
            )
        )
    if plan.bulk_skipped is not None:
        after, until = plan.bulk_skipped
        events.append(
            new_event(
                job.job_id,
                SLOT_SKIPPED,
                now,
                data={"reason": "scan_limit", "after": iso_ms(after), "until": iso_ms(until)},
            )
        )
    insert_rows(alias, events)
    last = (
        plan.last_slot_at
        if job.last_slot_at is None or plan.last_slot_at is None
        else max(plan.last_slot_at, job.last_slot_at)
    )
    Job.objects.using(alias).filter(pk=job.pk).update(next_fire_at=plan.next_fire_at, last_slot_at=last)
    job.next_fire_at, job.last_slot_at = plan.next_fire_at, last
    return written


def next_due_at(*, using: str | None = None) -> datetime | None:
    """The earliest next fire time of any enabled job (for the worker's sleep)."""
    row = (
        Job.objects.using(using or DEFAULT_DB_ALIAS)
        .filter(enabled=True, next_fire_at__isnull=False)
        .order_by("next_fire_at")
        .values_list("next_fire_at", flat=True)
        .first()
    )
    return row
