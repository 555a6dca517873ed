"""What the kernel announces once a transaction commits: the ``batch_completed`` and
``follow_up_enqueued`` signals and their counters (``signals.py``, ``telemetry/metrics.py``).

Each call is made where the work is done, inside its transaction; with no receiver and no
OpenTelemetry it costs a dictionary look-up and registers nothing, so a chain or batch
nobody watches pays nothing for being watchable.
"""

from __future__ import annotations

from django.db import transaction

from .. import signals
from ..models import Batch, Job, Occurrence
from ..telemetry import metrics


def batch_completed(batch: Batch, job: Job, alias: str) -> None:
    """Announce ``batch`` completed (its callback, of ``job``, enqueued) after the commit."""
    instruments = metrics.get()
    heard = signals.batch_completed.has_listeners(Batch)
    if instruments is None and not heard:
        return

    def announce() -> None:
        if instruments is not None:
            instruments.batches_completed.add(1, metrics.labels(job.kind, job.authority))
        if heard:
            cancelled = batch.cancelled_at is not None
            signals.send(signals.batch_completed, Batch, batch=batch, kind=job.kind, cancelled=cancelled)

    transaction.on_commit(announce, using=alias)


def follow_up_enqueued(occurrence: Occurrence, job: Job, predecessor: str, edge: str, alias: str) -> None:
    """Announce the follow-up ``occurrence`` (of ``job``) after the commit."""
    instruments = metrics.get()
    heard = signals.follow_up_enqueued.has_listeners(Occurrence)
    if instruments is None and not heard:
        return

    def announce() -> None:
        if instruments is not None:
            instruments.follow_ups_enqueued.add(1, metrics.labels(job.kind, job.authority))
        if heard:
            signals.send(
                signals.follow_up_enqueued,
                Occurrence,
                occurrence=occurrence,
                kind=job.kind,
                predecessor=predecessor,
                on=edge,
            )

    transaction.on_commit(announce, using=alias)
