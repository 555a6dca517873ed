"""How long the recent runs of a worker's kinds took, read from the database once when the
worker starts: a fresh worker (a restart, a supervisor's replacement) then sizes its first
claim as the workers before it had learned to, instead of assuming slow handlers until it
has timed a few of its own.

Nothing records a run's own duration, and nothing more is written for this: a claim's event
says when (and by whom) its rows were claimed, their ``settled_at`` when each was settled.
Two things bound the mean run time of one claim's rows from above: its worker's
``concurrency`` threads ran them between the claim and the last settle, so
``concurrency * (last settle - claim) / rows``; and a worker claims more rows than it has
threads only once it has timed its handlers as fast enough for them, so a run time of
``concurrency * HOLD_AHEAD / rows`` sizes a first claim as large as that one (see
pacing.claim_ahead). The least bound over the recent claims is the estimate.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import DatabaseError, connections

from .. import conf
from ..models import Event, Occurrence, OccurrenceStatus, WorkerHeartbeat
from ..rules.events import OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED
from .pacing import HOLD_AHEAD, ClaimPacer

logger = logging.getLogger("django_durable_scheduler")

# The most recent successes looked at (newest first, along the settled rows' index: as many as
# the largest claim, at most MAX_SAMPLE), and how far back: older runs say little of the
# handlers as they are now.
MAX_SAMPLE = 5000
WINDOW = timedelta(minutes=10)


def recent_run_seconds(kinds: list[str], concurrency: int, using: str | None = None) -> float | None:
    """An upper bound of the mean run time of ``kinds``' recent successes (seconds), or None
    when there are none. ``concurrency`` stands for the claimers whose worker row is gone."""
    if not kinds:
        return None
    settled = dict(
        Occurrence.objects.using(using)
        .filter(
            status=OccurrenceStatus.SUCCEEDED,
            settled_at__gte=conf.now() - WINDOW,
            job__kind__in=kinds,
        )
        .order_by("-settled_at")
        .values_list("pk", "settled_at")[: min(conf.settings.MAX_CLAIM_BATCH, MAX_SAMPLE)]
    )
    # Each row's last claim (a reclaim follows the claim whose lease expired), one index probe
    # per row on the events' (occurrence, event_id) index.
    events = Event.objects.using(using).filter(
        occurrence_id__in=list(settled), event_type__in=(OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED)
    )
    last_claims: dict[str, tuple[int, str | None, datetime]] = {}
    for pk, event_id, owner, claimed_at in events.values_list(
        "occurrence_id", "event_id", "owner_id", "occurred_at"
    ):
        if pk not in last_claims or event_id > last_claims[pk][0]:
            last_claims[pk] = (event_id, owner, claimed_at)
    claimed: dict[tuple[str | None, datetime], list[float]] = {}
    for pk, (_, owner, claimed_at) in last_claims.items():
        settled_at = settled[pk]
        if settled_at is not None:
            claimed.setdefault((owner, claimed_at), []).append((settled_at - claimed_at).total_seconds())
    if not claimed:
        return None
    threads = dict(
        WorkerHeartbeat.objects.using(using)
        .filter(worker_id__in={owner for owner, _ in claimed})
        .values_list("worker_id", "concurrency")
    )
    return min(
        threads.get(owner or "", concurrency) * min(max(max(held), 0.0), HOLD_AHEAD) / len(held)
        for (owner, _), held in claimed.items()
    )


def read_recent(kinds: list[str], concurrency: int, using: str | None) -> float | None:
    """:func:`recent_run_seconds`, or None (with a WARNING) when the database cannot say."""
    try:
        return recent_run_seconds(kinds, concurrency, using=using)
    except DatabaseError:
        logger.warning("could not read the recent run times of %s; learning them", kinds)
        connections.close_all()
        return None


def seed_pacer(pacer: ClaimPacer, kinds: list[str], concurrency: int, using: str | None) -> None:
    """Size a starting worker's first claims by what its kinds' recent runs took: one read,
    at the start only; without it (or any recent run) the pacer learns from its own runs."""
    seconds = read_recent(kinds, concurrency, using)
    pacer.seed(seconds)
    if seconds is not None:
        logger.debug("the recent runs of this worker's kinds took at most %.5f s on average", seconds)


class RecentReading:
    """A supervisor's reading of what its workers' kinds' recent runs took, handed to each
    child in its fork: read at the supervisor's start, and again (:meth:`refresh`) when it
    found none or is ``every`` seconds old. The caller closes the connection."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.seconds: float | None = None
        self.read_at: float | None = None  # monotonic

    def read(self, kinds: list[str], concurrency: int, using: str | None) -> None:
        self.read_at = time.monotonic()
        self.seconds = read_recent(kinds, concurrency, using)

    def refresh(self, kinds: list[str], concurrency: int, using: str | None) -> None:
        if self.seconds is None or self.read_at is None or time.monotonic() - self.read_at >= self.every:
            self.read(kinds, concurrency, using)

    def hand_to(self, pacer: ClaimPacer) -> None:
        """Seed a child's ``pacer`` with the reading, if one was made: it then reads nothing."""
        if self.read_at is not None:
            pacer.seed(self.seconds)
