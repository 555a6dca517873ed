"""Trigger validation and fire-time computation (``docs/design.md``, "Schedules and misfire").

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

Cron dialect
------------
Exactly five fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or
``JAN``-``DEC``), day of week (0-7 or ``SUN``-``SAT``; 0 and 7 are Sunday). Each field is a
comma-separated list of ``*``, ``*/step``, ``value``, ``a-b`` or ``a-b/step`` (names are
case-insensitive and allowed in ranges; ranges must not run backwards; a step is between 1
and the number of values of the field). A 6- or 7-field cron (seconds, years) is refused,
and so are the non-POSIX extensions ``?``, ``L``, ``W``, ``#``, ``H`` and ``value/step``.
A cron that can never fire (``0 0 30 2 *``) is refused.

The macros ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/``@midnight`` and
``@hourly`` are accepted and *translated*: the normalized trigger stores their 5-field form
(``@daily`` -> ``0 0 * * *``, ``@hourly`` -> ``0 * * * *``). ``@reboot`` (not a schedule) and
any other ``@`` word are refused. Whitespace between fields is collapsed to single spaces;
the fields themselves are stored as written.

Daylight saving time (the ISC/Vixie cron rule)
----------------------------------------------
* If the hour field is exactly ``*``, the cron runs on *real time*: every real instant whose
  local wall-clock time matches fires. In a repeated fall-back hour it fires in both
  instances; minutes inside a spring-forward gap do not exist and do not fire.
* Otherwise the hour field is *restricted* -- and that includes ``*/1``, ``0-23`` and
  ``*/2``, which are restricted even though ``*/1`` and ``0-23`` list every hour: only the
  literal ``*`` means "real time". A restricted cron fires each matching wall-clock slot
  once: a slot in a repeated hour fires at its first instance only, a slot inside a
  spring-forward gap fires at the first instant after the gap. Several slots that land on the
  same instant (all of a gap's slots, or a gap slot and the slot right after the gap) fire
  once: the fire times returned are strictly increasing.

Day of month and day of week combine as in POSIX cron: when both fields are restricted
(anything but the literal ``*``), a day matches if either matches; if one of them is ``*``,
only the other applies.

Implementation: croniter is used as a *second opinion* when validating (an expression that
croniter refuses is refused too), never for iteration. Its own time zone handling is not
used at all: croniter 7.0.0 fires a restricted-hour slot in a repeated fall-back hour twice
(once per instance) and, when started between the two instances, fires the second one.
Its expansion is lossy too (``1-1`` becomes ``*``, so ``0 1-1 * * *`` fires hourly; ``*/1``
and ``1-31`` also become ``*``, which hides whether a field is restricted). Instead this
module parses the cron itself, enumerates matching *naive* local wall-clock times and maps
each to instants with :mod:`zoneinfo` (``fold`` handling and gap detection done here).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

from ..exceptions import InvalidArgument
from .identity import normalize_json
from .validation import field_key, from_ms, iso_ms, normalize_int, preview, to_datetime, to_ms

__all__ = [
    "DEFAULT_CATCHUP_WINDOW",
    "DEFAULT_MISFIRE",
    "DEFAULT_OVERLAP",
    "DEFAULT_TIMEZONE",
    "MAX_CATCHUP_SLOTS",
    "MAX_CATCHUP_WINDOW",
    "MAX_COUNT",
    "MAX_COUNTED_SLOTS",
    "MAX_EVERY",
    "MISFIRE_POLICIES",
    "OVERLAP_POLICIES",
    "SCHEDULE_KEYS",
    "TRIGGER_KEYS",
    "CronSpec",
    "count_fire_times",
    "describe_trigger",
    "next_fire_time",
    "next_fire_times",
    "parse_cron",
    "previous_fire_times",
    "slot_trigger_key",
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
MAX_COUNT: Final = 1000
MAX_CRON_LENGTH: Final = 1024
# Counting a cron's slots means walking them, so :func:`count_fire_times` stops here.
MAX_COUNTED_SLOTS: Final = 10_000

SCHEDULE_KEYS: Final[tuple[str, ...]] = ("cron", "every", "at")
OPTION_KEYS: Final[tuple[str, ...]] = ("misfire", "catchup_window", "overlap", "start_at", "end_at")
TRIGGER_KEYS: Final[tuple[str, ...]] = (*SCHEDULE_KEYS, "timezone", "anchor", *OPTION_KEYS)

_MACROS: Final[dict[str, str]] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES: Final = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DOW_NAMES: Final = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# The longest each month can be (February: 29, in leap years).
_MONTH_MAX_DAYS: Final = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_REFUSED_ZONES: Final = frozenset({"localtime", "posixrules"})
_ITEM_RE: Final = re.compile(r"^(?:(\*)|([0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?)(?:/([0-9]+))?$")
# Any real UTC offset is strictly between -24 h and +24 h (Python enforces it), so the
# instants of a naive wall-clock time ``t`` all lie in (t - 24 h, t + 24 h).
_OFFSET_BOUND: Final = timedelta(hours=24)
_LAST_DAY: Final = date(9999, 12, 29)
# No slot is before the Unix epoch (``identity.to_ms`` refuses it); walking back stops here.
_FIRST_DAY: Final = date(1969, 12, 30)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_MAX_MS: Final = 253_402_300_799_999
# Walking back starts up to a day after ``before``: capped to stay within datetime's range.
_LATEST: Final = datetime(9999, 12, 29, tzinfo=UTC)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int  # highest value that ``*`` covers
    max_value: int  # highest value accepted (7 for day of week)
    names: tuple[str, ...] = ()
    name_base: int = 0


_FIELDS: Final = (
    _Field("minute", 0, 59, 59),
    _Field("hour", 0, 23, 23),
    _Field("day of month", 1, 31, 31),
    _Field("month", 1, 12, 12, _MONTH_NAMES, 1),
    _Field("day of week", 0, 6, 7, _DOW_NAMES, 0),
)


@dataclass(frozen=True)
class CronSpec:
    """A parsed 5-field cron: the matching values of each field and which fields are ``*``."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    hour_star: bool
    dom_star: bool
    dow_star: bool

    def day_matches(self, day: date) -> bool:
        """POSIX rule: both day fields restricted -> either matches; else both must match."""
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.days
        dow_ok = day.isoweekday() % 7 in self.weekdays
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def matches(self, wall: datetime) -> bool:
        """Whether a (naive) local wall-clock time matches, ignoring seconds."""
        return wall.minute in self.minutes and wall.hour in self.hours and self.day_matches(wall.date())


