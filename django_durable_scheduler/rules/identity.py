"""Canonical JSON and occurrence identity.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..exceptions import InvalidArgument
from .validation import (
    MAX_EPOCH_MS,
    MAX_SAFE_INTEGER,
    check_unicode,
    normalize_identifier,
    normalize_int,
    preview,
)

IDENTITY_DOMAIN = "chainlesschain.scheduler.occurrence.v1\0"


CONTRACT_VERSION = 1


MAX_JSON_DEPTH = 64


MAX_CANONICAL_BYTES = 1024 * 1024


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
        check_unicode(value, field)
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
            check_unicode(key, field)
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


def scope_digest(scope: list[str]) -> str:
    """The key of a limit's scope (a concurrency slot, a throttle bucket): the SHA-256 of its
    compact JSON, a fixed-length primary key whatever the scope's parts."""
    return hashlib.sha256(json.dumps(scope, separators=(",", ":")).encode()).hexdigest()
