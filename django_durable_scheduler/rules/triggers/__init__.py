"""Triggers: what a job's schedule may say, validated and normalized here
(``docs/design.md``, "Schedules and misfire").

A trigger is a JSON object stored on ``Job.trigger``. Its shapes:

* ``{}``: no schedule; occurrences come only from ``enqueue``.
* ``{"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}``: a 5-field cron in an IANA zone
  (``timezone`` is optional and defaults to ``"UTC"``; it is only allowed with ``cron``).
* ``{"every": 300, "anchor": "2026-01-01T00:00:00Z"}``: a fixed interval in whole seconds
  (1 second .. 366 days); ``anchor`` is optional and only allowed with ``every``.
* ``{"at": "2026-12-01T09:00:00+00:00"}``: once.

With a schedule, the optional keys ``misfire`` (``skip``, ``run_latest``, ``run_all``),
``catchup_window`` (seconds, 0 .. 31 days), ``overlap`` (``allow``, ``skip``), ``start_at`` and
``end_at`` are accepted; without a schedule no other key is. Every datetime is an ISO-8601
*string with a UTC offset* (``Z`` or ``+02:00``); it is stored as UTC with milliseconds
(``2026-12-01T09:00:00.000Z``).

Its parts: :mod:`.cron` (the cron dialect), :mod:`.zones` (time zones and daylight saving),
:mod:`.fire_times` (when a trigger fires) and :mod:`.descriptions` (a trigger in words).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from ...exceptions import InvalidArgument
from ..identity import normalize_json
from ..validation import field_key, iso_ms, preview, to_datetime
from .cron import parse_cron
from .zones import iana_zone

__all__ = [
    "DEFAULT_CATCHUP_WINDOW",
    "DEFAULT_MISFIRE",
    "DEFAULT_OVERLAP",
    "DEFAULT_TIMEZONE",
    "MAX_CATCHUP_SLOTS",
    "MAX_CATCHUP_WINDOW",
    "MAX_EVERY",
    "MISFIRE_POLICIES",
    "OVERLAP_POLICIES",
    "SCHEDULE_KEYS",
    "TRIGGER_KEYS",
    "parse_instant",
    "validate_trigger",
]

MISFIRE_POLICIES: Final[tuple[str, ...]] = ("skip", "run_latest", "run_all")
OVERLAP_POLICIES: Final[tuple[str, ...]] = ("allow", "skip")
DEFAULT_MISFIRE: Final = "run_latest"
DEFAULT_OVERLAP: Final = "allow"
DEFAULT_TIMEZONE: Final = "UTC"
DEFAULT_CATCHUP_WINDOW: Final = 3600
MAX_CATCHUP_WINDOW: Final = 31 * 86_400
MAX_CATCHUP_SLOTS: Final = 100
MAX_EVERY: Final = 366 * 86_400

SCHEDULE_KEYS: Final[tuple[str, ...]] = ("cron", "every", "at")
OPTION_KEYS: Final[tuple[str, ...]] = ("misfire", "catchup_window", "overlap", "start_at", "end_at")
TRIGGER_KEYS: Final[tuple[str, ...]] = (*SCHEDULE_KEYS, "timezone", "anchor", *OPTION_KEYS)


def parse_instant(value: Any, field: str) -> datetime:
    """An ISO-8601 string with an offset -> aware UTC datetime truncated to milliseconds."""
    if not isinstance(value, str):
        raise InvalidArgument(
            field, f"must be an ISO-8601 string with a UTC offset, not {type(value).__name__}"
        )
    text = value.strip()
    try:
        # Printable first: the C parser stops at a NUL and would take what follows as valid.
        parsed = datetime.fromisoformat(text) if text.isprintable() else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise InvalidArgument(field, f"{preview(value)} is not an ISO-8601 date-time")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidArgument(
            field,
            f"{preview(value)} has no UTC offset; write it with Z or +HH:MM (e.g. 2026-12-01T09:00:00Z)",
        )
    return to_datetime(parsed, field)


def _int_seconds(value: Any, field: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be a whole number of seconds, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidArgument(
            field, f"must be between {minimum} and {maximum} seconds (got {preview(value)})"
        )
    return value


def _choice(value: Any, field: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgument(field, f"must be one of {', '.join(choices)} (got {preview(value)})")
    return value


def validate_trigger(trigger: Any, field: str = "trigger") -> dict[str, Any]:
    """Validate ``trigger`` and return its normalized form (a new dict; the input is untouched).

    Defaults are filled in when there is a schedule (``misfire``, ``catchup_window``,
    ``overlap``, and ``timezone`` for a cron); datetimes become UTC ISO-8601 with
    milliseconds; a cron is whitespace-collapsed and macros are translated. Bad input raises
    :class:`InvalidArgument` whose field names the exact key (``trigger.cron``, ...).
    ``None`` is refused like any other non-dict: pass ``{}`` for "no schedule".
    """
    if not isinstance(trigger, Mapping):
        raise InvalidArgument(field, f"must be a JSON object (dict), not {type(trigger).__name__}")
    for key in trigger:
        if not isinstance(key, str):
            raise InvalidArgument(field, f"has a non-string key {preview(key)}")
    unknown = sorted(key for key in trigger if key not in TRIGGER_KEYS)
    if unknown:
        raise InvalidArgument(
            field_key(field, unknown[0]), f"is not a trigger key (known keys: {', '.join(TRIGGER_KEYS)})"
        )
    kinds = [key for key in SCHEDULE_KEYS if key in trigger]
    if len(kinds) > 1:
        raise InvalidArgument(f"{field}.{kinds[1]}", f"cannot be combined with {kinds[0]}: give one schedule")
    if not kinds:
        for key in TRIGGER_KEYS:
            if key in trigger:
                raise InvalidArgument(
                    f"{field}.{key}", "is only allowed with a schedule (cron, every or at); {} means none"
                )
        return {}
    kind = kinds[0]
    if "timezone" in trigger and kind != "cron":
        raise InvalidArgument(f"{field}.timezone", "is only allowed with cron")
    if "anchor" in trigger and kind != "every":
        raise InvalidArgument(f"{field}.anchor", "is only allowed with every")

    out: dict[str, Any] = {}
    if kind == "cron":
        out["cron"] = parse_cron(trigger["cron"], f"{field}.cron").expression
        zone_name = trigger.get("timezone", DEFAULT_TIMEZONE)
        iana_zone(zone_name, f"{field}.timezone")
        out["timezone"] = zone_name
    elif kind == "every":
        out["every"] = _int_seconds(trigger["every"], f"{field}.every", 1, MAX_EVERY)
        if "anchor" in trigger:
            out["anchor"] = iso_ms(parse_instant(trigger["anchor"], f"{field}.anchor"))
    else:
        out["at"] = iso_ms(parse_instant(trigger["at"], f"{field}.at"))
    out["misfire"] = _choice(trigger.get("misfire", DEFAULT_MISFIRE), f"{field}.misfire", MISFIRE_POLICIES)
    out["catchup_window"] = _int_seconds(
        trigger.get("catchup_window", DEFAULT_CATCHUP_WINDOW),
        f"{field}.catchup_window",
        0,
        MAX_CATCHUP_WINDOW,
    )
    out["overlap"] = _choice(trigger.get("overlap", DEFAULT_OVERLAP), f"{field}.overlap", OVERLAP_POLICIES)
    start = parse_instant(trigger["start_at"], f"{field}.start_at") if "start_at" in trigger else None
    end = parse_instant(trigger["end_at"], f"{field}.end_at") if "end_at" in trigger else None
    if start is not None:
        out["start_at"] = iso_ms(start)
    if end is not None:
        if start is not None and end <= start:
            raise InvalidArgument(f"{field}.end_at", f"must be after start_at ({iso_ms(start)})")
        out["end_at"] = iso_ms(end)
    result: dict[str, Any] = normalize_json(out, field)
    return result