# --------------------------------------------------------------------------- cron parsing


def _field_value(text: str, spec: _Field, field: str) -> int:
    if text.isdigit():
        if len(text) > 4:
            raise InvalidArgument(
                field, f"{spec.name} value {text!r} is out of range {spec.low}-{spec.max_value}"
            )
        value = int(text)
    elif text.isalpha() and spec.names and text.upper() in spec.names:
        value = spec.names.index(text.upper()) + spec.name_base
    elif text.isalpha() and spec.names:
        raise InvalidArgument(
            field, f"{spec.name} name {text!r} is not one of {', '.join(spec.names)} (or a number)"
        )
    else:
        raise InvalidArgument(field, f"{spec.name} value {text!r} is not a number")
    if not spec.low <= value <= spec.max_value:
        raise InvalidArgument(field, f"{spec.name} value {value} is out of range {spec.low}-{spec.max_value}")
    return value


def _parse_field(text: str, spec: _Field, field: str) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        match = _ITEM_RE.match(item)
        if match is None:
            raise InvalidArgument(
                field,
                f"{spec.name} field {text!r} is not valid: use *, */step, value, a-b or a-b/step "
                "(comma-separated); ?, L, W, # and H are not supported",
            )
        star, first, last, step_text = match.groups()
        if star:
            start, stop = spec.low, spec.high
        else:
            if last is None and step_text is not None:
                raise InvalidArgument(
                    field,
                    f"{spec.name} field {text!r}: a step needs * or a range (write {first}-{spec.high}/N)",
                )
            start = _field_value(first, spec, field)
            stop = start if last is None else _field_value(last, spec, field)
            if stop < start:
                hint = " (Sunday is 0 or 7: write 1-7 or MON-SAT,SUN)" if spec.max_value == 7 else ""
                raise InvalidArgument(field, f"{spec.name} range {item!r} runs backwards{hint}")
        step = 1
        if step_text is not None:
            span = spec.high - spec.low + 1
            step = int(step_text) if len(step_text) <= 4 else span + 1
            if not 1 <= step <= span:
                raise InvalidArgument(field, f"{spec.name} step in {item!r} must be between 1 and {span}")
        values.update(range(start, stop + 1, step))
    if spec.max_value == 7 and 7 in values:  # day of week: 7 is Sunday
        values.discard(7)
        values.add(0)
    return values


