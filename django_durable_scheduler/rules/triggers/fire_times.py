"""When a trigger fires: its next, previous and counted fire times, and a slot's key
(``docs/design.md``, "Schedules and misfire").

A cron is walked over *naive* local wall-clock times that match it (:mod:`.cron`), and each
is mapped to the real instants it is (:mod:`.zones`, the daylight-saving rules); ``every`` and
``at`` slots are arithmetic.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

from ..validation import from_ms, iso_ms, normalize_int, to_datetime, to_ms
from . import parse_instant, validate_trigger
from .cron import CronSpec, parse_cron
from .zones import iana_zone, offset_range, wall_instants

__all__ = [
    "MAX_COUNT",
    "MAX_COUNTED_SLOTS",
    "count_fire_times",
    "next_fire_time",
    "next_fire_times",
    "previous_fire_times",
    "slot_trigger_key",
]

MAX_COUNT: Final = 1000
# Counting a cron's slots means walking them, so :func:`count_fire_times` stops here.
MAX_COUNTED_SLOTS: Final = 10_000

_LAST_DAY: Final = date(9999, 12, 29)
# No slot is before the Unix epoch (``identity.to_ms`` refuses it); walking back stops here.
_FIRST_DAY: Final = date(1969, 12, 30)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_MAX_MS: Final = 253_402_300_799_999
# Walking back starts up to a day after ``before``: capped to stay within datetime's range.
_LATEST: Final = datetime(9999, 12, 29, tzinfo=UTC)


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
    lowest, highest = offset_range(zone)
    walk_from = (lower + lowest).replace(tzinfo=None)
    for wall in _iter_walls(cron, walk_from):
        floor = wall.replace(tzinfo=UTC) - highest  # no instant of ``wall`` is earlier
        if len(found) >= count and found[count - 1] <= floor:
            break
        if end is not None and floor > end:
            break
        for instant in wall_instants(wall, zone, cron.hour_star):
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
    low_offset, high_offset = offset_range(zone)
    walk_from = (min(before, _LATEST) + high_offset).replace(tzinfo=None)
    for wall in _iter_walls_back(cron, walk_from):
        ceiling = wall.replace(tzinfo=UTC) - low_offset  # no instant of ``wall`` is later
        if ceiling < lowest or (len(found) == count and found[0] >= ceiling):
            break
        for instant in wall_instants(wall, zone, cron.hour_star):
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
    lowest, highest = offset_range(zone)
    for wall in _iter_walls(cron, (first + lowest).replace(tzinfo=None)):
        if wall.replace(tzinfo=UTC) - highest > last:
            break
        seen.update(
            instant for instant in wall_instants(wall, zone, cron.hour_star) if first <= instant <= last
        )
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
    start = parse_instant(spec["start_at"], "trigger.start_at") if "start_at" in spec else None
    end = parse_instant(spec["end_at"], "trigger.end_at") if "end_at" in spec else None
    if "anchor" in spec:
        anchor_dt = parse_instant(spec["anchor"], "trigger.anchor")
    return _Schedule(spec, start, end, anchor_dt)


def _at(schedule: _Schedule) -> datetime | None:
    """A one-off's instant, or ``None`` when ``start_at``/``end_at`` exclude it."""
    at = parse_instant(schedule.spec["at"], "trigger.at")
    start, end = schedule.start, schedule.end
    return None if (start is not None and at < start) or (end is not None and at > end) else at


def _cron(schedule: _Schedule) -> tuple[CronSpec, ZoneInfo]:
    spec = schedule.spec
    return parse_cron(spec["cron"], "trigger.cron"), iana_zone(spec["timezone"], "trigger.timezone")


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


def slot_trigger_key(slot: datetime) -> str:
    """The trigger key of a materialized slot: ``schedule:2026-03-29T01:00:00.000Z``."""
    return "schedule:" + iso_ms(to_datetime(slot, "slot"))
