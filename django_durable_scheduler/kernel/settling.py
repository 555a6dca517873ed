"""Settling: recording the outcome of a held occurrence (settle, settle_many), giving a
held lease back (release), and the authority verdicts that end a claim without running it
(deny, defer). Claiming is ``claiming``'s; renewing and the expiry sweep are ``leases``'s.
Part of the kernel, the only writer of occurrence state: each operation is one short
transaction that appends the event recording it.

Every operation here is made by the lease's holder: the fence rule (owner, fence,
unexpired; ``lifecycle.refusal``) is checked under the row lock, so a worker that lost its
lease can never overwrite the newer owner's outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from .. import conf
from ..db.dialect import column_max, insert, write_transaction
from ..exceptions import InvalidArgument, LeaseLost
from ..models import TERMINAL_STATUSES, Job, Occurrence, OccurrenceStatus
from ..rules.identity import normalize_json
from ..rules.lifecycle import Action, applied, cancel_requested, event_of, refusal

# The fence rule, also used by the authority checks as settling.holds_lease and settling.lease_lost.
from ..rules.lifecycle import holds_lease as holds_lease
from ..rules.lifecycle import lease_lost as lease_lost
from ..rules.outcomes import (
    FAILED,
    MAX_RESULT_BYTES,
    SUCCEEDED,
    Outcome,
    OutcomeStatus,
    backoff_delay_ms,
    check_result,
    normalize_error,
)
from ..rules.validation import (
    from_ms,
    iso_ms,
    key_label,
    normalize_bool,
    normalize_identifier,
    normalize_int,
    to_ms,
)
from .authority.budgets import settle_reservations
from .cancelling import CANCELLED_WHILE_RUNNING, cancelled_error
from .events import new_event
from .followups import TERMINAL_FIELDS, reached_terminal
from .transitions import writes
from .writing import writing

MAX_FENCE = column_max(Occurrence, "fence")
# What settling reads of each held row under the lock: its state, lease, attempts and job
# (the returned occurrences load the rest on first access).
LEASE_FIELDS: tuple[str, ...] = (
    "occurrence_id",
    "job_id",
    "status",
    "attempt",
    "max_attempts",
    "fence",
    "lease_owner",
    "lease_expires_at",
    "cancel_requested_fence",
    *TERMINAL_FIELDS,
)


def _owner(owner: Any) -> str:
    return normalize_identifier(owner, "owner")


# --------------------------------------------------------------------------- expired leases


# --------------------------------------------------------------------------- renew / settle


def lease_args(occurrence_id: Any, owner: Any, fence: Any) -> tuple[str, str, int]:
    return (
        normalize_identifier(occurrence_id, "occurrence_id"),
        _owner(owner),
        normalize_int(fence, "fence", minimum=1, maximum=MAX_FENCE),
    )


SETTLE_ITEM_KEYS = frozenset(
    {"occurrence_id", "fence", "outcome", "result", "error", "retryable", "retry_at"}
)


def _settle_args(
    occurrence_id: Any,
    fence: Any,
    outcome: Any,
    result: Any,
    error: Any,
    retryable: Any,
    retry_at: Any,
    prefix: str = "",
) -> Outcome:
    """A settle request checked, as the :class:`Outcome` settling writes (``retry_at`` a
    datetime, to the millisecond, as it is stored)."""
    occurrence_id = normalize_identifier(occurrence_id, f"{prefix}occurrence_id")
    fence = normalize_int(fence, f"{prefix}fence", minimum=1, maximum=MAX_FENCE)
    status = OutcomeStatus.parse(outcome, f"{prefix}outcome")
    result_value = check_result(result, f"{prefix}result")
    return Outcome(
        occurrence_id,
        fence,
        status,
        result_value,
        normalize_error(error, f"{prefix}error"),
        normalize_bool(retryable, f"{prefix}retryable"),
        None if retry_at is None else from_ms(to_ms(retry_at, f"{prefix}retry_at")),
    )


def _settle_item(index: int, item: Any) -> Outcome:
    """Item ``index`` of :func:`settle_many`, an :class:`Outcome` or a dict of
    :func:`settle`'s arguments, checked."""
    prefix = f"items[{index}]."
    if isinstance(item, Outcome):
        return _settle_args(
            item.occurrence_id,
            item.fence,
            item.status,
            item.result,
            item.error,
            item.retryable,
            item.retry_at,
            prefix,
        )
    if not isinstance(item, dict):
        raise InvalidArgument(f"items[{index}]", "must be a dict")
    unknown = sorted(key_label(key) for key in item if key not in SETTLE_ITEM_KEYS)
    if unknown:
        raise InvalidArgument(f"{prefix}{unknown[0]}", "is not a settle argument")
    return _settle_args(
        item.get("occurrence_id"),
        item.get("fence"),
        item.get("outcome"),
        item.get("result"),
        item.get("error"),
        item.get("retryable", True),
        item.get("retry_at"),
        prefix,
    )


