"""The occurrence lifecycle as one table: every transition an occurrence can make, what it
writes and what it records (see docs/design.md, "Occurrence lifecycle").

``TRANSITIONS`` is the state machine. Each kernel operation that changes an occurrence names
its ``Action``, asks :func:`refusal` (or :func:`check`) whether the row may make that
transition, and writes exactly the columns :func:`writes` returns, then the transition's
event. The claim, which selects its rows by a query instead of being handed one, follows the
same rows of the table (``claim``, ``reclaim``, ``expire``), and so does a debounced enqueue,
which finds its row by its unique key (``debounce``), and a policy change, which rebinds the
waiting rows of its principal (``rebind``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from ..exceptions import InvalidState, LeaseLost, NotFound, SchedulerError
from .events import (
    AUTHORITY_DEFERRED,
    AUTHORITY_DENIED,
    OCCURRENCE_ABANDONED,
    OCCURRENCE_CANCEL_REQUESTED,
    OCCURRENCE_CANCELLED,
    OCCURRENCE_CLAIMED,
    OCCURRENCE_DEAD_LETTERED,
    OCCURRENCE_DEBOUNCED,
    OCCURRENCE_ENQUEUED,
    OCCURRENCE_MADE_DUE,
    OCCURRENCE_RECLAIMED,
    OCCURRENCE_RELEASED,
    OCCURRENCE_RENEWED,
    OCCURRENCE_RETRY_SCHEDULED,
    OCCURRENCE_SUCCEEDED,
)
from .statuses import OccurrenceStatus


class Occurrence(Protocol):
    """What the rules read and set of an occurrence row (the model's, or any alike)."""

    status: str
    attempt: int
    max_attempts: int
    fence: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    cancel_requested_fence: int | None


QUEUED = OccurrenceStatus.QUEUED
RUNNING = OccurrenceStatus.RUNNING
RETRY_WAIT = OccurrenceStatus.RETRY_WAIT
SUCCEEDED = OccurrenceStatus.SUCCEEDED
DEAD_LETTER = OccurrenceStatus.DEAD_LETTER
CANCELLED = OccurrenceStatus.CANCELLED


class Action(StrEnum):
    ENQUEUE = "enqueue"
    CLAIM = "claim"
    RECLAIM = "reclaim"
    SETTLE_SUCCEEDED = "settle_succeeded"
    SETTLE_RETRY = "settle_retry"
    SETTLE_DEAD_LETTER = "settle_dead_letter"
    DENY = "deny"
    DEFER = "defer"
    RELEASE = "release"
    EXPIRE = "expire"
    CANCEL = "cancel"
    RUN_NOW = "run_now"
    DEBOUNCE = "debounce"
    RETRY_DEAD_LETTER = "retry_dead_letter"
    REQUEST_CANCEL = "request_cancel"
    SETTLE_CANCELLED = "settle_cancelled"
    EXPIRE_CANCELLED = "expire_cancelled"
    RENEW = "renew"
    RECORD_EXECUTION = "record_execution"
    RECORD_PROGRESS = "record_progress"
    ABANDON = "abandon"
    THROTTLE = "throttle"
    REBIND = "rebind"


class Fence(StrEnum):
    """What a transition does with the lease fence."""

    CHECKS = "checks"  # only the lease's holder (owner, fence, unexpired) may make it
    ADVANCES = "advances"  # fence + 1: every earlier holder's writes are refused from now on
    NAMES = "names"  # records the current fence: only the attempt holding it is affected
    NONE = "-"


class Attempt(StrEnum):
    USES = "uses"  # attempt + 1
    GIVES_BACK = "gives back"  # attempt - 1: the claim it undoes did not run the handler
    NONE = "-"


# What a request for a transition the row cannot make gets.
LEASE_LOST = LeaseLost.code
INVALID_STATE = InvalidState.code
NOT_SELECTED = "not selected"  # the claim or sweep query leaves the row alone
DEDUPLICATED = "the existing row, deduplicated"  # an enqueue of an identity already stored
ENQUEUES_ANOTHER = "a new occurrence is enqueued"  # a debounce finds no waiting row with its key

LEASE_FREED = ("lease_owner", "lease_expires_at")
LEASE_TAKEN = ("status", "attempt", "fence", "lease_owner", "lease_expires_at", "updated_at")
DEAD_LETTERED = ("status", "last_error", *LEASE_FREED, "settled_at", "updated_at")
REQUEUED = ("status", "attempt", "available_at", *LEASE_FREED, "updated_at")
SUCCEEDED_SETS = ("status", "result", *LEASE_FREED, "settled_at", "updated_at")
RETRY_SETS = ("status", "last_error", "available_at", *LEASE_FREED, "updated_at")
CANCELLED_SETS = ("status", "last_error", "settled_at", "updated_at")
MADE_DUE = ("available_at", "updated_at")
# A cancel request makes the running attempt the last one (max_attempts = attempt), so no
# claim reclaims it and its lease's expiry ends it (the expiry sweep's rows).
CANCEL_REQUESTED = ("max_attempts", "cancel_requested_at", "cancel_requested_fence", "updated_at")
CANCELLED_RUNNING = DEAD_LETTERED
DEBOUNCED = ("available_at", "payload", "updated_at")
RENEWED = ("lease_expires_at", "updated_at")  # the new expiry is never before the old one
# What a running handler records of its execution (ctx.record): a column not given is kept.
EXECUTION_RECORDED = ("metadata", "receipt", "updated_at")
# A running handler's progress report (ctx.report_progress), throttled by the worker.
PROGRESS_RECORDED = ("progress", "updated_at")
# Over its throttle's rate when claimed: it is given its own later start and waits for it.
THROTTLED = ("available_at", "updated_at")
# The lease ends now (its holder is gone): the claim takes the row back at once, as a reclaim.
LEASE_ENDED = ("lease_expires_at", "updated_at")
# A policy change moves a waiting occurrence's authority to the new revision (kernel.binding).
REBOUND = ("authority", "updated_at")


@dataclass(frozen=True)
class Transition:
    """One row of the table. ``source``: the statuses it leaves (none: the row is new);
    ``when``: the rest of its condition, in words; ``target``: None keeps the status;
    ``sets``: the columns its UPDATE writes, exactly (none when it inserts a row);
    ``event``: what it appends to the log (None: nothing);
    ``new_row``: the target is a new occurrence, the source row stays as history;
    ``otherwise``: what a request gets when the row is not in ``source``."""

    action: Action
    source: tuple[OccurrenceStatus, ...]
    when: str
    target: OccurrenceStatus | None
    sets: tuple[str, ...]
    event: str | None
    fence: Fence
    attempt: Attempt
    otherwise: str
    new_row: bool = False


T, A = Transition, Action
# fmt: off
TRANSITIONS: tuple[Transition, ...] = (
    # action, from, when, to,
    #   sets, event, fence, attempt, otherwise
    T(A.ENQUEUE, (), "", QUEUED,
      (), OCCURRENCE_ENQUEUED, Fence.NONE, Attempt.NONE, DEDUPLICATED, new_row=True),
    T(A.CLAIM, (QUEUED, RETRY_WAIT), "due (available_at <= now), job enabled", RUNNING,
      LEASE_TAKEN, OCCURRENCE_CLAIMED, Fence.ADVANCES, Attempt.USES, NOT_SELECTED),
    T(A.RECLAIM, (RUNNING,), "lease expired, attempt < max_attempts", RUNNING,
      LEASE_TAKEN, OCCURRENCE_RECLAIMED, Fence.ADVANCES, Attempt.USES, NOT_SELECTED),
    T(A.SETTLE_SUCCEEDED, (RUNNING,), "the handler succeeded", SUCCEEDED,
      SUCCEEDED_SETS, OCCURRENCE_SUCCEEDED, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.SETTLE_RETRY, (RUNNING,), "failed, retryable, attempt < max_attempts", RETRY_WAIT,
      RETRY_SETS, OCCURRENCE_RETRY_SCHEDULED, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.SETTLE_DEAD_LETTER, (RUNNING,), "failed, not retryable or attempt = max_attempts", DEAD_LETTER,
      DEAD_LETTERED, OCCURRENCE_DEAD_LETTERED, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.DENY, (RUNNING,), "authority refuses the run", DEAD_LETTER,
      DEAD_LETTERED, AUTHORITY_DENIED, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.DEFER, (RUNNING,), "budget spent until its window ends", QUEUED,
      REQUEUED, AUTHORITY_DEFERRED, Fence.CHECKS, Attempt.GIVES_BACK, LEASE_LOST),
    T(A.RELEASE, (RUNNING,), "the worker stops before the handler runs", QUEUED,
      REQUEUED, OCCURRENCE_RELEASED, Fence.CHECKS, Attempt.GIVES_BACK, LEASE_LOST),
    T(A.EXPIRE, (RUNNING,), "lease expired, attempt >= max_attempts", DEAD_LETTER,
      DEAD_LETTERED, OCCURRENCE_DEAD_LETTERED, Fence.NONE, Attempt.NONE, NOT_SELECTED),
    T(A.CANCEL, (QUEUED, RETRY_WAIT), "", CANCELLED,
      CANCELLED_SETS, OCCURRENCE_CANCELLED, Fence.NONE, Attempt.NONE, INVALID_STATE),
    T(A.RUN_NOW, (QUEUED, RETRY_WAIT), "available_at > now (else nothing is written)", None,
      MADE_DUE, OCCURRENCE_MADE_DUE, Fence.NONE, Attempt.NONE, INVALID_STATE),
    T(A.DEBOUNCE, (QUEUED, RETRY_WAIT), "an enqueue with debounce and this row's unique key", None,
      DEBOUNCED, OCCURRENCE_DEBOUNCED, Fence.NONE, Attempt.NONE, ENQUEUES_ANOTHER),
    T(A.RETRY_DEAD_LETTER, (DEAD_LETTER,), "an operator retries it", QUEUED,
      (), OCCURRENCE_ENQUEUED, Fence.NONE, Attempt.NONE, INVALID_STATE, new_row=True),
    T(A.REQUEST_CANCEL, (RUNNING,), "no request for this attempt yet (else nothing is written)", None,
      CANCEL_REQUESTED, OCCURRENCE_CANCEL_REQUESTED, Fence.NAMES, Attempt.NONE, INVALID_STATE),
    T(A.SETTLE_CANCELLED, (RUNNING,), "cancel requested; failed, timed out or given back", CANCELLED,
      CANCELLED_RUNNING, OCCURRENCE_CANCELLED, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.EXPIRE_CANCELLED, (RUNNING,), "cancel requested, lease expired", CANCELLED,
      CANCELLED_RUNNING, OCCURRENCE_CANCELLED, Fence.NONE, Attempt.NONE, NOT_SELECTED),
    T(A.RENEW, (RUNNING,), "the lease is extended (never shortened)", None,
      RENEWED, OCCURRENCE_RENEWED, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.RECORD_EXECUTION, (RUNNING,), "the handler records its metadata or receipt", None,
      EXECUTION_RECORDED, None, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.RECORD_PROGRESS, (RUNNING,), "the handler reports its progress", None,
      PROGRESS_RECORDED, None, Fence.CHECKS, Attempt.NONE, LEASE_LOST),
    T(A.ABANDON, (RUNNING,), "its holder's process is known to have ended; lease unexpired", None,
      LEASE_ENDED, OCCURRENCE_ABANDONED, Fence.NONE, Attempt.NONE, NOT_SELECTED),
    T(A.THROTTLE, (QUEUED, RETRY_WAIT), "due, but over its throttle's rate when claimed", None,
      THROTTLED, None, Fence.NONE, Attempt.NONE, NOT_SELECTED),
    T(A.REBIND, (QUEUED, RETRY_WAIT), "its principal's policy changes to a revision it follows", None,
      REBOUND, None, Fence.NONE, Attempt.NONE, NOT_SELECTED),
)
# fmt: on
del T, A

TRANSITION: dict[Action, Transition] = {t.action: t for t in TRANSITIONS}
_EVENTS = {t.action: t.event for t in TRANSITIONS if t.event is not None}


def event_of(action: Action) -> str:
    """The type of the event ``action`` appends (``KeyError`` for one that appends none)."""
    return _EVENTS[action]


# The conditions the claim and the expiry sweep select their rows by (the ``when`` of claim,
# reclaim and expire), each written once. As SQL over the models' columns for the claim's
# statements: ``{o.<field>}`` and the status literals (``{queued}``) are filled in from
# ``_meta`` by the claim, ``{now}`` with its time parameter.
CLAIMABLE_SQL = "{o.status} IN ({queued}, {retry_wait}) AND {o.available_at} <= {now}"
RECLAIMABLE_SQL = (
    "{o.status} = {running} AND {o.lease_expires_at} <= {now} AND {o.attempt} < {o.max_attempts}"
)


# How a refusal with ``INVALID_STATE`` names the action in its message.
_VERBS = {
    Action.CANCEL: "cancelled",
    Action.RUN_NOW: "made due",
    Action.RETRY_DEAD_LETTER: "retried",
    Action.REQUEST_CANCEL: "asked to stop",
}

# How the database works out each expression the table writes, for the row in memory.
_DERIVED: dict[Attempt | Fence | str, Callable[[Occurrence], Any]] = {
    Attempt.USES: lambda row: row.attempt + 1,
    Attempt.GIVES_BACK: lambda row: row.attempt - 1 if row.attempt > 0 else row.attempt,
    Fence.ADVANCES: lambda row: row.fence + 1,
    "cancel_requested_fence": lambda row: row.fence,
    "max_attempts": lambda row: row.attempt,
}


# The same expressions as SQL over the models' columns (``{o.<field>}``, filled in from
# ``_meta`` by the writer), for a statement built once instead of by the ORM: the claim's.
_DERIVED_SQL: dict[Attempt | Fence | str, str] = {
    Attempt.USES: "{o.attempt} + 1",
    Fence.ADVANCES: "{o.fence} + 1",
}


@dataclass(frozen=True)
class _Writes:
    """What a transition's UPDATE writes, worked out once from its row: ``fixed`` values,
    the ``timed`` columns that take the time of the write, the ``needed`` ones its writer
    gives, and the ``derived`` ones the database computes from the row (see :func:`applied`)."""

    fixed: dict[str, Any]
    timed: tuple[str, ...]
    needed: frozenset[str]
    sets: frozenset[str]
    derived: tuple[tuple[str, Callable[[Occurrence], Any]], ...]
    derived_by: tuple[tuple[str, Attempt | Fence | str], ...]  # the _DERIVED key of each


def _writes_of(transition: Transition) -> _Writes:
    fixed: dict[str, Any] = {}
    timed: list[str] = []
    needed: set[str] = set()
    derived_by: list[tuple[str, Attempt | Fence | str]] = []
    for column in transition.sets:
        if column == "status" and transition.target is not None:
            fixed[column] = transition.target
        elif column in ("updated_at", "settled_at", "cancel_requested_at"):
            timed.append(column)
        elif column in LEASE_FREED and transition.target not in (None, RUNNING):
            fixed[column] = None
        elif column == "attempt" and transition.attempt is not Attempt.NONE:
            derived_by.append((column, transition.attempt))
        elif column == "fence" and transition.fence is Fence.ADVANCES:
            derived_by.append((column, Fence.ADVANCES))
        elif column == "cancel_requested_fence" or (
            column == "max_attempts" and transition.action is Action.REQUEST_CANCEL
        ):
            derived_by.append((column, column))
        else:
            needed.add(column)
    derived = tuple((column, _DERIVED[key]) for column, key in derived_by)
    sets = frozenset(transition.sets)
    return _Writes(fixed, tuple(timed), frozenset(needed), sets, derived, tuple(derived_by))


_WRITES = {transition.action: _writes_of(transition) for transition in TRANSITIONS}


def writes(action: Action, now: datetime, **given: Any) -> dict[str, Any]:
    """The plain column values the ``action``'s UPDATE writes: its ``sets`` but the ones the
    database computes from the row (:func:`derived_by`; ``kernel.transitions.writes`` adds
    them as expressions). The table decides the status, the times (``now``) and the freed
    lease; the writer gives the rest (a result, an error, ``available_at``, a new lease) in
    ``given``. A column the table does not set, or one it needs and was not given, is a
    bug in the writer: ``TypeError``. Settling calls this per occurrence, so the work is
    done once, in ``_WRITES``."""
    plan = _WRITES[action]
    if not plan.needed <= given.keys() <= plan.sets:
        extra = sorted(given.keys() - plan.sets)
        if extra:
            raise TypeError(f"{action} does not set {', '.join(extra)}")
        raise TypeError(f"{action} needs a value for {', '.join(sorted(plan.needed - given.keys()))}")
    values = {**plan.fixed, **given}
    for column in plan.timed:
        values[column] = now
    return values


def derived_by(action: Action) -> tuple[tuple[str, Attempt | Fence | str], ...]:
    """The columns the ``action``'s UPDATE computes from the row, each with what it computes
    (an ``Attempt``, a ``Fence``, or the column's own name)."""
    return _WRITES[action].derived_by


def sql_sets(action: Action) -> dict[str, str | None]:
    """The columns the ``action``'s UPDATE writes, each with its SQL (``{o.<field>}`` for a
    column) where the database computes it from the row, None where :func:`writes` gives
    its value as a parameter."""
    sets: dict[str, str | None] = dict.fromkeys(sorted(_WRITES[action].sets))
    for column, kind in _WRITES[action].derived_by:
        sql = _DERIVED_SQL.get(kind)
        if sql is None:
            raise TypeError(f"{action} writes {column} by an expression with no SQL here")
        sets[column] = sql
    return sets


def applied(action: Action, row: Occurrence, values: dict[str, Any]) -> None:
    """Make ``row`` in memory what the ``action``'s UPDATE with ``values`` (from
    :func:`writes`, the writer's own values plain ones) made of it in the database: the
    table's expressions (attempt, fence, the cancel request's) worked out from ``row`` as
    the database does, the rest as written."""
    derived = [(column, compute(row)) for column, compute in _WRITES[action].derived]
    for column, value in values.items():
        setattr(row, column, value)
    for column, value in derived:
        setattr(row, column, value)


def holds_lease(occurrence: Occurrence, owner: str, fence: int, now: datetime) -> bool:
    """The fence rule: ``owner`` holds the running occurrence's lease at ``fence``, unexpired."""
    return (
        occurrence.status == OccurrenceStatus.RUNNING
        and occurrence.lease_owner == owner
        and occurrence.fence == fence
        and occurrence.lease_expires_at is not None
        and occurrence.lease_expires_at > now
    )


def cancel_requested(occurrence: Occurrence) -> bool:
    """A cancel was requested for the occurrence's current attempt (a request that named an
    earlier fence is no longer for anything that runs)."""
    requested = occurrence.cancel_requested_fence
    return requested is not None and requested == occurrence.fence


def lease_lost(
    occurrence_id: str, current: Occurrence | None, owner: str, fence: int, now: datetime
) -> LeaseLost:
    """The ``SCHEDULER_LEASE_LOST`` error of a write by ``owner`` at ``fence`` that the
    fence rule refuses, saying why."""
    if current is None:
        reason = "not_found"
    elif current.status != OccurrenceStatus.RUNNING:
        reason = "not_running"
    elif current.lease_owner != owner:
        reason = "wrong_owner"
    elif current.fence != fence:
        reason = "wrong_fence"
    else:
        reason = "lease_expired"
    details: dict[str, Any] = {
        "occurrence_id": occurrence_id,
        "reason": reason,
        "owner": owner,
        "fence": fence,
    }
    if current is not None:
        details.update(status=current.status, current_fence=current.fence)
    return LeaseLost(f"lease on occurrence {occurrence_id!r} is lost ({reason.replace('_', ' ')})", details)


def refusal(
    action: Action,
    occurrence_id: str,
    current: Occurrence | None,
    *,
    owner: str = "",
    fence: int = 0,
    now: datetime | None = None,
) -> SchedulerError | None:
    """Why ``current`` (None: not found) may not make the ``action`` transition, or None if
    it may: the transition's ``otherwise``. A fenced one needs the lease held by ``owner``
    at ``fence`` at ``now`` (``LeaseLost``); the others need the row (``NotFound``) in one
    of their source statuses (``InvalidState``). The claim, the sweep, the enqueue and the debounce pick
    their rows by query and never ask."""
    transition = TRANSITION[action]
    if transition.otherwise == LEASE_LOST:
        if now is None:
            raise TypeError(f"{action} checks the lease: give now")
        if current is None or not holds_lease(current, owner, fence, now):
            return lease_lost(occurrence_id, current, owner, fence, now)
        return None
    if transition.otherwise != INVALID_STATE:
        raise TypeError(f"{action} is not asked for on one occurrence ({transition.otherwise})")
    if current is None:
        return NotFound(f"occurrence {occurrence_id!r} does not exist", {"occurrence_id": occurrence_id})
    if current.status not in transition.source:
        allowed = " or ".join(transition.source)
        return InvalidState(
            f"occurrence {occurrence_id!r} is {current.status}; "
            f"only {allowed} occurrences can be {_VERBS.get(action, action)}",
            {"occurrence_id": occurrence_id, "status": current.status},
        )
    return None


def check(
    action: Action,
    occurrence_id: str,
    current: Occurrence | None,
    *,
    owner: str = "",
    fence: int = 0,
    now: datetime | None = None,
) -> None:
    """:func:`refusal`, raised."""
    error = refusal(action, occurrence_id, current, owner=owner, fence=fence, now=now)
    if error is not None:
        raise error
