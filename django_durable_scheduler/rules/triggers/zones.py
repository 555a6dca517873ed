"""IANA time zones and daylight saving: which real instants a local wall-clock slot is
(``docs/design.md``, "Schedules and misfire").

The ISC/Vixie cron rule:

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

croniter's own time zone handling is not used: it fires a restricted-hour slot in a repeated
fall-back hour twice (once per instance) and, when started between the two instances, fires
the second one. The fire-time walks enumerate *naive* wall-clock times instead and map each
to instants here, with :mod:`zoneinfo` (``fold`` handling and gap detection done here).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from ...exceptions import InvalidArgument
from ..validation import preview

__all__ = ["iana_zone", "offset_range", "wall_instants"]

_REFUSED_ZONES: Final = frozenset({"localtime", "posixrules"})
# Any real UTC offset is strictly between -24 h and +24 h (Python enforces it), so the
# instants of a naive wall-clock time ``t`` all lie in (t - 24 h, t + 24 h).
_OFFSET_BOUND: Final = timedelta(hours=24)


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones())


@lru_cache(maxsize=512)
def _load_zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


@lru_cache(maxsize=512)
def offset_range(zone: ZoneInfo) -> tuple[timedelta, timedelta]:
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


def iana_zone(name: Any, field: str) -> ZoneInfo:
    """The zone named ``name``, or :class:`InvalidArgument` naming ``field``."""
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


def wall_instants(wall: datetime, zone: ZoneInfo, real_time: bool) -> list[datetime]:
    """The instants at which the wall-clock slot ``wall`` fires (the daylight-saving rules above):
    ``real_time`` when the cron's hour field is the literal ``*``."""
    return _all_instances(wall, zone) if real_time else [_first_instance(wall, zone)]
