"""A frozen copy of the trigger rules of 0.1.0, for migration 0004's ``first_fire_times`` only.

Migration 0004 gives every scheduled job its first fire time. That answer needs the trigger
rules (5-field cron with POSIX day matching, IANA zones with the daylight-saving rule of
``docs/design.md``, "Schedules and misfire", ``every`` with an anchor, ``at`` with a catch-up
window, ``start_at``/``end_at``), and a migration must give the same answer forever, whatever
``triggers.py`` becomes. So this module holds them as they were when 0004 was written,
reduced to what that answer needs: deciding whether a stored trigger is valid (the same
triggers are refused as by ``triggers.validate_trigger`` of 0.1.0, without its messages) and
its first slot strictly after now (``schedules.initial_fire_time`` of 0.1.0).

Frozen: never edit this to follow ``triggers.py``. It lives next to the migration, not in
it, so that 0004 stays readable as operations; the migration loader skips modules whose
names start with an underscore. The only imports are the standard library and croniter
(the package's dependency, asked for a second opinion on a cron, as 0.1.0 did).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

SCHEDULE_KEYS = ("cron", "every", "at")
TRIGGER_KEYS = (
    *SCHEDULE_KEYS,
    "timezone",
    "anchor",
    "misfire",
    "catchup_window",
    "overlap",
    "start_at",
    "end_at",
)
MISFIRE_POLICIES = ("skip", "run_latest", "run_all")
OVERLAP_POLICIES = ("allow", "skip")
DEFAULT_CATCHUP_WINDOW = 3600
MAX_CATCHUP_WINDOW = 31 * 86_400
MAX_EVERY = 366 * 86_400
MAX_CRON_LENGTH = 1024
MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DOW_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
MONTH_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
REFUSED_ZONES = frozenset({"localtime", "posixrules"})
ITEM_RE = re.compile(r"^(?:(\*)|([0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?)(?:/([0-9]+))?$")
OFFSET_BOUND = timedelta(hours=24)  # every real UTC offset is strictly inside +-24 h
LAST_DAY = date(9999, 12, 29)


class Invalid(ValueError):
    """A stored trigger that 0.1.0 refused: it never fires."""


@dataclass(frozen=True)
class CronField:
    low: int
    high: int  # highest value that ``*`` covers
    max_value: int  # highest value accepted (7 for day of week)
    names: tuple[str, ...] = ()
    name_base: int = 0


FIELDS = (
    CronField(0, 59, 59),
    CronField(0, 23, 23),
    CronField(1, 31, 31),
    CronField(1, 12, 12, MONTH_NAMES, 1),
    CronField(0, 6, 7, DOW_NAMES, 0),
)


@dataclass(frozen=True)
class Cron:
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


@dataclass(frozen=True)
class Schedule:
    """A valid stored trigger, its instants parsed."""

    kind: str
    cron: Cron | None
    zone: ZoneInfo | None
    every: int
    anchor: datetime | None
    at: datetime | None
    catchup_window: int
    start: datetime | None
    end: datetime | None


def first_fire_time(trigger: Any, *, now: datetime, anchor: datetime) -> datetime | None:
    """A job's first slot strictly after ``now`` (an ``at`` still within its catch-up window
    counts), or ``None`` when the trigger is invalid, empty or never fires again."""
    try:
        schedule = parse_trigger(trigger)
    except Invalid:
        return None
    if schedule is None:
        return None
    after = now
    if schedule.kind == "at":
        after = now - timedelta(seconds=schedule.catchup_window)
    return next_fire_time(schedule, after=to_datetime(after), anchor=to_datetime(anchor))


# --------------------------------------------------------------------------- validity


def parse_trigger(trigger: Any) -> Schedule | None:
    """The schedule of a stored trigger, ``None`` for ``{}`` (no schedule); raises
    :class:`Invalid` for one that 0.1.0 refused."""
    if not isinstance(trigger, Mapping) or any(not isinstance(key, str) for key in trigger):
        raise Invalid
    if any(key not in TRIGGER_KEYS for key in trigger):
        raise Invalid
    kinds = [key for key in SCHEDULE_KEYS if key in trigger]
    if len(kinds) > 1:
        raise Invalid
    if not kinds:
        if trigger:
            raise Invalid  # options without a schedule
        return None
    kind = kinds[0]
    if ("timezone" in trigger and kind != "cron") or ("anchor" in trigger and kind != "every"):
        raise Invalid
    cron = zone = anchor = at = None
    every = 0
    if kind == "cron":
        cron = parse_cron(trigger["cron"])
        zone = parse_zone(trigger.get("timezone", "UTC"))
    elif kind == "every":
        every = int_seconds(trigger["every"], 1, MAX_EVERY)
        anchor = instant(trigger["anchor"]) if "anchor" in trigger else None
    else:
        at = instant(trigger["at"])
    if trigger.get("misfire", "run_latest") not in MISFIRE_POLICIES:
        raise Invalid
    catchup = int_seconds(trigger.get("catchup_window", DEFAULT_CATCHUP_WINDOW), 0, MAX_CATCHUP_WINDOW)
    if trigger.get("overlap", "allow") not in OVERLAP_POLICIES:
        raise Invalid
    start = instant(trigger["start_at"]) if "start_at" in trigger else None
    end = instant(trigger["end_at"]) if "end_at" in trigger else None
    if start is not None and end is not None and end <= start:
        raise Invalid
    return Schedule(kind, cron, zone, every, anchor, at, catchup, start, end)


def field_value(text: str, spec: CronField) -> int:
    if text.isdigit():
        if len(text) > 4:
            raise Invalid
        value = int(text)
    elif text.isalpha() and spec.names and text.upper() in spec.names:
        value = spec.names.index(text.upper()) + spec.name_base
    else:
        raise Invalid
    if not spec.low <= value <= spec.max_value:
        raise Invalid
    return value


def parse_field(text: str, spec: CronField) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        match = ITEM_RE.match(item)
        if match is None:
            raise Invalid
        star, first, last, step_text = match.groups()
        if star:
            start, stop = spec.low, spec.high
        else:
            if last is None and step_text is not None:
                raise Invalid  # value/step
            start = field_value(first, spec)
            stop = start if last is None else field_value(last, spec)
            if stop < start:
                raise Invalid
        step = 1
        if step_text is not None:
            span = spec.high - spec.low + 1
            step = int(step_text) if len(step_text) <= 4 else span + 1
            if not 1 <= step <= span:
                raise Invalid
        values.update(range(start, stop + 1, step))
    if spec.max_value == 7 and 7 in values:  # day of week: 7 is Sunday
        values.discard(7)
        values.add(0)
    return values


def parse_cron(expression: Any) -> Cron:
    if not isinstance(expression, str) or len(expression) > MAX_CRON_LENGTH:
        raise Invalid
    expression = " ".join(expression.split())
    lowered = expression.lower()
    if lowered.startswith("@"):
        if lowered not in MACROS:
            raise Invalid  # @reboot or an unknown macro
        expression = MACROS[lowered]
    parts = expression.split()
    if len(parts) != 5:
        raise Invalid
    minutes, hours, days, months, weekdays = (
        parse_field(part, spec) for part, spec in zip(parts, FIELDS, strict=True)
    )
    dom_star, dow_star = parts[2] == "*", parts[4] == "*"
    if dow_star and not any(day <= MONTH_MAX_DAYS[month - 1] for month in months for day in days):
        raise Invalid  # can never fire
    try:
        croniter.expand(" ".join(parts))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise Invalid from exc
    return Cron(
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        hour_star=parts[1] == "*",
        dom_star=dom_star,
        dow_star=dow_star,
    )


@lru_cache(maxsize=1)
def known_zones() -> frozenset[str]:
    return frozenset(available_timezones())


def parse_zone(name: Any) -> ZoneInfo:
    if not isinstance(name, str) or not name or len(name) > 255 or name in REFUSED_ZONES:
        raise Invalid
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise Invalid from exc
    known = known_zones()
    if known and name not in known:
        raise Invalid
    return zone


def instant(value: Any) -> datetime:
    """An ISO-8601 string with a UTC offset -> aware UTC datetime truncated to milliseconds."""
    if not isinstance(value, str):
        raise Invalid
    text = value.strip()
    try:
        # Printable first: the C parser stops at a NUL and would take what follows as valid.
        parsed = datetime.fromisoformat(text) if text.isprintable() else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None or parsed.utcoffset() is None:
        raise Invalid
    return to_datetime(parsed)


def int_seconds(value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise Invalid
    return value


def to_ms(value: datetime) -> int:
    delta = value - EPOCH
    ms = delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
    if not 0 <= ms <= MAX_EPOCH_MS:
        raise Invalid
    return ms


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def to_datetime(value: datetime) -> datetime:
    return from_ms(to_ms(value))


# --------------------------------------------------------------------------- the next slot


def next_fire_time(schedule: Schedule, *, after: datetime, anchor: datetime) -> datetime | None:
    """The first slot strictly after ``after``, never before ``start_at`` nor after ``end_at``.
    ``every`` slots are ``anchor + k * every`` (k >= 0), the trigger's own anchor first."""
    start, end = schedule.start, schedule.end
    if schedule.at is not None:
        at = schedule.at
        outside = (start is not None and at < start) or (end is not None and at > end)
        return None if outside or at <= after else at
    if schedule.cron is None or schedule.zone is None:
        return next_every(schedule.every, schedule.anchor or anchor, after, start, end)
    return next_cron(schedule.cron, schedule.zone, after, start, end)


