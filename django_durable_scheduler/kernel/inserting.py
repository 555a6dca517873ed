"""Writing a new occurrence: built from its job (what it copies, its identity) and inserted
with its event, or found when its identity is already stored. The enqueues (``enqueuing``),
the schedule (``materialize``), the follow-ups of a chain (``followups``) and a batch's callback
(``batches``) all write their occurrences here. Every column comes from the model: a field
added to ``Occurrence`` needs no edit here.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction

from ..db import dialect, guarded
from ..db.wakeup import notify_new_work
from ..exceptions import DataCorrupt, IdempotencyPayloadMismatch, JobDisabled
from ..models import Event, Job, Occurrence, OccurrenceStatus
from ..rules import chains
from ..rules.authority import Principal
from ..rules.identity import (
    IDEMPOTENCY_KEY_PREFIX,
    OCCURRENCE_ID_PREFIX,
    canonical_json,
    identity_digester,
    normalize_json,
)
from ..rules.lifecycle import Action, event_of
from ..rules.throttles import render_key as throttle_key
from ..rules.validation import from_ms, to_ms
from ..telemetry.metrics import count_enqueued
from . import throttles
from .concurrency import key_spec_of, render_key
from .events import new_event

# The caller gave no payload: the occurrence takes its job's.
JOB_PAYLOAD: Any = object()


class Enqueued(NamedTuple):
    """What an enqueue returns: the occurrence, and whether it was already stored (found by
    its identity or unique key, nothing written) rather than inserted. A tuple, so
    ``occurrence, deduplicated = scheduler.enqueue(...)`` unpacks it."""

    occurrence: Occurrence
    deduplicated: bool


class Builder:
    """Builds the queued occurrences of one job revision, and their events. What every
    occurrence of the job shares (the identity prefix, the principal key) is computed once:
    a bulk enqueue builds thousands, and a remembered job keeps its builder."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.digest_of: Callable[[int, str], str] = identity_digester(job.job_id, job.revision)
        self.principal_key = Principal.of(job.authority).key
        self.key_spec = key_spec_of(job.concurrency_key, job.kind)
        self.throttle_key = throttles.key_template(job.throttle, job.kind)
        self.chain = chains.of_job(job)
        # Each occurrence that takes the job's payload gets a copy of its own: a caller that
        # changes the one it was handed must not change the next enqueue's (a remembered
        # job's builder lives as long as the process). A pickle of the JSON value, since
        # copying it back is one call in C: the deep copy of every plain enqueue.
        self.job_payload = pickle.dumps(job.payload)

    def occurrence(
        self,
        scheduled_ms: int,
        trigger_key: str,
        available_ms: int,
        payload: Any,
        now: datetime,
        priority: int = 0,
        trace_context: dict[str, str] | None = None,
        unique_key: str | None = None,
        follow_ups: dict[str, Any] | None = None,
        *,
        chain_as_stored: bool = False,
        **links: Any,
    ) -> Occurrence:
        """One queued occurrence; ``follow_ups``: its enqueue's own (its job's come first);
        ``chain_as_stored``: ``follow_ups`` are the whole chain, without the job's (the retry
        of a dead letter carries the dead letter's). ``links``: what ties it to a predecessor
        or a batch (``caused_by``, ``cause``, ``batch_id``)."""
        self_chain = {} if chain_as_stored else self.chain
        job = self.job
        digest = self.digest_of(scheduled_ms, trigger_key)
        scheduled = from_ms(scheduled_ms)
        payload = pickle.loads(self.job_payload) if payload is JOB_PAYLOAD else payload
        if self.throttle_key is not None:  # refused now if the payload cannot key it (not stored)
            throttle_key(self.throttle_key, payload)
        return Occurrence(
            occurrence_id=OCCURRENCE_ID_PREFIX + digest,
            # By id: a remembered job row may be stale in columns no guard covers.
            job_id=job.job_id,
            job_revision=job.revision,
            idempotency_key=IDEMPOTENCY_KEY_PREFIX + digest,
            trigger_key=trigger_key,
            scheduled_for=scheduled,
            available_at=scheduled if available_ms == scheduled_ms else from_ms(available_ms),
            status=OccurrenceStatus.QUEUED,
            max_attempts=job.max_attempts,
            authority=job.authority,
            payload=payload,
            principal_key=self.principal_key,
            priority=priority,
            concurrency_key=render_key(self.key_spec, payload),
            unique_key=unique_key,
            created_at=now,
            updated_at=now,
            trace_context=trace_context,
            follow_ups=chains.merged(self_chain, follow_ups) if self_chain or follow_ups else None,
            **links,
        )

    @staticmethod
    def event(occurrence: Occurrence) -> Event:
        data: dict[str, Any] = {
            "jobRevision": occurrence.job_revision,
            "scheduledFor": to_ms(occurrence.scheduled_for, "scheduled_for"),
            "triggerKey": occurrence.trigger_key,
        }
        # The audit trail of chains and batches: what caused it, what follows it, its batch.
        if occurrence.caused_by is not None:
            data["causedBy"] = occurrence.caused_by
        if occurrence.batch_id is not None:
            data["batchId"] = occurrence.batch_id
        if occurrence.follow_ups is not None:
            data["followUps"] = occurrence.follow_ups
        return new_event(
            occurrence.job_id,
            event_of(Action.ENQUEUE),
            occurrence.created_at,
            occurrence_id=occurrence.occurrence_id,
            data=data,
        )


