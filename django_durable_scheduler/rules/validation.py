"""Input validation: what every public argument is checked against before anything is written.

Each check raises :class:`InvalidArgument` naming the field, with a short preview of the
refused value, so bad input fails the same way wherever it enters (the API, a declaration,
the admin's forms, a task's options).
"""

from __future__ import annotations

import math
import re
import reprlib
import string
from datetime import UTC, datetime, timedelta
from typing import Any

from ..exceptions import InvalidArgument

# The largest retry delays and handler timeout a job may ask for (settings are checked
# against the same limits).
MAX_RETRY_BASE_DELAY_MS = 24 * 60 * 60 * 1000
MAX_RETRY_MAX_DELAY_MS = 31 * MAX_RETRY_BASE_DELAY_MS
MAX_TIMEOUT_MS = 31 * 24 * 60 * 60 * 1000

MAX_SAFE_INTEGER = 2**53 - 1


MAX_BIGINT = 2**63 - 1


MAX_IDENTIFIER_LENGTH = 256


MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


# The largest seconds a duration may be given as: far beyond every bound the API sets, and
# small enough that its milliseconds are exact in a float and fit datetime arithmetic.
MAX_DURATION_SECONDS = 10**12


PREVIEW_LENGTH = 60


_PREVIEW = reprlib.Repr()


_PREVIEW.maxlevel = 3


_PREVIEW.maxstring = _PREVIEW.maxother = _PREVIEW.maxlong = PREVIEW_LENGTH


_PREVIEW.maxlist = _PREVIEW.maxtuple = _PREVIEW.maxdict = _PREVIEW.maxset = 4


def preview(value: Any) -> str:
    """A short repr of a refused value for an error message: an error must not print a value
    of a megabyte, recurse through one nested thousands deep, or fail on a huge integer."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
    try:
        text = _PREVIEW.repr(value)
    except Exception:  # a repr that fails (an own __repr__, an int past str()'s limit)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= PREVIEW_LENGTH else text[: PREVIEW_LENGTH - 3] + "..."


def key_label(key: Any) -> str:
    """A dict key as an error's field names it: itself, or its short repr when it is long,
    holds unprintable characters or is not a string."""
    if isinstance(key, str) and len(key) <= PREVIEW_LENGTH and key.isprintable():
        return key
    return preview(key)


def field_key(field: str, key: Any) -> str:
    """``field.key``: the field of an unknown key of the dict argument ``field``."""
    return f"{field}.{key_label(key)}"


def check_unicode(text: str, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(field, "holds a lone surrogate, which is not valid Unicode text") from None


def normalize_identifier(value: Any, field: str, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str:
    """A stripped, non-empty string of at most ``max_length`` characters without control characters."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, not {type(value).__name__}")
    text = value.strip()
    if not text:
        raise InvalidArgument(field, "must not be empty")
    if len(text) > max_length:
        raise InvalidArgument(field, f"must be at most {max_length} characters (got {len(text)})")
    check_unicode(text, field)
    control = _CONTROL.search(text)
    if control is not None:
        code = ord(control.group())
        raise InvalidArgument(field, f"must not contain control characters (found U+{code:04X})")
    return text


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def normalize_int(
    value: Any, field: str, *, minimum: int | None = None, maximum: int | None = MAX_BIGINT
) -> int:
    """An int within bounds; the default bound is what a bigint column holds, so no integer
    reaches a query that a database would refuse (pass ``maximum=None`` for none)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, not {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise InvalidArgument(field, f"must be >= {minimum} (got {preview(value)})")
    if maximum is not None and value > maximum:
        raise InvalidArgument(field, f"must be <= {maximum} (got {preview(value)})")
    return int(value)


def normalize_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(field, f"must be a boolean, not {type(value).__name__}")
    return value


def to_ms(value: Any, field: str) -> int:
    """Epoch milliseconds from an aware datetime or an integer of epoch milliseconds."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(field, "must be an aware datetime (got a naive one)")
        delta = value - EPOCH
        ms = delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
        if ms < 0:
            raise InvalidArgument(field, "must not be before 1970-01-01")
        if ms > MAX_EPOCH_MS:
            raise InvalidArgument(field, "must not be after 9999-12-31T23:59:59.999Z")
        return ms
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            field, f"must be an aware datetime or epoch milliseconds, not {type(value).__name__}"
        )
    if value < 0 or value > MAX_EPOCH_MS:
        raise InvalidArgument(
            field, f"must be epoch milliseconds between 0 and year 9999 (got {preview(value)})"
        )
    return value


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def to_datetime(value: Any, field: str) -> datetime:
    """An aware UTC datetime truncated to milliseconds."""
    return from_ms(to_ms(value, field))


