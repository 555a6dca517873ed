"""Property tests: ``next_fire_times`` against a brute-force, minute-by-minute reference.

The reference below is written independently of ``rules/triggers``: the cron is generated as a
structure, the sets of matching values come from that structure (not from our parser), and
fire times come from walking real UTC minutes and applying the daylight-saving rules of
``docs/design.md``, "Schedules and misfire", literally:

* hour field ``*`` (real time): a UTC minute fires when its local wall-clock time matches.
* restricted hour field: keep ``high``, the latest local wall-clock time seen so far. When a
  minute's wall-clock time ``L`` passes ``high``, every wall-clock slot in ``(high, L]`` has
  now been reached for the first time; the minute fires if any of them matches. A repeated
  (fall-back) time is never above ``high``, so it fires at its first instance only; the slots
  skipped by a spring-forward gap are all reached at the first instant after the gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from django.conf import settings as django_settings
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from django_durable_scheduler.rules.triggers.cron import parse_cron
from django_durable_scheduler.rules.triggers.fire_times import (
    count_fire_times,
    next_fire_times,
    previous_fire_times,
)

# Pure computation, no database: it runs on the SQLite legs (one per Django and Python
# version); each server leg would repeat the same 20 s of work and test nothing more.
pytestmark = pytest.mark.skipif(
    "sqlite" not in django_settings.DATABASES["default"]["ENGINE"],
    reason="no database here: the SQLite legs run it",
)

ZONES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "UTC")
HORIZON = timedelta(days=8)
MINUTE = timedelta(minutes=1)
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


# ----------------------------------------------------------------------------- transitions


@cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """UTC instants (to the minute) where the zone's offset changes, 2025-2027."""
    zone = ZoneInfo(zone_name)
    found: list[datetime] = []
    moment = datetime(2025, 1, 1, tzinfo=UTC)
    stop = datetime(2028, 1, 1, tzinfo=UTC)
    step = timedelta(hours=1)
    while moment < stop:
        nxt = moment + step
        if moment.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            probe = moment
            while probe.astimezone(zone).utcoffset() == moment.astimezone(zone).utcoffset():
                probe += MINUTE
            found.append(probe)
        moment = nxt
    return tuple(found)


def test_transition_table_is_what_we_expect() -> None:
    berlin = transitions("Europe/Berlin")
    assert datetime(2026, 3, 29, 1, 0, tzinfo=UTC) in berlin
    assert datetime(2026, 10, 25, 1, 0, tzinfo=UTC) in berlin
    assert len(berlin) == 6
    assert len(transitions("America/New_York")) == 6
    assert datetime(2026, 10, 3, 15, 30, tzinfo=UTC) in transitions("Australia/Lord_Howe")
    assert transitions("Asia/Kolkata") == ()
    assert transitions("UTC") == ()


# ----------------------------------------------------------------------------- cron model


@dataclass(frozen=True)
class Item:
    start: int | None  # None: "*"
    stop: int | None
    step: int | None
    names: bool  # spell values with names (month and day-of-week fields)


@dataclass(frozen=True)
class FieldModel:
    low: int
    high: int  # what "*" covers
    items: tuple[Item, ...]  # () means the literal "*"
    names: tuple[str, ...] = ()
    name_base: int = 0

    def spell(self, value: int, names: bool) -> str:
        if names and self.names and value - self.name_base < len(self.names):
            return self.names[value - self.name_base]
        return str(value)

    def text(self, *, for_croniter: bool = False) -> str:
        if not self.items:
            return "*"
        parts = []
        for item in self.items:
            if for_croniter and item.start is not None and item.start == item.stop:
                # croniter 7.0.0 expands a one-value range "a-a" to the whole field; spell it "a".
                parts.append(self.spell(item.start, item.names))
                continue
            if item.start is None:
                base = "*"
            elif item.stop is None:
                base = self.spell(item.start, item.names)
            else:
                base = f"{self.spell(item.start, item.names)}-{self.spell(item.stop, item.names)}"
            parts.append(base if item.step is None else f"{base}/{item.step}")
        return ",".join(parts)

    def values(self) -> set[int]:
        if not self.items:
            return set(range(self.low, self.high + 1))
        out: set[int] = set()
        for item in self.items:
            start = self.low if item.start is None else item.start
            stop = self.high if item.start is None else (item.start if item.stop is None else item.stop)
            out.update(range(start, stop + 1, item.step or 1))
        return out