@lru_cache(maxsize=1024)
def _parse_cron_cached(expression: str, field: str) -> CronSpec:
    lowered = expression.lower()
    if lowered.startswith("@"):
        if lowered == "@reboot":
            raise InvalidArgument(field, "@reboot is not a schedule")
        if lowered not in _MACROS:
            raise InvalidArgument(field, f"unknown macro {expression!r} (known: {', '.join(_MACROS)})")
        expression = _MACROS[lowered]
    parts = expression.split()
    if len(parts) != 5:
        extra = " (a seconds or year field is not supported)" if len(parts) in (6, 7) else ""
        raise InvalidArgument(
            field,
            f"must have exactly 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(parts)}{extra}",
        )
    minutes, hours, days, months, weekdays = (
        _parse_field(part, spec, field) for part, spec in zip(parts, _FIELDS, strict=True)
    )
    dom_star, dow_star = parts[2] == "*", parts[4] == "*"
    if dow_star and not any(day <= _MONTH_MAX_DAYS[month - 1] for month in months for day in days):
        raise InvalidArgument(
            field, f"{expression!r} can never fire (no selected month has the selected days)"
        )
    normalized = " ".join(parts)
    try:
        croniter.expand(normalized)
    except (ValueError, KeyError, IndexError, TypeError) as exc:  # second opinion
        raise InvalidArgument(field, f"is not a valid cron expression: {exc}") from exc
    return CronSpec(
        expression=normalized,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        hour_star=parts[1] == "*",
        dom_star=dom_star,
        dow_star=dow_star,
    )


def parse_cron(expression: Any, field: str = "cron") -> CronSpec:
    """Parse a 5-field cron (or a macro); raise :class:`InvalidArgument` naming ``field``."""
    if not isinstance(expression, str):
        raise InvalidArgument(field, f"must be a string, not {type(expression).__name__}")
    if len(expression) > MAX_CRON_LENGTH:
        raise InvalidArgument(field, f"must be at most {MAX_CRON_LENGTH} characters")
    collapsed = " ".join(expression.split())
    if not collapsed:
        raise InvalidArgument(field, "must not be empty")
    return _parse_cron_cached(collapsed, field)


# --------------------------------------------------------------------------- other values


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones())


@lru_cache(maxsize=512)
def _load_zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


@lru_cache(maxsize=512)
def _offset_range(zone: ZoneInfo) -> tuple[timedelta, timedelta]:
    """The lowest and highest UTC offsets ``zone`` uses from 1970 on, so that the instants of a
    wall-clock time ``t`` lie in ``[t - highest, t - lowest]``: the fire-time walks then look
    at the walls near their bounds only, not a whole day either side.

    Sampled daily up to 2100 (later years repeat the zone's last rule) and widened by an hour,
    in case an offset lasted less than a day between two samples.
    """
    offsets = {datetime.fromtimestamp(ts, zone).utcoffset() for ts in range(0, 4_102_444_800, 86_400)}
    known = [offset for offset in offsets if offset is not None]
    margin = timedelta(hours=1)
    return max(min(known) - margin, -_OFFSET_BOUND), min(max(known) + margin, _OFFSET_BOUND)


def _zone(name: Any, field: str) -> ZoneInfo:
    if not isinstance(name, str):
        raise InvalidArgument(field, f"must be an IANA time zone name string, not {type(name).__name__}")
    if not name or len(name) > 255 or name in _REFUSED_ZONES:
        raise InvalidArgument(field, f"{preview(name)} is not an IANA time zone name")
    try:
        zone = _load_zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidArgument(field, f"unknown time zone {preview(name)}") from exc
    known = _known_zones()
    if known and name not in known:
        raise InvalidArgument(field, f"unknown time zone {preview(name)}")
    return zone


def _instant(value: Any, field: str) -> datetime:
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


