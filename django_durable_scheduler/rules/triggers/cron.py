"""The cron dialect: a 5-field expression parsed into the values each field matches
(``docs/design.md``, "Schedules and misfire").

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

Day of month and day of week combine as in POSIX cron: when both fields are restricted
(anything but the literal ``*``), a day matches if either matches; if one of them is ``*``,
only the other applies. Whether the hour field is the literal ``*`` decides how the cron
meets daylight saving (:mod:`.zones`).

croniter is used as a *second opinion* here (an expression that croniter refuses is refused
too), never for iteration: its expansion is lossy (``1-1`` becomes ``*``, so ``0 1-1 * * *``
fires hourly; ``*/1`` and ``1-31`` also become ``*``, which hides whether a field is
restricted), so this module parses the cron itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from typing import Any, Final

from ...exceptions import InvalidArgument

__all__ = ["MAX_CRON_LENGTH", "CronSpec", "parse_cron"]

MAX_CRON_LENGTH: Final = 1024

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
_ITEM_RE: Final = re.compile(r"^(?:(\*)|([0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?)(?:/([0-9]+))?$")


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
    # Imported here: importing croniter takes tens of milliseconds, which every process that
    # starts Django would pay, while only the processes that parse a cron use it.
    from croniter import croniter

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
