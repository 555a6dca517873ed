"""Cancelling a running occurrence: the request, and how the attempt it names then ends.

A running handler may already have acted and Python cannot stop its thread, so a cancel of
a running occurrence is a request (the ``request_cancel`` transition): it records who asked
and why, names the running attempt by its fence and makes that attempt the last one. The
worker holding the lease learns it at its next renewal and tells the handler
(``ctx.cancel_requested``); the attempt then ends ``cancelled`` when its handler fails
(``OccurrenceCancelled`` included), times out or is given back (``settle_cancelled``), or
when its lease expires (``expire_cancelled``). A handler that succeeds anyway keeps its
result: the work was done. Part of the kernel, the only writer of occurrence state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..db.dialect import insert_rows
from ..exceptions import InvalidArgument, InvalidState
from ..models import Occurrence
from ..rules.events import new_event
from ..rules.identity import normalize_json
from ..rules.lifecycle import TRANSITION, Action, cancel_requested, check, writes
from .budgets import settle_cancelled

MAX_REQUESTED_BY = 256
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
    Occurrence.objects.using(alias).filter(pk=occurrence_id).update(**writes(Action.REQUEST_CANCEL, now))
    current.max_attempts = current.attempt
    current.cancel_requested_at = current.updated_at = now
    current.cancel_requested_fence = current.fence
    new_event(
        current.job_id,
        TRANSITION[Action.REQUEST_CANCEL].event,
        now,
        occurrence_id=occurrence_id,
        owner_id=current.lease_owner,
        fence=current.fence,
        data=data,
    ).save(using=alias)
    return current


def cancel_pending(
    rows: list[tuple[str, str, str]], reason: str, now: datetime, alias: str, **data: Any
) -> None:
    """The ``cancel`` transition of many waiting occurrences at once, ``rows`` being
    ``(occurrence_id, job_id, previous status)`` of rows the caller selected pending and
    locked: one UPDATE, their reservations settled, one event each (with ``data``)."""
    if not rows:
        return
    ids = [pk for pk, _, _ in rows]
    Occurrence.objects.using(alias).filter(pk__in=ids).update(
        **writes(Action.CANCEL, now, last_error={"code": "SCHEDULER_CANCELLED", "message": reason})
    )
    settle_cancelled(ids, reason, now, alias)
    event = TRANSITION[Action.CANCEL].event
    insert_rows(
        alias,
        [
            new_event(
                job_id,
                event,
                now,
                occurrence_id=pk,
                data={"reason": reason, "previousStatus": status, **data},
            )
            for pk, job_id, status in rows
        ],
    )