# --------------------------------------------------------------------------- validation


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
        _zone(zone_name, f"{field}.timezone")
        out["timezone"] = zone_name
    elif kind == "every":
        out["every"] = _int_seconds(trigger["every"], f"{field}.every", 1, MAX_EVERY)
        if "anchor" in trigger:
            out["anchor"] = iso_ms(_instant(trigger["anchor"], f"{field}.anchor"))
    else:
        out["at"] = iso_ms(_instant(trigger["at"], f"{field}.at"))
    out["misfire"] = _choice(trigger.get("misfire", DEFAULT_MISFIRE), f"{field}.misfire", MISFIRE_POLICIES)
    out["catchup_window"] = _int_seconds(
        trigger.get("catchup_window", DEFAULT_CATCHUP_WINDOW),
        f"{field}.catchup_window",
        0,
        MAX_CATCHUP_WINDOW,
    )
    out["overlap"] = _choice(trigger.get("overlap", DEFAULT_OVERLAP), f"{field}.overlap", OVERLAP_POLICIES)
    start = _instant(trigger["start_at"], f"{field}.start_at") if "start_at" in trigger else None
    end = _instant(trigger["end_at"], f"{field}.end_at") if "end_at" in trigger else None
    if start is not None:
        out["start_at"] = iso_ms(start)
    if end is not None:
        if start is not None and end <= start:
            raise InvalidArgument(f"{field}.end_at", f"must be after start_at ({iso_ms(start)})")
        out["end_at"] = iso_ms(end)
    result: dict[str, Any] = normalize_json(out, field)
    return result


# --------------------------------------------------------------------------- fire times


def _iter_walls(cron: CronSpec, start: datetime) -> Iterator[datetime]:
    """Matching naive wall-clock times >= ``start`` (naive, whole minutes), in order."""
    if start.second or start.microsecond:
        start = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    day = start.date()
    first = True
    while day <= _LAST_DAY:
        if day.month not in cron.months:
            if day.year == _LAST_DAY.year and day.month == 12:
                return
            day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
            first = False
            continue
        if cron.day_matches(day):
            for hour in cron.hours:
                if first and hour < start.hour:
                    continue
                for minute in cron.minutes:
                    if first and hour == start.hour and minute < start.minute:
                        continue
                    yield datetime(day.year, day.month, day.day, hour, minute)
        first = False
        day += timedelta(days=1)


def _iter_walls_back(cron: CronSpec, start: datetime) -> Iterator[datetime]:
    """Matching naive wall-clock times <= ``start`` (naive, whole minutes), latest first."""
    start = start.replace(second=0, microsecond=0)
    day = start.date()
    first = True
    while day >= _FIRST_DAY:
        if day.month not in cron.months:
            day = day.replace(day=1) - timedelta(days=1)
            first = False
            continue
        if cron.day_matches(day):
            for hour in reversed(cron.hours):
                if first and hour > start.hour:
                    continue
                for minute in reversed(cron.minutes):
                    if first and hour == start.hour and minute > start.minute:
                        continue
                    yield datetime(day.year, day.month, day.day, hour, minute)
        first = False
        day -= timedelta(days=1)


def _to_utc(wall: datetime, zone: ZoneInfo, fold: int) -> datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def _exists(instant: datetime, wall: datetime, zone: ZoneInfo) -> bool:
    return instant.astimezone(zone).replace(tzinfo=None) == wall


def _all_instances(wall: datetime, zone: ZoneInfo) -> list[datetime]:
    """Real-time rule: every instant whose local time is ``wall`` (0 in a gap, 2 in a fold)."""
    found: list[datetime] = []
    for fold in (0, 1):
        instant = _to_utc(wall, zone, fold)
        if instant not in found and _exists(instant, wall, zone):
            found.append(instant)
    return sorted(found)