@dataclass(frozen=True)
class CronModel:
    minute: FieldModel
    hour: FieldModel
    dom: FieldModel
    month: FieldModel
    dow: FieldModel

    def text(self, *, for_croniter: bool = False) -> str:
        fields = (self.minute, self.hour, self.dom, self.month, self.dow)
        return " ".join(f.text(for_croniter=for_croniter) for f in fields)


@st.composite
def items(draw: st.DrawFn, low: int, high: int, max_value: int, named: bool, hot: tuple[int, ...]) -> Item:
    value = (
        st.one_of(st.sampled_from(hot), st.integers(low, max_value)) if hot else st.integers(low, max_value)
    )
    kind = draw(st.sampled_from(("value", "value", "range", "range_step", "star_step")))
    names = named and draw(st.booleans())
    span = high - low + 1
    if kind == "star_step":
        return Item(None, None, draw(st.integers(1, span)), names)
    start = draw(value)
    if kind == "value":
        return Item(start, None, None, names)
    stop = draw(st.integers(start, max_value))
    step = draw(st.integers(1, span)) if kind == "range_step" else None
    return Item(start, stop, step, names)


def field_model(
    low: int,
    high: int,
    *,
    max_value: int | None = None,
    star_weight: int = 1,
    names: tuple[str, ...] = (),
    name_base: int = 0,
    hot: tuple[int, ...] = (),
) -> st.SearchStrategy[FieldModel]:
    top = high if max_value is None else max_value
    listed = st.lists(items(low, high, top, bool(names), hot), min_size=1, max_size=3).map(tuple)
    choice = st.one_of(*([st.just(())] * star_weight), listed)
    return choice.map(lambda its: FieldModel(low, high, its, names, name_base))


crons = st.builds(
    CronModel,
    minute=field_model(0, 59, hot=(0, 15, 30, 45, 59)),
    hour=field_model(0, 23, hot=(0, 1, 2, 3, 23)),
    dom=field_model(1, 31, star_weight=4, hot=(1, 13, 28, 29, 31)),
    month=field_model(1, 12, star_weight=6, names=MONTHS, name_base=1, hot=(3, 4, 10, 11)),
    dow=field_model(0, 6, max_value=7, star_weight=3, names=DAYS, hot=(0, 5, 7)),
)


# ----------------------------------------------------------------------------- reference


def reference_fire_times(model: CronModel, zone_name: str, after: datetime, count: int) -> list[datetime]:
    """Brute force: walk real UTC minutes in (after, after + HORIZON]; see the module docstring."""
    zone = ZoneInfo(zone_name)
    minutes, hours = model.minute.values(), model.hour.values()
    doms, months = model.dom.values(), model.month.values()
    dows = {0 if d == 7 else d for d in model.dow.values()}
    dom_star, dow_star = not model.dom.items, not model.dow.items

    def matches(wall: datetime) -> bool:
        if wall.minute not in minutes or wall.hour not in hours or wall.month not in months:
            return False
        dom_ok = wall.day in doms
        dow_ok = (wall.weekday() + 1) % 7 in dows  # Python: Monday=0; cron: Sunday=0
        return (dom_ok and dow_ok) if (dom_star or dow_star) else (dom_ok or dow_ok)

    def local(moment: datetime) -> datetime:
        return moment.astimezone(zone).replace(tzinfo=None)

    moment = (after - timedelta(days=1)).replace(second=0, microsecond=0)
    high = local(moment)
    fires: list[datetime] = []
    while moment <= after + HORIZON and len(fires) < count:
        moment += MINUTE
        wall = local(moment)
        if not model.hour.items:  # hour field "*": real time
            hit = matches(wall)
        else:
            hit = False
            reached = high + MINUTE
            while reached <= wall:
                if matches(reached):
                    hit = True
                    break
                reached += MINUTE
            high = max(high, wall)
        if hit and moment > after and moment <= after + HORIZON:
            fires.append(moment)
    return fires


