"""The append-only history: event types, the event a kernel operation appends, and reading
it back. Events are written in the same transaction as the change they record."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .dialect import alias_for
from .identity import normalize_identifier, normalize_int
from .models import Event

# The nine event types of the portable audit trail, then ours.
JOB_CREATED = "job_created"
JOB_UPDATED = "job_updated"
OCCURRENCE_ENQUEUED = "occurrence_enqueued"
OCCURRENCE_CLAIMED = "occurrence_claimed"
OCCURRENCE_RECLAIMED = "occurrence_reclaimed"
OCCURRENCE_RENEWED = "occurrence_renewed"
OCCURRENCE_SUCCEEDED = "occurrence_succeeded"
OCCURRENCE_RETRY_SCHEDULED = "occurrence_retry_scheduled"
OCCURRENCE_DEAD_LETTERED = "occurrence_dead_lettered"
OCCURRENCE_CANCELLED = "occurrence_cancelled"
OCCURRENCE_RELEASED = "occurrence_released"
OCCURRENCE_MADE_DUE = "occurrence_made_due"
OCCURRENCE_DEBOUNCED = "occurrence_debounced"
SLOT_SKIPPED = "slot_skipped"
AUTHORITY_DENIED = "authority_denied"
AUTHORITY_DEFERRED = "authority_deferred"
OCCURRENCE_CANCEL_REQUESTED = "occurrence_cancel_requested"
FOLLOW_UP_SKIPPED = "follow_up_skipped"
BATCH_OPENED = "batch_opened"
BATCH_CLOSED = "batch_closed"
BATCH_CANCELLED = "batch_cancelled"
BATCH_COMPLETED = "batch_completed"

# Every type above, in that order: what the admin's event filter offers.
EVENT_TYPES = (
    JOB_CREATED,
    JOB_UPDATED,
    OCCURRENCE_ENQUEUED,
    OCCURRENCE_CLAIMED,
    OCCURRENCE_RECLAIMED,
    OCCURRENCE_RENEWED,
    OCCURRENCE_SUCCEEDED,
    OCCURRENCE_RETRY_SCHEDULED,
    OCCURRENCE_DEAD_LETTERED,
    OCCURRENCE_CANCELLED,
    OCCURRENCE_RELEASED,
    OCCURRENCE_MADE_DUE,
    OCCURRENCE_DEBOUNCED,
    SLOT_SKIPPED,
    AUTHORITY_DENIED,
    AUTHORITY_DEFERRED,
    OCCURRENCE_CANCEL_REQUESTED,
    FOLLOW_UP_SKIPPED,
    BATCH_OPENED,
    BATCH_CLOSED,
    BATCH_CANCELLED,
    BATCH_COMPLETED,
)


def new_event(
    job_id: str,
    event_type: str,
    at: datetime,
    *,
    occurrence_id: str | None = None,
    owner_id: str | None = None,
    fence: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """An unsaved event (the caller saves it inside its transaction, alone or in bulk)."""
    return Event(
        job_id=job_id,
        occurrence_id=occurrence_id,
        event_type=event_type,
        occurred_at=at,
        owner_id=owner_id,
        fence=fence,
        data=data or {},
    )


def history(
    job_id: str | None = None, occurrence_id: str | None = None, limit: int = 50, *, using: str | None = None
) -> list[Event]:
    """Events newest first, for a job, an occurrence, or everything."""
    limit = normalize_int(limit, "limit", minimum=1, maximum=10_000)
    qs = Event.objects.using(alias_for(using)).all()
    if job_id is not None:
        qs = qs.filter(job_id=normalize_identifier(job_id, "job_id"))
    if occurrence_id is not None:
        qs = qs.filter(occurrence_id=normalize_identifier(occurrence_id, "occurrence_id"))
    return list(qs.order_by("-event_id")[:limit])
