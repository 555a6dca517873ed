"""The worker's claim: claim and authorize a batch in one transaction, hold what was claimed
(the heartbeat renews its leases) and hand the runnable runs to the handler threads, fairly
across principals from one claim to the next (the worker's round-robin cursor).
"""

from __future__ import annotations

import math
import time
from datetime import datetime

from .. import conf, kernel
from ..handlers import registry
from ..models import Occurrence
from ..rules.outcomes import FAILED, Outcome
from .outcomes import OutcomeReporter
from .pool import HandlerPool
from .runs import Held, Run


def _handler_units(occurrence: Occurrence) -> kernel.Units:
    """The units of the occurrence's handler registration (1 without a handler)."""
    handler = registry.get_handler(occurrence.claimed_kind or "")
    return handler.units if handler is not None else 1


class Claimer:
    """Claims for ``worker_id``: what it claims is held in ``held``, run by ``pool``, and
    reported (claimed, refused) by ``reporter``."""

    def __init__(
        self,
        *,
        worker_id: str,
        lease: float,
        using: str | None,
        held: Held,
        pool: HandlerPool,
        reporter: OutcomeReporter,
    ) -> None:
        self.worker_id = worker_id
        self.lease = lease
        self.using = using
        self.held = held
        self.pool = pool
        self.reporter = reporter
        self._principal_cursor: str | None = None
        # The earliest start a claim gave work over a throttle's rate: the loop wakes then.
        self.throttled_until: datetime | None = None

    def claim(self, limit: int, kinds: list[str]) -> list[Occurrence]:
        """Claim and authorize up to ``limit`` occurrences of ``kinds`` in one transaction
        (one commit before the handlers start), then hand the runnable ones to the handler
        threads. Denied ones are dead-lettered, deferred ones wait for their window (both
        written in that transaction); a failing units function is the occurrence's durable
        failure. Returns everything claimed, in claim order."""
        batch = kernel.claim_authorized(
            owner=self.worker_id,
            lease=self.lease,
            limit=limit,
            kinds=kinds,
            units_of=_handler_units,
            after_principal=self._principal_cursor,
            sweep_expired=False,
            using=self.using,
        )
        if batch.throttled_until is not None or self.throttled_until is not None:
            self._throttled(batch.throttled_until)
        if batch.claimed:
            # Round-robin: the next claim starts after the last principal served.
            self._principal_cursor = batch.claimed[-1].principal_key
        for occurrence, result in batch.refused:
            self.reporter.refused(occurrence, result)
        self.held.count_refused(len(batch.refused))
        unpriced = self._hold([occurrence for occurrence, _ in batch.unpriced])
        for run, (_, exc) in zip(unpriced, batch.unpriced, strict=True):
            error = {"type": "InvalidUnits", "message": str(exc)}
            at = (run.context.occurrence_id, run.context.fence)
            self.held.finish(run, Outcome(*at, FAILED, error=error, retryable=False, exception=exc))
        runnable = self._hold(batch.runnable)
        self.reporter.claimed(runnable)
        self.pool.submit(runnable)
        return batch.claimed

    def _throttled(self, until: datetime | None) -> None:
        """Keep the earliest throttled start still to come (one passed is forgotten)."""
        now = conf.now()
        kept = [at for at in (until, self.throttled_until) if at is not None and at > now]
        self.throttled_until = min(kept) if kept else None

    def throttle_wait(self, now: datetime) -> float | None:
        """Seconds until the earliest throttled start this worker knows of (None: none)."""
        if self.throttled_until is None:
            return None
        return max(0.0, (self.throttled_until - now).total_seconds())

    def _hold(self, claimed: list[Occurrence]) -> list[Run]:
        """Register claimed occurrences as held (the heartbeat renews their leases)."""
        if not claimed:
            return []
        default_timeout = conf.settings.HANDLER_TIMEOUT
        # One claim gives every row the same expiry. Read against the clock now, not the
        # claim's start: a worker stopped in between holds that much less of its lease.
        expires = claimed[0].lease_expires_at
        lease_until = time.monotonic() + (expires - conf.now()).total_seconds() if expires else math.inf
        runs = [
            Run.of(
                occurrence,
                owner=self.worker_id,
                using=self.using,
                default_timeout=default_timeout,
                lease_until=lease_until,
                progress_sink=self.reporter.progressed,
            )
            for occurrence in claimed
        ]
        self.held.add(runs)
        return runs