def next_every(
    every: int, anchor: datetime, after: datetime, start: datetime | None, end: datetime | None
) -> datetime | None:
    step = every * 1000
    anchor_ms = to_ms(anchor)
    lower = to_ms(after) + 1
    if start is not None:
        lower = max(lower, to_ms(start))
    k = 0 if lower <= anchor_ms else -((anchor_ms - lower) // step)  # ceil division
    limit = MAX_EPOCH_MS if end is None else to_ms(end)
    slot = anchor_ms + k * step
    return from_ms(slot) if slot <= limit else None


@lru_cache(maxsize=512)
def offset_range(zone: ZoneInfo) -> tuple[timedelta, timedelta]:
    """The lowest and highest UTC offsets ``zone`` uses from 1970 on (sampled daily to 2100,
    widened by an hour): the instants of a wall-clock time ``t`` lie in
    ``[t - highest, t - lowest]``."""
    offsets = {datetime.fromtimestamp(ts, zone).utcoffset() for ts in range(0, 4_102_444_800, 86_400)}
    known = [offset for offset in offsets if offset is not None]
    margin = timedelta(hours=1)
    return max(min(known) - margin, -OFFSET_BOUND), min(max(known) + margin, OFFSET_BOUND)


def iter_walls(cron: Cron, start: datetime) -> Iterator[datetime]:
    """Matching naive wall-clock times >= ``start`` (whole minutes), in order."""
    if start.second or start.microsecond:
        start = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    day = start.date()
    first = True
    while day <= LAST_DAY:
        if day.month not in cron.months:
            if day.year == LAST_DAY.year and day.month == 12:
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


def to_utc(wall: datetime, zone: ZoneInfo, fold: int) -> datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def exists(moment: datetime, wall: datetime, zone: ZoneInfo) -> bool:
    return moment.astimezone(zone).replace(tzinfo=None) == wall


def gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the spring-forward gap that swallowed ``wall``."""
    low, high = sorted((to_utc(wall, zone, 0), to_utc(wall, zone, 1)))  # transition in (low, high]
    before = low.astimezone(zone).utcoffset()
    lo_s, hi_s = 0, int((high - low).total_seconds())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if (low + timedelta(seconds=mid)).astimezone(zone).utcoffset() == before:
            lo_s = mid
        else:
            hi_s = mid
    return low + timedelta(seconds=hi_s)


def wall_instants(cron: Cron, zone: ZoneInfo, wall: datetime) -> list[datetime]:
    """A literal ``*`` hour runs on real time (every instance of ``wall``: none in a gap, two
    in a fold); a restricted hour fires once, at the first instance or the end of the gap."""
    if cron.hour_star:
        found: list[datetime] = []
        for fold in (0, 1):
            moment = to_utc(wall, zone, fold)
            if moment not in found and exists(moment, wall, zone):
                found.append(moment)
        return sorted(found)
    moment = to_utc(wall, zone, 0)  # fold=0 is the earlier instance of a repeated time
    return [moment if exists(moment, wall, zone) else gap_end(wall, zone)]


def next_cron(
    cron: Cron, zone: ZoneInfo, after: datetime, start: datetime | None, end: datetime | None
) -> datetime | None:
    lower = after if start is None or start <= after else start
    best: datetime | None = None
    lowest, highest = offset_range(zone)
    for wall in iter_walls(cron, (lower + lowest).replace(tzinfo=None)):
        floor = wall.replace(tzinfo=UTC) - highest  # no instant of ``wall`` is earlier
        if (best is not None and best <= floor) or (end is not None and floor > end):
            break
        for moment in wall_instants(cron, zone, wall):
            if moment <= after or (start is not None and moment < start):
                continue
            if end is not None and moment > end:
                continue
            if best is None or moment < best:
                best = moment
    return None if best is None else to_datetime(best)