def _gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the spring-forward gap that swallowed ``wall``."""
    candidates = sorted((_to_utc(wall, zone, 0), _to_utc(wall, zone, 1)))
    low, high = candidates  # the transition lies in (low, high]
    before = low.astimezone(zone).utcoffset()
    lo_s, hi_s = 0, int((high - low).total_seconds())
    while hi_s - lo_s > 1:  # invariant: offset at low+lo_s == before, at low+hi_s != before
        mid = (lo_s + hi_s) // 2
        if (low + timedelta(seconds=mid)).astimezone(zone).utcoffset() == before:
            lo_s = mid
        else:
            hi_s = mid
    return low + timedelta(seconds=hi_s)


def _first_instance(wall: datetime, zone: ZoneInfo) -> datetime:
    """Restricted-hour rule: the first instance of ``wall``, or the end of its gap."""
    instant = _to_utc(wall, zone, 0)  # fold=0 is the earlier instance of a repeated time
    if _exists(instant, wall, zone):
        return instant
    return _gap_end(wall, zone)


def _wall_instants(cron: CronSpec, zone: ZoneInfo, wall: datetime) -> list[datetime]:
    """The instants at which the wall-clock slot ``wall`` fires (the daylight-saving rules above)."""
    return _all_instances(wall, zone) if cron.hour_star else [_first_instance(wall, zone)]


def _cron_times(
    cron: CronSpec,
    zone: ZoneInfo,
    after: datetime,
    start: datetime | None,
    end: datetime | None,
    count: int,
) -> list[datetime]:
    lower = after if start is None or start <= after else start
    found: list[datetime] = []
    lowest, highest = _offset_range(zone)
    walk_from = (lower + lowest).replace(tzinfo=None)
    for wall in _iter_walls(cron, walk_from):
        floor = wall.replace(tzinfo=UTC) - highest  # no instant of ``wall`` is earlier
        if len(found) >= count and found[count - 1] <= floor:
            break
        if end is not None and floor > end:
            break
        for instant in _wall_instants(cron, zone, wall):
            if instant <= after or (start is not None and instant < start):
                continue
            if end is not None and instant > end:
                continue
            index = bisect.bisect_left(found, instant)
            if index == len(found) or found[index] != instant:
                found.insert(index, instant)
                del found[count:]
    return [from_ms(to_ms(instant, "slot")) for instant in found]


def _cron_times_before(
    cron: CronSpec, zone: ZoneInfo, before: datetime, lowest: datetime, count: int
) -> list[datetime]:
    """The latest ``count`` instants in ``[lowest, before)``, ascending: the same instants as
    :func:`_cron_times`, found by walking the wall-clock slots backwards."""
    found: list[datetime] = []
    low_offset, high_offset = _offset_range(zone)
    walk_from = (min(before, _LATEST) + high_offset).replace(tzinfo=None)
    for wall in _iter_walls_back(cron, walk_from):
        ceiling = wall.replace(tzinfo=UTC) - low_offset  # no instant of ``wall`` is later
        if ceiling < lowest or (len(found) == count and found[0] >= ceiling):
            break
        for instant in _wall_instants(cron, zone, wall):
            if instant >= before or instant < lowest:
                continue
            index = bisect.bisect_left(found, instant)
            if index == len(found) or found[index] != instant:
                found.insert(index, instant)
                del found[:-count]
    return [from_ms(to_ms(instant, "slot")) for instant in found]


def _cron_count(cron: CronSpec, zone: ZoneInfo, first: datetime, last: datetime, limit: int) -> int | None:
    """How many instants lie in ``[first, last]``, or ``None`` past ``limit`` (it walks them)."""
    seen: set[datetime] = set()
    lowest, highest = _offset_range(zone)
    for wall in _iter_walls(cron, (first + lowest).replace(tzinfo=None)):
        if wall.replace(tzinfo=UTC) - highest > last:
            break
        seen.update(instant for instant in _wall_instants(cron, zone, wall) if first <= instant <= last)
        if len(seen) > limit:
            return None
    return len(seen)


def _every_range(
    every: int, anchor: datetime, start: datetime | None, end: datetime | None, first_ms: int, last_ms: int
) -> tuple[int, int, int, int]:
    """``(anchor_ms, step_ms, k_first, k_last)``: the slots ``anchor + k * step`` in
    ``[first_ms, last_ms]`` are those with ``k_first <= k <= k_last`` (none if k_last < k_first)."""
    step = every * 1000
    anchor_ms = to_ms(anchor, "anchor")
    low = max(first_ms, anchor_ms, 0 if start is None else to_ms(start, "start_at"))
    high = min(last_ms, _MAX_MS if end is None else to_ms(end, "end_at"))
    return anchor_ms, step, -((anchor_ms - low) // step), (high - anchor_ms) // step


def _every_times(
    every: int, anchor: datetime, after: datetime, start: datetime | None, end: datetime | None, count: int
) -> list[datetime]:
    step = every * 1000
    anchor_ms = to_ms(anchor, "anchor")
    lower = to_ms(after, "after") + 1
    if start is not None:
        lower = max(lower, to_ms(start, "start_at"))
    k = 0 if lower <= anchor_ms else -((anchor_ms - lower) // step)  # ceil division
    limit = _MAX_MS if end is None else to_ms(end, "end_at")
    out: list[datetime] = []
    slot = anchor_ms + k * step
    while len(out) < count and slot <= limit:
        out.append(from_ms(slot))
        slot += step
    return out


@dataclass(frozen=True)
class _Schedule:
    """A validated trigger with its instants parsed, for the fire-time functions below."""

    spec: dict[str, Any]
    start: datetime | None
    end: datetime | None
    anchor: datetime  # of ``every`` slots


def _schedule(trigger: Any, anchor: datetime | int | None) -> _Schedule:
    spec = validate_trigger(trigger)
    anchor_dt = _EPOCH if anchor is None else to_datetime(anchor, "anchor")
    start = _instant(spec["start_at"], "trigger.start_at") if "start_at" in spec else None
    end = _instant(spec["end_at"], "trigger.end_at") if "end_at" in spec else None
    if "anchor" in spec:
        anchor_dt = _instant(spec["anchor"], "trigger.anchor")
    return _Schedule(spec, start, end, anchor_dt)


def _at(schedule: _Schedule) -> datetime | None:
    """A one-off's instant, or ``None`` when ``start_at``/``end_at`` exclude it."""
    at = _instant(schedule.spec["at"], "trigger.at")
    start, end = schedule.start, schedule.end
    return None if (start is not None and at < start) or (end is not None and at > end) else at