@st.composite
def instants_near_transitions(draw: st.DrawFn, zone_name: str) -> datetime:
    table = transitions(zone_name)
    if table:
        center = draw(st.sampled_from(table))
    else:
        day = draw(st.dates(date(2025, 1, 1), date(2027, 12, 31)))
        center = datetime(day.year, day.month, day.day, tzinfo=UTC)
    shift = draw(
        st.one_of(
            st.integers(-3 * 1440, 3 * 1440).map(lambda m: timedelta(minutes=m)),
            st.integers(-3 * 86_400, 3 * 86_400).map(lambda s: timedelta(seconds=s)),
            st.integers(-180, 180).map(lambda m: timedelta(minutes=m)),  # right around the change
        )
    )
    return center + shift


# ----------------------------------------------------------------------------- properties


def can_fire(model: CronModel) -> bool:
    """Whether the cron fires at all: some month has one of its days of the month, or its days
    of the week are restricted too (then either matches). One that never fires is refused,
    and tested elsewhere."""
    feasible = any(
        day <= (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
        for month in model.month.values()
        for day in model.dom.values()
    )
    return feasible or bool(model.dow.items)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), model=crons, zone_name=st.sampled_from(ZONES))
def test_next_fire_times_matches_brute_force(data: st.DataObject, model: CronModel, zone_name: str) -> None:
    text = model.text()
    # Refuse-never-fires is tested elsewhere; such crons have nothing to compare.
    assume(can_fire(model))
    after = data.draw(instants_near_transitions(zone_name), label="after")
    got = next_fire_times({"cron": text, "timezone": zone_name}, after=after, count=3)
    assert len(got) == 3
    assert all(t.tzinfo is UTC and t.microsecond % 1000 == 0 for t in got)
    assert all(a < b for a, b in pairwise(got))
    assert got[0] > after
    expected = reference_fire_times(model, zone_name, after, 3)
    assert [t for t in got if t <= after + HORIZON] == expected, text


@st.composite
def dst_day_cases(draw: st.DrawFn) -> tuple[CronModel, str, datetime]:
    """Crons whose hours sit on the wall-clock hours a transition touches, started just before it."""
    zone_name = draw(st.sampled_from(ZONES[:3]))
    center = draw(st.sampled_from(transitions(zone_name)))
    after = center + timedelta(minutes=draw(st.integers(-30 * 60, 90)))
    after += timedelta(seconds=draw(st.sampled_from((0, 0, 1, 59))))
    minute = draw(field_model(0, 59, star_weight=1, hot=(0, 15, 29, 30, 31, 45, 59)))
    hour = draw(field_model(0, 23, star_weight=1, hot=(0, 1, 2, 3)))
    star = FieldModel(1, 31, ())
    model = CronModel(minute, hour, star, FieldModel(1, 12, (), MONTHS, 1), FieldModel(0, 6, (), DAYS))
    return model, zone_name, after


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=dst_day_cases())
def test_transition_days_match_brute_force(case: tuple[CronModel, str, datetime]) -> None:
    model, zone_name, after = case
    got = next_fire_times({"cron": model.text(), "timezone": zone_name}, after=after, count=3)
    expected = reference_fire_times(model, zone_name, after, 3)
    assert [t for t in got if t <= after + HORIZON] == expected, model.text()


