"""Cancelling: the one writer of the ``cancel`` transition, whatever asked for it (an
operator, a job's superseded or misfired schedule slots, a batch's cancel), and the request
that asks a running occurrence to stop.

A waiting (queued, retry_wait) occurrence is cancelled at once by :func:`cancel_pending`,
which also settles its reservation and tells what follows its end (its batch, through
``followups.reached_terminal``). A running handler may already have acted and Python
cannot stop its thread, so a cancel of a running occurrence is a request (the
``request_cancel`` transition): it records who asked and why, names the running attempt by
its fence and makes that attempt the last one. The worker holding the lease learns it at
its next renewal and tells the handler (``ctx.cancel_requested``); the attempt then ends
``cancelled`` when its handler fails (``OccurrenceCancelled`` included), times out or is
given back (``settle_cancelled``), or when its lease expires (``expire_cancelled``). A
handler that succeeds anyway keeps its result: the work was done. Part of the kernel, the
only writer of occurrence state."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections

from .. import conf
from ..db.dialect import alias_for, column_max, insert, write_transaction
from ..exceptions import InvalidArgument, InvalidState
from ..models import PENDING_STATUSES, Batch, Occurrence, OccurrenceStatus
from ..rules.events import BATCH_CANCELLED
from ..rules.identity import normalize_json
from ..rules.lifecycle import Action, applied, cancel_requested, check, event_of
from ..rules.validation import normalize_identifier, normalize_int
from . import batches
from .authority.budgets import settle_cancelled
from .events import new_event
from .followups import TERMINAL_FIELDS, reached_terminal
from .transitions import writes
from .writing import writing

MAX_REQUESTED_BY = 256
MAX_CANCEL_REASON = 1024
# What the cancel reads of each waiting row it ends: its event's and what follows its end.
CANCEL_FIELDS = ("occurrence_id", "job_id", "status", *TERMINAL_FIELDS)
# A batch's waiting members a cancel ends per transaction (its row locks are held that long).
CANCEL_CHUNK = 1000
CANCEL_RETRIES = 3
# What the reservation of an attempt cancelled while it ran records as its reason.
CANCELLED_WHILE_RUNNING = "cancel requested while running"


def requester(requested_by: Any) -> str | None:
    """Who asked for a cancel (a user name, a service), as the event records it."""
    if requested_by is None:
        return None
    if not isinstance(requested_by, str) or not requested_by.strip():
        raise InvalidArgument("requested_by", "must be a non-empty string or None")
    value: str = normalize_json(requested_by, "requested_by")
    if len(value.encode("utf-8")) > MAX_REQUESTED_BY:
        raise InvalidArgument("requested_by", f"must be at most {MAX_REQUESTED_BY} bytes")
    return value


def cancel_reason(reason: str | None) -> str | None:
    """Why an operator cancelled (or made due) an occurrence, as the event records it."""
    if reason is not None:
        if not isinstance(reason, str):
            raise InvalidArgument("reason", "must be a string or None")
        reason = normalize_json(reason, "reason")
        if len(reason.encode("utf-8")) > MAX_CANCEL_REASON:
            raise InvalidArgument("reason", f"must be at most {MAX_CANCEL_REASON} bytes")
    return reason


def cancelled_error(error: dict[str, Any] | None) -> dict[str, Any]:
    """The ``last_error`` of an attempt that ended cancelled after a request, with the
    handler's own failure (a timeout, ``OccurrenceCancelled``) if it had one."""
    stored: dict[str, Any] = {"code": "SCHEDULER_CANCELLED", "message": CANCELLED_WHILE_RUNNING}
    if error is not None:
        stored["error"] = error
    return stored


def request_cancel(
    occurrence_id: str,
    current: Occurrence | None,
    *,
    fence: int | None,
    reason: str | None,
    requested_by: str | None,
    now: datetime,
    alias: str,
) -> Occurrence:
    """Ask the running attempt of the locked ``current`` to stop (inside the caller's
    transaction). ``fence``, if given, must be the running attempt's: a request never
    reaches a later attempt. A second request for the same attempt writes nothing."""
    check(Action.REQUEST_CANCEL, occurrence_id, current)
    assert current is not None  # check refuses a missing row
    if fence is not None and current.fence != fence:
        raise InvalidState(
            f"occurrence {occurrence_id!r} runs at fence {current.fence}, not {fence}: "
            "the attempt the cancel names is over",
            {"occurrence_id": occurrence_id, "fence": fence, "current_fence": current.fence},
        )
    if cancel_requested(current):
        return current
    data: dict[str, Any] = {
        "reason": reason,
        "requestedBy": requested_by,
        "attempt": current.attempt,
        "maxAttempts": current.max_attempts,
    }
    values = writes(Action.REQUEST_CANCEL, now)
    with writing(Action.REQUEST_CANCEL):
        Occurrence.objects.using(alias).filter(pk=occurrence_id).update(**values)
    applied(Action.REQUEST_CANCEL, current, values)
    new_event(
        current.job_id,
        event_of(Action.REQUEST_CANCEL),
        now,
        occurrence_id=occurrence_id,
        owner_id=current.lease_owner,
        fence=current.fence,
        data=data,
    ).save(using=alias)
    return current