def _cron(schedule: _Schedule) -> tuple[CronSpec, ZoneInfo]:
    spec = schedule.spec
    return parse_cron(spec["cron"], "trigger.cron"), _zone(spec["timezone"], "trigger.timezone")


def next_fire_times(
    trigger: Any,
    *,
    after: datetime | int,
    count: int = 1,
    anchor: datetime | int | None = None,
) -> list[datetime]:
    """The next ``count`` (1..1000) fire times of ``trigger`` strictly after ``after``.

    Returns aware UTC datetimes truncated to milliseconds, strictly increasing; fewer when the
    schedule ends (``at`` passed, ``end_at``) and ``[]`` for ``{}``. ``trigger`` is validated
    first (same errors as :func:`validate_trigger`). ``after`` is an aware datetime (or epoch
    milliseconds; naive -> ``InvalidArgument("after")``). For ``every`` the slots are
    ``anchor + k * every`` for k >= 0, where ``anchor`` is the trigger's own ``anchor``, else
    the ``anchor`` argument (e.g. the job's creation time), else the Unix epoch. No slot is
    before ``start_at`` or after ``end_at``.
    """
    schedule = _schedule(trigger, anchor)
    after_dt = to_datetime(after, "after")
    normalize_int(count, "count", minimum=1, maximum=MAX_COUNT)
    spec, start, end = schedule.spec, schedule.start, schedule.end
    if not spec:
        return []
    if "at" in spec:
        at = _at(schedule)
        return [] if at is None or at <= after_dt else [at]
    if "every" in spec:
        return _every_times(spec["every"], schedule.anchor, after_dt, start, end, count)
    cron, zone = _cron(schedule)
    return _cron_times(cron, zone, after_dt, start, end, count)


def next_fire_time(
    trigger: Any, *, after: datetime | int, anchor: datetime | int | None = None
) -> datetime | None:
    """The first of :func:`next_fire_times`, or ``None`` when the trigger never fires again."""
    times = next_fire_times(trigger, after=after, count=1, anchor=anchor)
    return times[0] if times else None


def previous_fire_times(
    trigger: Any,
    *,
    before: datetime | int,
    count: int = 1,
    anchor: datetime | int | None = None,
    not_before: datetime | int | None = None,
) -> list[datetime]:
    """The latest ``count`` (1..1000) fire times strictly before ``before`` and at or after
    ``not_before``, strictly increasing: the slots of :func:`next_fire_times` (same
    arguments, same daylight-saving rules), found from the end.

    ``every`` slots are computed directly and a cron is walked backwards from ``before``, so the
    work depends on ``count`` and on how sparse the schedule is, never on how long ago
    ``not_before`` is: a scheduler back from a long outage finds its latest slots this way.
    """
    schedule = _schedule(trigger, anchor)
    before_dt = to_datetime(before, "before")
    normalize_int(count, "count", minimum=1, maximum=MAX_COUNT)
    lowest = _EPOCH if not_before is None else to_datetime(not_before, "not_before")
    spec, start, end = schedule.spec, schedule.start, schedule.end
    if start is not None:
        lowest = max(lowest, start)
    if end is not None:
        before_dt = min(before_dt, end + _MS)
    if not spec or before_dt <= lowest:
        return []
    if "at" in spec:
        at = _at(schedule)
        return [at] if at is not None and lowest <= at < before_dt else []
    if "every" in spec:
        anchor_ms, step, k_first, k_last = _every_range(
            spec["every"],
            schedule.anchor,
            start,
            end,
            to_ms(lowest, "not_before"),
            to_ms(before_dt, "before") - 1,
        )
        return [from_ms(anchor_ms + k * step) for k in range(max(k_first, k_last - count + 1), k_last + 1)]
    cron, zone = _cron(schedule)
    return _cron_times_before(cron, zone, before_dt, lowest, count)