def payload_mismatch(job: Job, trigger_key: str) -> IdempotencyPayloadMismatch:
    return IdempotencyPayloadMismatch(
        "occurrence identity was reused with a different payload",
        {"field": "payload", "job_id": job.job_id, "trigger_key": trigger_key},
    )


def found(job: Job, occurrence: Occurrence, alias: str) -> Enqueued:
    """The stored occurrence with ``occurrence``'s identity (not inserted: it was there)."""
    existing = Occurrence.objects.using(alias).filter(idempotency_key=occurrence.idempotency_key).first()
    if existing is None:
        raise IntegrityError(f"occurrence {occurrence.occurrence_id!r} was neither inserted nor found")
    if existing.occurrence_id != occurrence.occurrence_id:
        raise DataCorrupt("occurrence idempotency identity does not match stored data")
    if canonical_json(existing.payload) != canonical_json(occurrence.payload, "payload"):
        raise payload_mismatch(job, occurrence.trigger_key)
    return Enqueued(existing, True)


def insert_occurrence(
    job: Job,
    *,
    scheduled_ms: int,
    trigger_key: str,
    available_ms: int,
    payload: Any,
    now: datetime,
    alias: str,
    guard: tuple[str, list[Any]] | None = None,
    builder: Builder | None = None,
    priority: int = 0,
    trace_context: dict[str, str] | None = None,
    unique_key: str | None = None,
    follow_ups: dict[str, Any] | None = None,
    chain_as_stored: bool = False,
    links: dict[str, Any] | None = None,
    disabled_waits: bool = False,
) -> Enqueued:
    """Insert a queued occurrence of ``job`` with its event and wake workers, or find the one
    with its identity: ``(occurrence, deduplicated)``. Inside the caller's write
    transaction, except with ``guard`` on PostgreSQL (one statement, see
    ``guarded.insert_guarded``). ``guard``: ``job`` is a remembered row, not one read in this
    transaction; insert only if the stored row still has what the occurrence copies from it
    (else ``guarded.GuardFailed``, nothing written). ``builder``: one of ``job``'s, kept
    by the caller. ``trace_context``: the caller's (``tracing.capture()``), for the runs' spans;
    a schedule's slots, materialized by a worker, have no caller and carry none. ``unique_key``:
    the key a unique or debounced enqueue gives it. ``follow_ups``, ``chain_as_stored`` and
    ``links``: see :meth:`Builder.occurrence`. ``disabled_waits``: a disabled job still gets
    the occurrence, which waits until the job is enabled (a follow-up or a callback, whose
    cause is done)."""
    if not job.enabled and not disabled_waits:
        raise JobDisabled(f"job {job.job_id!r} is disabled", {"job_id": job.job_id})
    if payload is not JOB_PAYLOAD:
        payload = normalize_json(payload, "payload")
    build = builder or Builder(job)
    occurrence = build.occurrence(
        scheduled_ms,
        trigger_key,
        available_ms,
        payload,
        now,
        priority,
        trace_context=trace_context,
        unique_key=unique_key,
        follow_ups=follow_ups,
        chain_as_stored=chain_as_stored,
        **(links or {}),
    )
    event = build.event(occurrence)
    if guard is not None:
        created = guarded.insert_guarded(alias, occurrence, guard, then=[event])
    elif dialect.can_skip_conflicts(alias):
        created = bool(guarded.insert_new(alias, [occurrence]))
        if created:
            dialect.insert(alias, [event])
            notify_new_work(alias)
    else:
        try:
            # A savepoint, so that losing an insert race leaves the transaction usable.
            with transaction.atomic(using=alias):
                dialect.insert(alias, [occurrence])
            created = True
        except IntegrityError:
            created = False
        if created:
            dialect.insert(alias, [event])
            notify_new_work(alias)
    if not created:
        return found(job, occurrence, alias)
    count_enqueued(job.kind, job.authority)
    return Enqueued(occurrence, False)