@settings(max_examples=200, deadline=None)
@given(model=crons)
def test_parser_sets_agree_with_model_and_croniter(model: CronModel) -> None:
    text = model.text()
    assume(can_fire(model))
    spec = parse_cron(text)
    assert set(spec.minutes) == model.minute.values()
    assert set(spec.hours) == model.hour.values()
    assert spec.days == model.dom.values()
    assert spec.months == model.month.values()
    assert spec.weekdays == {0 if d == 7 else d for d in model.dow.values()}
    assert spec.hour_star == (not model.hour.items)

    expanded, _ = croniter.expand(model.text(for_croniter=True))
    ours = (spec.minutes, spec.hours, spec.days, spec.months, spec.weekdays)
    full = (range(0, 60), range(0, 24), range(1, 32), range(1, 13), range(0, 7))
    for index, (column, values, whole) in enumerate(zip(expanded, ours, full, strict=True)):
        theirs = set(whole) if column == ["*"] else set(column)
        if index == 4:  # day of week: 7 is Sunday
            theirs = {0 if v == 7 else v for v in theirs}
        assert theirs == set(values), text


@settings(max_examples=200, deadline=None)
@given(
    every=st.integers(1, 366 * 86_400),
    anchor_ms=st.integers(0, 2_000_000_000_000),
    after_ms=st.integers(0, 2_000_000_000_000),
    count=st.integers(1, 5),
)
def test_every_slots_are_anchor_multiples(every: int, anchor_ms: int, after_ms: int, count: int) -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    anchor = epoch + timedelta(milliseconds=anchor_ms)
    after = epoch + timedelta(milliseconds=after_ms)
    got = next_fire_times({"every": every}, after=after, count=count, anchor=anchor)
    assert len(got) == count
    step = timedelta(seconds=every)
    for slot in got:
        assert slot > after
        assert slot >= anchor
        assert (slot - anchor) % step == timedelta(0)
    assert all(b - a == step for a, b in pairwise(got))
    assert got[0] == anchor or got[0] - step <= after


# ----------------------------------------------------------------------------- backwards


def forward_slots(trigger: dict, first: datetime, before: datetime, anchor: datetime | None = None) -> list:
    """Every slot in [first, before), by stepping ``next_fire_times`` forward."""
    found: list[datetime] = []
    after = first - timedelta(milliseconds=1)
    while True:
        batch = [t for t in next_fire_times(trigger, after=after, count=1000, anchor=anchor) if t < before]
        found += batch
        if len(batch) < 1000:
            return found
        after = batch[-1]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), model=crons, zone_name=st.sampled_from(ZONES))
def test_previous_and_count_agree_with_next(data: st.DataObject, model: CronModel, zone_name: str) -> None:
    """Walking back (misfire planning) finds the same slots, daylight saving included."""
    assume(can_fire(model))
    trigger = {"cron": model.text(), "timezone": zone_name}
    before = data.draw(instants_near_transitions(zone_name), label="before")
    first = before - data.draw(st.integers(1, 3 * 86_400).map(lambda s: timedelta(seconds=s)), label="span")
    count = data.draw(st.integers(1, 4), label="count")
    expected = forward_slots(trigger, first, before)
    got = previous_fire_times(trigger, before=before, count=count, not_before=first)
    assert got == expected[-count:], trigger
    last = before - timedelta(milliseconds=1)
    assert count_fire_times(trigger, first=first, last=last) == len(expected), trigger


@settings(max_examples=200, deadline=None)
@given(
    every=st.sampled_from((1, 7, 60, 3600, 86_400)),
    anchor_ms=st.integers(0, 2_000_000_000_000),
    before_ms=st.integers(1, 2_000_000_000_000),
    span_ms=st.integers(1, 20_000_000),
    count=st.integers(1, 5),
)
def test_every_previous_and_count_agree_with_next(
    every: int, anchor_ms: int, before_ms: int, span_ms: int, count: int
) -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    anchor = epoch + timedelta(milliseconds=anchor_ms)
    before = epoch + timedelta(milliseconds=before_ms + span_ms)
    first = before - timedelta(milliseconds=span_ms)
    trigger = {"every": every}
    expected = forward_slots(trigger, first, before, anchor)
    got = previous_fire_times(trigger, before=before, count=count, not_before=first, anchor=anchor)
    assert got == expected[-count:]
    assert count_fire_times(
        trigger, first=first, last=before - timedelta(milliseconds=1), anchor=anchor
    ) == len(expected)