def count_fire_times(
    trigger: Any,
    *,
    first: datetime | int,
    last: datetime | int,
    anchor: datetime | int | None = None,
    limit: int = MAX_COUNTED_SLOTS,
) -> int | None:
    """How many fire times lie in ``[first, last]`` (the slots of :func:`next_fire_times`).

    ``every`` and ``at`` are counted by arithmetic, exactly over any range. A cron is counted
    by walking its slots (daylight saving makes wall-clock arithmetic wrong), so the answer is
    ``None`` when there are more than ``limit``: the caller reports those as uncounted.
    """
    schedule = _schedule(trigger, anchor)
    first_dt, last_dt = to_datetime(first, "first"), to_datetime(last, "last")
    normalize_int(limit, "limit", minimum=0)
    spec = schedule.spec
    if not spec or last_dt < first_dt:
        return 0
    if "at" in spec:
        at = _at(schedule)
        return int(at is not None and first_dt <= at <= last_dt)
    if "every" in spec:
        _, _, k_first, k_last = _every_range(
            spec["every"],
            schedule.anchor,
            schedule.start,
            schedule.end,
            to_ms(first_dt, "first"),
            to_ms(last_dt, "last"),
        )
        return max(0, k_last - k_first + 1)
    cron, zone = _cron(schedule)
    if schedule.start is not None:
        first_dt = max(first_dt, schedule.start)
    if schedule.end is not None:
        last_dt = min(last_dt, schedule.end)
    return _cron_count(cron, zone, first_dt, last_dt, limit) if first_dt <= last_dt else 0


# --------------------------------------------------------------------------- words and keys


def _plural(amount: int, unit: str) -> str:
    return f"every {unit}" if amount == 1 else f"every {amount} {unit}s"


def _describe_every(seconds: int) -> str:
    for size, unit in ((86_400, "day"), (3600, "hour"), (60, "minute")):
        if seconds % size == 0:
            return _plural(seconds // size, unit)
    return _plural(seconds, "second")


def _words_time(value: str) -> str:
    moment = _instant(value, "trigger")
    text = moment.strftime("%Y-%m-%d %H:%M")
    if moment.second or moment.microsecond:
        text = moment.strftime("%Y-%m-%d %H:%M:%S")
        if moment.microsecond:
            text += f".{moment.microsecond // 1000:03d}"
    return text + " UTC"


def describe_trigger(trigger: Any) -> str:
    """Short English for the admin, e.g. ``cron 0 9 * * 1-5 (Europe/Berlin)``.

    Other forms: ``every 5 minutes``, ``once at 2026-12-01 09:00 UTC``,
    ``no schedule (enqueue only)``; ``start_at``/``end_at`` add ``, from ...``/``, until ...``.
    The trigger is validated first.
    """
    spec = validate_trigger(trigger)
    if not spec:
        return "no schedule (enqueue only)"
    if "cron" in spec:
        text = f"cron {spec['cron']} ({spec['timezone']})"
    elif "every" in spec:
        text = _describe_every(spec["every"])
        if "anchor" in spec:
            text += f" from {_words_time(spec['anchor'])}"
    else:
        text = f"once at {_words_time(spec['at'])}"
    if "start_at" in spec:
        text += f", from {_words_time(spec['start_at'])}"
    if "end_at" in spec:
        text += f", until {_words_time(spec['end_at'])}"
    return text


def slot_trigger_key(slot: datetime) -> str:
    """The trigger key of a materialized slot: ``schedule:2026-03-29T01:00:00.000Z``."""
    return "schedule:" + iso_ms(to_datetime(slot, "slot"))
