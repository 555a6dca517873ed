"""The event types of the append-only history. The kernel appends an event in the same
transaction as the change it records, and reads them back (``kernel/events.py``)."""

from __future__ import annotations

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
OCCURRENCE_ABANDONED = "occurrence_abandoned"
KIND_PAUSED = "kind_paused"
KIND_RESUMED = "kind_resumed"

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
    OCCURRENCE_ABANDONED,
    KIND_PAUSED,
    KIND_RESUMED,
)