def settle(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    outcome: OutcomeStatus | str,
    result: Any = None,
    error: Any = None,
    retryable: bool = True,
    retry_at: datetime | int | None = None,
    using: str | None = None,
) -> Occurrence:
    """Record the outcome of a held occurrence.

    ``outcome``: an :class:`OutcomeStatus` or its string. ``succeeded`` stores ``result``.
    ``failed`` goes to retry_wait (at ``retry_at`` or the job's backoff) when ``retryable``
    and attempts remain, else to dead_letter.
    ``SCHEDULER_LEASE_LOST`` unless the caller holds an unexpired lease with this fence.
    Returns the settled occurrence; its fields other than state, lease, attempts and the
    written outcome (``payload``, ``authority`` ...) are loaded on first access.
    """
    spec = _settle_args(occurrence_id, fence, outcome, result, error, retryable, retry_at)
    owner = _owner(owner)
    now = conf.now()
    with write_transaction(using) as alias:
        (settled,) = _settle_held([spec], owner, now, alias)
    if isinstance(settled, LeaseLost):
        raise settled
    return settled


def settle_many(
    items: Iterable[Outcome | dict[str, Any]], *, owner: str, using: str | None = None
) -> list[Occurrence | LeaseLost]:
    """Settle many held occurrences in one transaction (what the worker does with the
    outcomes of a batch). Each item is an :class:`Outcome` or a dict of :func:`settle`'s
    arguments (``occurrence_id``, ``fence``, ``outcome`` and optionally ``result``,
    ``error``, ``retryable``, ``retry_at``). Bad input raises ``InvalidArgument`` naming the item and
    writes nothing. Returns, per item in order, the settled occurrence, or the
    ``LeaseLost`` error of an item whose lease is no longer held (the others settle).
    """
    owner = _owner(owner)
    if isinstance(items, dict | str | Outcome) or not isinstance(items, Iterable):
        raise InvalidArgument("items", "must be a list of dicts")
    specs = [_settle_item(index, item) for index, item in enumerate(items)]
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        if spec.occurrence_id in seen:
            raise InvalidArgument(f"items[{index}].occurrence_id", "appears twice")
        seen.add(spec.occurrence_id)
    if not specs:
        return []
    now = conf.now()
    with write_transaction(using) as alias:
        return _settle_held(specs, owner, now, alias)


def _group_key(values: dict[str, Any]) -> str:
    """A key under which rows that get equal values are written with one statement. Any
    deterministic text will do (1 and 1.0 merely form two groups): the C JSON encoder,
    not the canonical one, as this runs for every settled occurrence."""
    return json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)


def _lock_settled(specs: Sequence[Outcome], alias: str) -> dict[str, Occurrence]:
    return {
        row.pk: row
        for row in Occurrence.objects.using(alias)
        .select_for_update()
        .filter(pk__in=[spec.occurrence_id for spec in specs])
        .order_by("pk")
        .only(*LEASE_FIELDS)
    }


def _backoff_delays(
    specs: Sequence[Outcome], locked: dict[str, Occurrence], alias: str
) -> dict[str, tuple[int, int]]:
    """(base, max) retry delay of the jobs whose failed occurrences retry at their backoff."""
    needs_backoff = {
        locked[spec.occurrence_id].job_id
        for spec in specs
        if spec.occurrence_id in locked and spec.status == FAILED and spec.retryable and spec.retry_at is None
    }
    # Read, not locked: locking the job row would serialize every settle of a job.
    return {
        job_id: (base_ms, max_ms)
        for job_id, base_ms, max_ms in Job.objects.using(alias)
        .filter(pk__in=needs_backoff)
        .values_list("pk", "retry_base_delay_ms", "retry_max_delay_ms")
    }


def _settle_action(spec: Outcome, current: Occurrence | None) -> Action:
    if spec.status == SUCCEEDED:
        return Action.SETTLE_SUCCEEDED
    if current is not None and cancel_requested(current) and current.fence == spec.fence:
        return Action.SETTLE_CANCELLED  # any failure after a cancel request: no retry
    if spec.retryable and current is not None and current.attempt < current.max_attempts:
        return Action.SETTLE_RETRY
    return Action.SETTLE_DEAD_LETTER


