"""The statuses an occurrence, a reservation and a batch can be in: the vocabulary the
lifecycle table is written in and the models store. Plain choices (Django's ``TextChoices``,
labels and all), so that the rules say them without the models.
"""

from __future__ import annotations

from django.db.models.enums import TextChoices


class OccurrenceStatus(TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    SUCCEEDED = "succeeded"
    DEAD_LETTER = "dead_letter"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = (OccurrenceStatus.SUCCEEDED, OccurrenceStatus.DEAD_LETTER, OccurrenceStatus.CANCELLED)
PENDING_STATUSES = (OccurrenceStatus.QUEUED, OccurrenceStatus.RETRY_WAIT)
ACTIVE_STATUSES = (OccurrenceStatus.QUEUED, OccurrenceStatus.RUNNING, OccurrenceStatus.RETRY_WAIT)


class ReservationStatus(TextChoices):
    RESERVED = "reserved"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class BatchStatus(TextChoices):
    OPEN = "open"  # members may be added
    CLOSED = "closed"  # no more members: complete once every one is terminal
    COMPLETED = "completed"  # every member terminal and the callback enqueued
