"""The outcome of one run of a handler: one typed value from the worker's handler pool,
through its settle, to the kernel's settle (see docs/design.md, "Occurrence lifecycle"); and
what of its result and error any database stores."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from ..exceptions import InvalidArgument, SchedulerError
from .identity import normalize_json


class OutcomeStatus(StrEnum):
    """How a run ended: what ``settle(outcome=...)`` takes (its strings, or these) and what
    :attr:`Outcome.status` holds."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @classmethod
    def parse(cls, value: object, field: str = "outcome") -> OutcomeStatus:
        """``value`` (a member or its string) as a member; else ``InvalidArgument``."""
        status = _OUTCOME_STATUSES.get(value) if isinstance(value, str) else None
        if status is not None:
            return status
        raise InvalidArgument(field, "must be 'succeeded' or 'failed'")


_OUTCOME_STATUSES = {str(status): status for status in OutcomeStatus}
SUCCEEDED = OutcomeStatus.SUCCEEDED
FAILED = OutcomeStatus.FAILED


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one run of an occurrence's handler, the one value that goes from the
    handler pool through the worker's settle to the kernel: ``status`` is ``succeeded``
    (with its ``result``) or ``failed`` (with its ``error``), and a failure is retried,
    at ``retry_at`` or its job's backoff, unless it is not ``retryable`` (dead-lettered, or
    cancelled when a cancel was asked for). ``exception`` is what the handler raised, for
    the log and the signals: it is never stored."""

    occurrence_id: str
    fence: int
    status: OutcomeStatus
    result: Any = None
    error: Any = None
    retryable: bool = True
    retry_at: datetime | int | None = None
    exception: BaseException | None = None


MAX_RESULT_BYTES = 64 * 1024


MAX_ERROR_MESSAGE = 4096


MAX_TRACEBACK = 4 * MAX_ERROR_MESSAGE


MAX_ERROR_DEPTH = 8


TRUNCATED = " [truncated]"


def storable_text(text: str, limit: int, *, keep_end: bool = False) -> tuple[str, bool]:
    """``text`` as any database stores it: NUL (which PostgreSQL refuses) replaced by U+FFFD
    and lone surrogates (not Unicode) by ``?``, and cut to ``limit`` UTF-8 bytes with a
    visible marker (keeping its end when ``keep_end``, as a traceback's last lines say what
    failed); and whether it was cut."""
    encoded = text.replace("\x00", "\ufffd").encode("utf-8", "replace")
    text = encoded.decode("utf-8")
    if len(encoded) <= limit:
        return text, False
    room = limit - len(TRUNCATED)
    if keep_end:
        return TRUNCATED.lstrip() + " " + encoded[-room:].decode("utf-8", "ignore"), True
    return encoded[:room].decode("utf-8", "ignore") + TRUNCATED, True


def _error_text(error: dict[str, Any]) -> dict[str, Any]:
    """Exception text can hold anything: keep the message and traceback storable (and
    marked ``message_truncated``/``traceback_truncated`` when cut) rather than fail the
    settle."""
    error = dict(error)
    for key, limit in (("message", MAX_ERROR_MESSAGE), ("traceback", MAX_TRACEBACK)):
        value = error.get(key)
        if isinstance(value, str):
            error[key], cut = storable_text(value, limit, keep_end=key == "traceback")
            if cut:
                error[f"{key}_truncated"] = True
    return error


def _exception_error(error: BaseException) -> dict[str, Any]:
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not lose the failure it describes
        message = f"<unprintable {type(error).__name__}>"
    return {"type": type(error).__name__, "message": message}


def normalize_error(error: Any, field: str = "error") -> dict[str, Any] | None:
    if error is None:
        return None
    if isinstance(error, BaseException):
        error = _exception_error(error)
    elif isinstance(error, str):
        error = {"message": error}
    elif not isinstance(error, dict):
        raise InvalidArgument(field, "must be a string, a dict or an exception")
    return normalize_json(_error_text(error), field, max_bytes=MAX_RESULT_BYTES)  # type: ignore[no-any-return]


def _storable_value(value: Any, depth: int) -> Any:
    """A JSON value that any database stores, made from anything (text for what is not JSON)."""
    if isinstance(value, str):
        return storable_text(value, MAX_ERROR_MESSAGE)[0]
    if value is None or isinstance(value, bool) or (isinstance(value, int) and abs(value) <= 2**53):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if depth < MAX_ERROR_DEPTH and isinstance(value, dict):
        return {_storable_key(k): _storable_value(v, depth + 1) for k, v in value.items()}
    if depth < MAX_ERROR_DEPTH and isinstance(value, list | tuple):
        return [_storable_value(v, depth + 1) for v in value]
    try:
        text = repr(value)
    except Exception:
        text = f"<unprintable {type(value).__name__}>"
    return storable_text(text, MAX_ERROR_MESSAGE)[0]


def _storable_key(key: Any) -> str:
    return _storable_value(key if isinstance(key, str) else repr(key), 0)  # type: ignore[no-any-return]


def storable_error(error: Any) -> dict[str, Any]:
    """A handler's failure (an exception, a string or a dict) as an error that settle always
    stores: text made storable and bounded, anything that is not JSON written as text, and
    only its type and message kept when the whole is over the result limit. Never raises:
    the worker must record every failure, whatever the handler raised."""
    if isinstance(error, BaseException):
        error = _exception_error(error)
    elif not isinstance(error, dict):
        error = {"message": error if isinstance(error, str) else _storable_value(error, MAX_ERROR_DEPTH)}
    stored = {_storable_key(key): _storable_value(value, 1) for key, value in _error_text(error).items()}
    try:
        return normalize_json(stored, "error", max_bytes=MAX_RESULT_BYTES)  # type: ignore[no-any-return]
    except SchedulerError:
        kept: dict[str, Any] = {key: stored[key] for key in ("type", "message") if key in stored}
        return {**kept, "error_truncated": True}


def check_result(result: Any, field: str = "result") -> Any:
    """A handler result as it will be stored (JSON, at most 64 KiB), or ``InvalidArgument``."""
    return normalize_json(result, field, max_bytes=MAX_RESULT_BYTES)


def storable_result(result: Any, field: str = "result") -> Any:
    """:func:`check_result`, and ``InvalidArgument`` for text that some database cannot store
    (NUL), so that the worker fails such a result alone instead of its whole batch."""
    value = check_result(result, field)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and "\x00" in item:
            raise InvalidArgument(field, "holds a NUL character (U+0000), which the database cannot store")
    return value


def backoff_delay_ms(attempt: int, base_ms: int, max_ms: int, jitter: float) -> int:
    """The delay before retry ``attempt + 1``: exponential backoff, base * 2**(attempt-1),
    capped at ``max_ms``, spread by +/- ``jitter`` (a share of it) so that retries of many
    occurrences that failed together do not arrive together."""
    raw = min(max_ms, base_ms * (2 ** max(0, min(attempt - 1, 40))))
    spread = raw * jitter
    return max(1, min(max_ms, int(raw + random.uniform(-spread, spread))))