def _settle_values(
    action: Action, spec: Outcome, current: Occurrence, delays: dict[str, tuple[int, int]], now: datetime
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values the writer gives ``action``'s UPDATE on ``current`` (``lifecycle.writes``
    adds the table's), and its event's data."""
    data: dict[str, Any] = {"attempt": current.attempt, "maxAttempts": current.max_attempts}
    if action is Action.SETTLE_SUCCEEDED:
        if cancel_requested(current):
            data["cancelRequested"] = True  # it finished before it saw the request: kept
        return {"result": spec.result}, data
    if action is Action.SETTLE_CANCELLED:
        data["reason"] = "cancel_requested"
        return {"last_error": cancelled_error(spec.error)}, data
    if action is Action.SETTLE_RETRY:
        if spec.retry_at is None:
            base_ms, max_ms = delays[current.job_id]
            available = now + timedelta(
                milliseconds=backoff_delay_ms(current.attempt, base_ms, max_ms, conf.settings.RETRY_JITTER)
            )
        else:
            available = max(now, cast(datetime, spec.retry_at))
        data["retryAt"] = iso_ms(available)
        return {"available_at": available, "last_error": spec.error}, data
    data["reason"] = "max_attempts" if spec.retryable else "not_retryable"
    return {"last_error": spec.error}, data


def _settle_held(
    specs: Sequence[Outcome], owner: str, now: datetime, alias: str
) -> list[Occurrence | LeaseLost]:
    """The body of settle/settle_many, inside the transaction: lock the rows, refuse those
    whose lease is not held, then one UPDATE per group of rows that get the same values,
    the reservations settled and one event per row, in bulk."""
    locked = _lock_settled(specs, alias)
    delays = _backoff_delays(specs, locked, alias)
    out: list[Occurrence | LeaseLost] = []
    updates: dict[str, tuple[Action, dict[str, Any], list[str]]] = {}
    terminal: dict[str, tuple[str, dict[str, Any], list[str]]] = {}
    pending_events: list[tuple[Occurrence, str, dict[str, Any], int]] = []
    for spec in specs:
        current = locked.get(spec.occurrence_id)
        action = _settle_action(spec, current)
        refused = refusal(action, spec.occurrence_id, current, owner=owner, fence=spec.fence, now=now)
        if refused is not None or current is None:
            out.append(cast(LeaseLost, refused))  # a fenced transition's only refusal
            continue
        given, data = _settle_values(action, spec, current, delays, now)
        applied(action, current, writes(action, now, **given))
        group = _group_key({"action": action, **given})
        updates.setdefault(group, (action, given, []))[2].append(current.pk)
        if current.status in TERMINAL_STATUSES:
            outcome_data: dict[str, Any] = {"status": current.status}
            if current.status == OccurrenceStatus.SUCCEEDED:
                outcome_data["result"] = spec.result
            elif current.status == OccurrenceStatus.CANCELLED:
                outcome_data["reason"] = CANCELLED_WHILE_RUNNING  # as budgets.settle_cancelled
            else:
                outcome_data["error"] = spec.error
            key = _group_key(outcome_data)
            terminal.setdefault(key, (current.status, outcome_data, []))[2].append(current.pk)
        pending_events.append((current, event_of(action), data, spec.fence))
        out.append(current)
    for action, given, ids in updates.values():
        with writing(action):
            Occurrence.objects.using(alias).filter(pk__in=ids).update(**writes(action, now, **given))
    reserved: dict[str, dict[str, Any]] = {}
    for status, outcome_data, ids in terminal.values():
        reserved.update(settle_reservations(ids, status, outcome_data, now, alias))
    insert(
        alias,
        [
            new_event(
                current.job_id,
                event_type,
                now,
                occurrence_id=current.pk,
                owner_id=owner,
                fence=fence,
                data={**data, **reserved.get(current.pk, {})},
            )
            for current, event_type, data, fence in pending_events
        ],
    )
    reached_terminal((current for current, _, _, _ in pending_events if current.is_terminal), now, alias)
    return out


def _requeue_unattempted(
    action: Action,
    current: Occurrence,
    *,
    owner: str,
    fence: int,
    available: datetime,
    now: datetime,
    alias: str,
    data: dict[str, Any] | None = None,
) -> None:
    """Back to queued, due at ``available``, lease dropped, and the claim's attempt given
    back (the fence stays: it only ever grows); the ``release`` and ``defer`` transitions."""
    with writing(action):
        Occurrence.objects.using(alias).filter(pk=current.pk).update(
            **writes(action, now, available_at=available)
        )
    new_event(
        current.job_id,
        event_of(action),
        now,
        occurrence_id=current.pk,
        owner_id=owner,
        fence=fence,
        data=data,
    ).save(using=alias)


def release(occurrence_id: str, *, owner: str, fence: int, using: str | None = None) -> Occurrence:
    """Give a held lease up without using an attempt, so another worker can take it at once
    (graceful shutdown). The occurrence goes back to queued, due now; one whose cancel was
    requested ends cancelled instead."""
    occurrence_id, owner, fence = lease_args(occurrence_id, owner, fence)
    now = conf.now()
    with write_transaction(using) as alias:
        current = _take_held(Action.RELEASE, occurrence_id, owner, fence, now, alias)
        if cancel_requested(current):  # asked to stop: it ends here instead of running again
            (settled,) = _settle_held(
                [Outcome(occurrence_id, fence, FAILED, retryable=False)], owner, now, alias
            )
            return cast(Occurrence, settled)
        _requeue_unattempted(
            Action.RELEASE, current, owner=owner, fence=fence, available=now, now=now, alias=alias
        )
        current.refresh_from_db(using=alias)
    return current


def _details(details: Any) -> dict[str, Any]:
    if details is None:
        return {}
    if not isinstance(details, dict):
        raise InvalidArgument("details", f"must be a dict or None, not {type(details).__name__}")
    return normalize_json(details, "details", max_bytes=MAX_RESULT_BYTES)  # type: ignore[no-any-return]


def _take_held(
    action: Action, occurrence_id: str, owner: str, fence: int, now: datetime, alias: str
) -> Occurrence:
    """The occurrence, locked, if ``owner`` holds its lease at ``fence`` (else ``LeaseLost``)."""
    current = Occurrence.objects.using(alias).select_for_update().filter(pk=occurrence_id).first()
    refused = refusal(action, occurrence_id, current, owner=owner, fence=fence, now=now)
    if refused is not None or current is None:
        raise cast(LeaseLost, refused)
    return current


def deny(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    code: str,
    reason: str,
    details: dict[str, Any] | None = None,
    message: str | None = None,
    using: str | None = None,
) -> Occurrence:
    """Dead-letter a held occurrence that authority refused, without retry (event
    ``authority_denied`` with the reason and details; ``message``, what was refused in
    words, follows the reason in the stored error's message)."""
    occurrence_id, owner, fence = lease_args(occurrence_id, owner, fence)
    reason = normalize_identifier(reason, "reason", max_length=64)
    code = normalize_identifier(code, "code", max_length=64)
    detail_value = _details(details)
    if message is not None and not isinstance(message, str):
        raise InvalidArgument("message", "must be a string or None")
    # The stored message is bounded like a handler's error message (a long list of capabilities).
    summary = normalize_error(f"authority denied: {reason}" + (f": {message}" if message else ""), "message")
    now = conf.now()
    with write_transaction(using) as alias:
        current = _take_held(Action.DENY, occurrence_id, owner, fence, now, alias)
        error = {
            "code": code,
            "reason": reason,
            "details": detail_value,
            **(summary or {}),
        }
        values = writes(Action.DENY, now, last_error=error)
        applied(Action.DENY, current, values)
        with writing(Action.DENY):
            current.save(using=alias, update_fields=list(values))
        settled = settle_reservations(
            [occurrence_id],
            OccurrenceStatus.DEAD_LETTER,
            {"status": "dead_letter", "error": error},
            now,
            alias,
        )
        data: dict[str, Any] = {
            "reason": reason,
            "code": code,
            "details": detail_value,
            "message": error["message"],
            "attempt": current.attempt,
        }
        data.update(settled.get(occurrence_id, {}))
        new_event(
            current.job_id,
            event_of(Action.DENY),
            now,
            occurrence_id=occurrence_id,
            owner_id=owner,
            fence=fence,
            data=data,
        ).save(using=alias)
        reached_terminal([current], now, alias)
    return current


def defer(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    until: datetime | int,
    details: dict[str, Any] | None = None,
    using: str | None = None,
) -> Occurrence:
    """Put a held occurrence back to wait until ``until`` without using an attempt (its
    principal's budget is spent until the window ends; event ``authority_deferred``)."""
    occurrence_id, owner, fence = lease_args(occurrence_id, owner, fence)
    until_ms = to_ms(until, "until")
    detail_value = _details(details)
    now = conf.now()
    with write_transaction(using) as alias:
        current = _take_held(Action.DEFER, occurrence_id, owner, fence, now, alias)
        available = max(now, from_ms(until_ms))
        _requeue_unattempted(
            Action.DEFER,
            current,
            owner=owner,
            fence=fence,
            available=available,
            now=now,
            alias=alias,
            data={"until": iso_ms(available), "details": detail_value},
        )
        current.refresh_from_db(using=alias)
    return current