def truncate_ms(value: datetime) -> datetime:
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


def to_duration_ms(
    value: Any,
    field: str,
    *,
    minimum_ms: int = 1,
    maximum_ms: int | None = None,
) -> int:
    """Milliseconds from seconds (int or float) or a timedelta, within bounds."""
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(field, f"must be seconds or a timedelta, not {type(value).__name__}")
    elif not -MAX_DURATION_SECONDS <= value <= MAX_DURATION_SECONDS:  # False for NaN
        # Compared, not converted: an int past float range (10**400) cannot become one.
        raise InvalidArgument(field, "must be a finite number of seconds (at most 1e12)")
    else:
        ms = round(value * 1000)
    if ms < minimum_ms:
        raise InvalidArgument(field, f"must be at least {minimum_ms / 1000:g} seconds")
    if maximum_ms is not None and ms > maximum_ms:
        raise InvalidArgument(field, f"must be at most {maximum_ms / 1000:g} seconds")
    return ms


# A job's bounds, checked the same wherever a job is made: create_job/update_job, a
# declaration (declare_job, a handler's job=) and a task's @durable options.
MAX_ATTEMPTS_LIMIT = 32


def retry_base_delay_ms(value: Any, field: str) -> int:
    """The first retry delay of a job's backoff, in milliseconds."""
    return to_duration_ms(value, field, maximum_ms=MAX_RETRY_BASE_DELAY_MS)


def retry_max_delay_ms(value: Any, field: str) -> int:
    """The longest retry delay of a job's backoff, in milliseconds."""
    return to_duration_ms(value, field, maximum_ms=MAX_RETRY_MAX_DELAY_MS)


def timeout_ms(value: float | timedelta | None, field: str) -> int | None:
    """A run's timeout in milliseconds (None: no timeout), from seconds or a timedelta."""
    if value is None:
        return None
    return to_duration_ms(value, field, minimum_ms=1, maximum_ms=MAX_TIMEOUT_MS)


def retry_delays_ms(base: Any, maximum: Any, prefix: str = "") -> tuple[int | None, int | None]:
    """Both retry delays in milliseconds (None: not given), the longest no shorter than the
    first; errors name ``<prefix>retry_base_delay`` or ``<prefix>retry_max_delay``."""
    base_ms = None if base is None else retry_base_delay_ms(base, f"{prefix}retry_base_delay")
    max_ms = None if maximum is None else retry_max_delay_ms(maximum, f"{prefix}retry_max_delay")
    if base_ms is not None and max_ms is not None and max_ms < base_ms:
        raise InvalidArgument(f"{prefix}retry_max_delay", "must not be shorter than retry_base_delay")
    return base_ms, max_ms


def iso_ms(value: datetime) -> str:
    """UTC ISO-8601 with milliseconds and a Z, as JavaScript's toISOString."""
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


# A concurrency limit and the key it counts per (docs/design.md, "Concurrency limits"): what a
# job, a handler, a declaration, a task and a policy's ``max_running`` may give.
MAX_CONCURRENCY = 10_000
MAX_KEY_LENGTH = 256


def normalize_limit(value: Any, field: str) -> int | None:
    """A limit: None (no cap) or a whole number of runs at once in 1..MAX_CONCURRENCY."""
    if value is None:
        return None
    return normalize_int(value, field, minimum=1, maximum=MAX_CONCURRENCY)


def normalize_template(value: Any, field: str) -> str | None:
    """A key template: None, or text whose ``{name}`` fields name top-level payload keys
    (no attribute, index, conversion or format spec: the key is data, not code)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise InvalidArgument(field, f"must be a non-empty template of at most {MAX_KEY_LENGTH} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL (U+0000)")
    check_unicode(value, field)
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise InvalidArgument(field, f"is not a valid template ({exc})") from None
    for _, name, spec, conversion in parts:
        if name is not None and (not name.isidentifier() or spec or conversion):
            raise InvalidArgument(field, "fields must be plain payload key names, like {customer}")
    return value
