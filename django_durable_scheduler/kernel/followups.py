"""What follows an occurrence's terminal transition, written in the same transaction: the
follow-ups its chain names (``chains.py``), and, for a batch member, the look for the batch's
completion once that transaction commits (``batches.py``).

Every kernel operation that ends an occurrence (settle, deny, the expiry sweep, cancel) calls
:func:`reached_terminal` with the rows it ended, their new status and outcome set. An
occurrence reaches a terminal status once, under its row lock, so its follow-ups are written
exactly once; their identity (trigger key ``after:<predecessor>:<edge>:<n>``) is derived from
it all the same, so that nothing could write one twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ..models import Job, Occurrence, OccurrenceStatus
from ..rules.causes import Predecessor
from ..rules.chains import EDGE_OF_STATUS, EDGES
from ..rules.events import FOLLOW_UP_SKIPPED
from ..rules.validation import to_ms
from . import batches
from .events import new_event
from .inserting import JOB_PAYLOAD, Builder, insert_occurrence
from .notices import follow_up_enqueued

FOLLOW_UP_PREFIX = "after:"
# What the kernel reads of each row it ends, for this module (a plain row's are NULL).
TERMINAL_FIELDS: tuple[str, ...] = ("follow_ups", "batch_id", "scheduled_for", "trace_context")


def reached_terminal(rows: Iterable[Occurrence], now: datetime, alias: str) -> None:
    """Enqueue the follow-ups of ``rows`` that name some for their new status, and have the
    batches of the members among them looked at once this transaction commits. Plain
    occurrences (no follow-ups, no batch) cost nothing here."""
    members: set[str] = set()
    builders: dict[str, Builder | None] = {}
    for row in rows:
        if row.batch_id is not None:
            members.add(row.batch_id)
        edge = EDGE_OF_STATUS.get(str(row.status))
        if row.follow_ups and edge and row.follow_ups.get(edge):
            _enqueue_follow_ups(row, edge, now, alias, builders)
    if members:
        batches.look_after_commit(members, alias)


def _cause(row: Occurrence) -> Predecessor:
    """What a follow-up's handler sees of its predecessor (``ctx.predecessor``)."""
    cause: Predecessor = {"occurrence_id": row.pk, "job_id": row.job_id, "status": str(row.status)}
    if row.status == OccurrenceStatus.SUCCEEDED:
        cause["result"] = row.result
    else:
        cause["error"] = row.last_error
    return cause


def _enqueue_follow_ups(
    row: Occurrence, edge: str, now: datetime, alias: str, builders: dict[str, Builder | None]
) -> None:
    cause = _cause(row)
    scheduled_ms = to_ms(row.scheduled_for, "scheduled_for")
    for index, spec in enumerate((row.follow_ups or {})[edge]):
        job_id = spec["job_id"]
        if job_id not in builders:
            job = Job.objects.using(alias).filter(pk=job_id).first()
            builders[job_id] = None if job is None else Builder(job)
        build = builders[job_id]
        if build is None:
            # Checked when the chain was declared; a job deleted since leaves a trace instead.
            new_event(
                row.job_id,
                FOLLOW_UP_SKIPPED,
                now,
                occurrence_id=row.pk,
                data={"jobId": job_id, "on": edge, "index": index, "reason": "job_missing"},
            ).save(using=alias)
            continue
        follow_up, deduplicated = insert_occurrence(
            build.job,
            builder=build,
            scheduled_ms=scheduled_ms,
            trigger_key=f"{FOLLOW_UP_PREFIX}{row.pk}:{edge}:{index}",
            available_ms=to_ms(now, "available_at"),
            payload=spec.get("payload", JOB_PAYLOAD),
            now=now,
            alias=alias,
            trace_context=None if "trace_context" in row.get_deferred_fields() else row.trace_context,
            follow_ups={key: spec[key] for key in EDGES if key in spec} or None,
            links={"caused_by": row.pk, "cause": cause},
            disabled_waits=True,
        )
        if not deduplicated:
            follow_up_enqueued(follow_up, build.job, row.pk, edge, alias)