def cancel_pending(
    rows: Sequence[Occurrence], reason: str | None, now: datetime, alias: str, **data: Any
) -> None:
    """The ``cancel`` transition of waiting occurrences: ``rows``, selected pending and locked
    by the caller with at least :data:`CANCEL_FIELDS`, are cancelled in one UPDATE, their
    reservations settled, one event each (with ``data``), and what follows their end told
    (their batches looked at once this transaction commits). The rows in memory are left as
    the database has them."""
    if not rows:
        return
    ids = [row.pk for row in rows]
    values = writes(Action.CANCEL, now, last_error={"code": "SCHEDULER_CANCELLED", "message": reason})
    with writing(Action.CANCEL):
        Occurrence.objects.using(alias).filter(pk__in=ids).update(**values)
    settle_cancelled(ids, reason, now, alias)
    event = event_of(Action.CANCEL)
    events = []
    for row in rows:
        previous = row.status
        applied(Action.CANCEL, row, values)
        events.append(
            new_event(
                row.job_id,
                event,
                now,
                occurrence_id=row.pk,
                data={"reason": reason, "previousStatus": previous, **data},
            )
        )
    insert(alias, events)
    reached_terminal(rows, now, alias)


def cancel(
    occurrence_id: str,
    *,
    reason: str | None = None,
    requested_by: str | None = None,
    fence: int | None = None,
    using: str | None = None,
) -> Occurrence:
    """Cancel an occurrence. A queued or retry_wait one is cancelled at once. A running one
    is asked to stop (:func:`request_cancel`): it stays running until the worker holding it
    ends it ``cancelled``, and this returns it running, with ``cancel_requested_at`` set.
    ``requested_by`` names who asked, in the event; ``fence`` names the running attempt
    the request is for (``InvalidState`` if that attempt is over). ``InvalidState`` for a
    terminal occurrence, ``NotFound`` for an unknown one; nothing is written then."""
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    reason = cancel_reason(reason)
    requested_by = requester(requested_by)
    if fence is not None:
        fence = normalize_int(fence, "fence", minimum=1, maximum=column_max(Occurrence, "fence"))
    now = conf.now()
    with write_transaction(using) as alias:
        occurrence = Occurrence.objects.using(alias).select_for_update().filter(pk=occurrence_id).first()
        if fence is not None or (occurrence is not None and occurrence.status == OccurrenceStatus.RUNNING):
            return request_cancel(
                occurrence_id,
                occurrence,
                fence=fence,
                reason=reason,
                requested_by=requested_by,
                now=now,
                alias=alias,
            )
        check(Action.CANCEL, occurrence_id, occurrence)
        assert occurrence is not None  # check refuses a missing row
        asked = {} if requested_by is None else {"requestedBy": requested_by}
        cancel_pending([occurrence], reason, now, alias, **asked)
    return occurrence


def cancel_batch(
    batch_id: str, *, reason: str | None = None, requested_by: str | None = None, using: str | None = None
) -> Batch:
    """Cancel a batch: close it and cancel its waiting (queued, retry_wait) members; running
    ones finish as they will. It then completes like any batch, its callback seeing the
    cancelled members in its counts and ``cancelled`` true. ``InvalidState`` once it is
    completed. The members are cancelled a chunk per transaction, so a large batch never
    holds many row locks at once."""
    batch_id = batches.checked_batch_id(batch_id)
    if reason is not None and not isinstance(reason, str):
        raise InvalidArgument("reason", "must be a string or None")
    reason = normalize_json(reason, "reason") if reason is not None else None
    requested_by = requester(requested_by)
    now = conf.now()
    batch = batches.mark_cancelled(batch_id, requested_by, now, using)
    cancelled, failures = 0, 0
    while True:
        try:
            with write_transaction(using) as alias:
                ended = _cancel_waiting(batch_id, reason or "batch cancelled", now, alias)
                if ended < CANCEL_CHUNK:
                    batches.batch_event(
                        batch,
                        BATCH_CANCELLED,
                        now,
                        reason=reason,
                        requestedBy=requested_by,
                        cancelled=cancelled + ended,
                    ).save(using=alias)
                    if not ended:  # else cancel_pending had it looked at
                        batches.look_after_commit([batch_id], alias)
        except DatabaseError:
            # A chunk's locks can meet a claim's (MariaDB's gap locks) and lose as a deadlock:
            # the chunks before it are committed, so take it again, unless a caller's
            # transaction holds this one (it is broken now: the caller must see the error).
            failures += 1
            if failures > CANCEL_RETRIES or connections[alias_for(using)].in_atomic_block:
                raise
            continue
        cancelled += ended
        if ended < CANCEL_CHUNK:
            break
    batch.refresh_from_db(using=alias_for(using))
    return batch


def _cancel_waiting(batch_id: str, reason: str, now: datetime, alias: str) -> int:
    """Cancel up to a chunk of the batch's waiting members (the ``cancel`` transition)."""
    rows = list(
        Occurrence.objects.using(alias)
        .select_for_update()
        .filter(batch_id=batch_id, status__in=PENDING_STATUSES)
        .order_by("pk")
        .only(*CANCEL_FIELDS)[:CANCEL_CHUNK]
    )
    cancel_pending(rows, reason, now, alias, batchId=batch_id)
    return len(rows)
