"""Canonical JSON, occurrence identity and input normalization.

The identity is a compatibility contract: other implementations of this scheduler kernel
derive the same ids byte for byte, so occurrence ids are portable between them
(``docs/design.md``, "Slot identity and idempotency"). Its rules: canonical JSON with keys
in UTF-16 code-unit order, compact separators, non-ASCII kept, numbers formatted as
ECMAScript ``JSON.stringify`` formats them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .exceptions import InvalidArgument

IDENTITY_DOMAIN = "chainlesschain.scheduler.occurrence.v1\0"
CONTRACT_VERSION = 1
MAX_JSON_DEPTH = 64
MAX_CANONICAL_BYTES = 1024 * 1024
MAX_SAFE_INTEGER = 2**53 - 1
MAX_BIGINT = 2**63 - 1
MAX_IDENTIFIER_LENGTH = 256
MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
# The largest seconds a duration may be given as: far beyond every bound the API sets, and
# small enough that its milliseconds are exact in a float and fit datetime arithmetic.
MAX_DURATION_SECONDS = 10**12
PREVIEW_LENGTH = 60


def _js_number(value: float) -> str:
    """Format a finite float exactly as ECMAScript Number::toString does."""
    if value == 0:
        return "0"  # -0 too
    if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return str(int(value))
    sign = "-" if value < 0 else ""
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    exponent = int(exp_text) if exp_text else 0
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    # n: position of the decimal point relative to the start of ``digits``.
    n = (
        len(whole.lstrip("0")) + exponent
        if whole.strip("0")
        else exponent - (len(frac) - len(frac.lstrip("0")))
    )
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        text = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + text


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


def _check_unicode(text: str, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(field, "holds a lone surrogate, which is not valid Unicode text") from None


# PostgreSQL's text and jsonb refuse U+0000, which SQLite and MariaDB would keep: refused
# everywhere, so a value is stored alike on every database.
_NUL_MESSAGE = "holds a NUL character (U+0000), which cannot be stored"
# A NUL escape in canonical JSON text: ``\u0000`` after an even number of backslashes
# (after an odd number, the backslash before ``u`` is itself escaped text).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _utf16_key(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def _encode(value: Any, field: str, depth: int, out: list[str]) -> None:
    if depth > MAX_JSON_DEPTH:
        raise InvalidArgument(field, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if abs(value) <= MAX_SAFE_INTEGER:
            out.append(str(int(value)))
        else:
            # Beyond 2**53 a JSON number is a double to every other reader (JavaScript, and
            # the other implementations): write what they would, e.g. 2**60 -> 1152921504606847000.
            try:
                out.append(_js_number(float(value)))
            except OverflowError:
                raise InvalidArgument(field, "holds an integer too large for a JSON number") from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(field, "holds NaN or Infinity, which JSON cannot represent")
        out.append(_js_number(value))
    elif isinstance(value, str):
        _check_unicode(value, field)
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, field, depth + 1, out)
        out.append("]")
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise InvalidArgument(field, f"has a non-string key {preview(key)}")
            _check_unicode(key, field)
        out.append("{")
        for index, key in enumerate(sorted(value, key=_utf16_key)):
            if index:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _encode(value[key], field, depth + 1, out)
        out.append("}")
    else:
        raise InvalidArgument(field, f"holds a {type(value).__name__}, which is not a JSON value")


def canonical_json(value: Any, field: str = "value", *, max_bytes: int = MAX_CANONICAL_BYTES) -> str:
    """Return the canonical JSON text of ``value``; raise InvalidArgument naming ``field``."""
    out: list[str] = []
    _encode(value, field, 1, out)
    text = "".join(out)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidArgument(field, f"is {size} bytes as canonical JSON, over the {max_bytes} byte limit")
    return text


def normalize_json(value: Any, field: str, *, max_bytes: int = MAX_CANONICAL_BYTES) -> Any:
    """Validate ``value`` as a JSON value every database stores alike and return its
    canonical Python form: canonical JSON, and no NUL in a string or key (which
    :func:`canonical_json`, which only encodes, does allow)."""
    text = canonical_json(value, field, max_bytes=max_bytes)
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise InvalidArgument(field, _NUL_MESSAGE)
    return json.loads(text, parse_int=_parse_int)


def _parse_int(text: str) -> int | float:
    # An integral float beyond 2**53 is written as digits (as JSON.stringify does); read it
    # back as the float it was, as JavaScript would, so it stays valid canonical JSON.
    value = int(text)
    return value if abs(value) <= MAX_SAFE_INTEGER else float(value)


@dataclass(frozen=True)
class OccurrenceIdentity:
    digest: str
    occurrence_id: str
    idempotency_key: str


# JSON text as json.dumps(value, ensure_ascii=False, allow_nan=False) writes it, without the
# per-call argument handling of json.dumps (an enqueue writes several per occurrence).
json_text = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


OCCURRENCE_ID_PREFIX = "occ_"
IDEMPOTENCY_KEY_PREFIX = "scheduler:v1:"


def identity_deriver(job_id: str, job_revision: int) -> Callable[[int, str], OccurrenceIdentity]:
    """:func:`derive_occurrence_identity` for one job revision, as a function of
    ``(scheduled_for_ms, trigger_key)``: the part of the material they share is built once,
    for a bulk enqueue of thousands of occurrences of one job."""
    digest_of = identity_digester(job_id, job_revision)

    def derive(scheduled_for_ms: int, trigger_key: str) -> OccurrenceIdentity:
        key = normalize_identifier(trigger_key, "trigger_key")
        scheduled = normalize_int(scheduled_for_ms, "scheduled_for_ms", minimum=0, maximum=MAX_EPOCH_MS)
        digest = digest_of(scheduled, key)
        return OccurrenceIdentity(digest, OCCURRENCE_ID_PREFIX + digest, IDEMPOTENCY_KEY_PREFIX + digest)

    return derive


def identity_digester(job_id: str, job_revision: int) -> Callable[[int, str], str]:
    """The identity digest of one job revision's occurrences, as a function of
    ``(scheduled_for_ms, trigger_key)`` that trusts its arguments: the caller passes what
    :func:`to_ms` and :func:`normalize_identifier` returned (the bulk enqueue has checked
    every item before it derives any identity)."""
    job_id = normalize_identifier(job_id, "job_id")
    revision = normalize_int(job_revision, "job_revision", minimum=1, maximum=MAX_SAFE_INTEGER)
    # canonical_json of {"contractVersion", "jobId", "jobRevision", "scheduledFor",
    # "triggerKey"} written out: the keys in canonical order, the strings checked by
    # normalize_identifier (which canonical_json would refuse the same way).
    job_json = json.dumps(job_id, ensure_ascii=False)
    prefix = (
        f'{IDENTITY_DOMAIN}{{"contractVersion":{CONTRACT_VERSION},"jobId":{job_json},'
        f'"jobRevision":{revision},"scheduledFor":'
    )
    sha256 = hashlib.sha256

    def digest_of(scheduled_for_ms: int, trigger_key: str) -> str:
        material = f'{prefix}{scheduled_for_ms},"triggerKey":{json_text(trigger_key)}}}'
        return sha256(material.encode("utf-8")).hexdigest()

    return digest_of


def derive_occurrence_identity(
    job_id: str, job_revision: int, scheduled_for_ms: int, trigger_key: str
) -> OccurrenceIdentity:
    """The portable occurrence identity of a job revision, slot and trigger key."""
    return identity_deriver(job_id, job_revision)(scheduled_for_ms, trigger_key)


def normalize_identifier(value: Any, field: str, *, max_length: int = MAX_IDENTIFIER_LENGTH) -> str:
    """A stripped, non-empty string of at most ``max_length`` characters without control characters."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, not {type(value).__name__}")
    text = value.strip()
    if not text:
        raise InvalidArgument(field, "must not be empty")
    if len(text) > max_length:
        raise InvalidArgument(field, f"must be at most {max_length} characters (got {len(text)})")
    _check_unicode(text, field)
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


def column_max(model: Any, name: str) -> int:
    """The largest value the integer column ``model.name`` holds on every supported database
    (the portable ranges Django checks against: e.g. 32767 for a small integer)."""
    from django.db.backends.base.operations import BaseDatabaseOperations

    internal_type = model._meta.get_field(name).get_internal_type()
    return int(BaseDatabaseOperations.integer_field_ranges[internal_type][1])


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
MAX_RETRY_BASE_DELAY_MS = 24 * 60 * 60 * 1000
MAX_RETRY_MAX_DELAY_MS = 31 * MAX_RETRY_BASE_DELAY_MS


def retry_base_delay_ms(value: Any, field: str) -> int:
    """The first retry delay of a job's backoff, in milliseconds."""
    return to_duration_ms(value, field, maximum_ms=MAX_RETRY_BASE_DELAY_MS)


def retry_max_delay_ms(value: Any, field: str) -> int:
    """The longest retry delay of a job's backoff, in milliseconds."""
    return to_duration_ms(value, field, maximum_ms=MAX_RETRY_MAX_DELAY_MS)


# The longest timeout a handler, a job or the default setting may give: 31 days.
MAX_TIMEOUT_MS = 31 * 24 * 60 * 60 * 1000


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
