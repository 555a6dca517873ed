"""The token bucket of a throttle, as pure arithmetic (docs/design.md, "Throttles"): the
interval and tolerance, ``limit + burst`` starts in any window of ``period``, even spacing
with no burst, places for waiting work, and what a clock jump back or forward does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from django_durable_scheduler.rules.throttles import (
    Throttle,
    allows,
    ceil_ms,
    fresh,
    next_free,
    normalize_throttle,
    place,
    placed,
    render_key,
    settled,
    take,
)

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
US = timedelta(microseconds=1)


def ms(n: float) -> timedelta:
    return timedelta(milliseconds=n)


def starts(throttle: Throttle, at: list[datetime], tat: datetime | None = None) -> list[datetime]:
    """The instants among ``at`` (ascending) at which the bucket lets a start through."""
    tat = fresh(at[0])[0] if tat is None else tat
    admitted = []
    for now in at:
        tat = settled(tat, now, throttle)
        if allows(tat, now, throttle):
            tat = take(tat, now, throttle)
            admitted.append(now)
    return admitted


def test_interval_and_tolerance():
    throttle = Throttle(limit=100, period_ms=5000, burst=20)
    assert throttle.interval == ms(50)
    assert throttle.tolerance == ms(1000)


def test_the_interval_rounds_up_so_rounding_never_lets_more_through():
    assert Throttle(limit=3, period_ms=1000).interval == timedelta(microseconds=333_334)
    assert Throttle(limit=1_000_000, period_ms=1).interval == US  # not zero


def test_a_fresh_bucket_lets_one_plus_burst_through_at_once():
    throttle = Throttle(limit=2, period_ms=1000, burst=3)
    assert starts(throttle, [T0] * 10) == [T0] * 4


@pytest.mark.parametrize(
    ("limit", "period_ms", "burst"), [(1, 1000, 0), (5, 1000, 0), (5, 1000, 2), (7, 3000, 4)]
)
def test_any_window_of_a_period_holds_at_most_limit_plus_burst(limit, period_ms, burst):
    throttle = Throttle(limit=limit, period_ms=period_ms, burst=burst)
    # A start asked for every millisecond over five periods.
    admitted = starts(throttle, [T0 + ms(n) for n in range(5 * period_ms)])
    period = ms(period_ms)
    most = max(sum(1 for t in admitted if s <= t < s + period) for s in admitted)
    assert most == limit + burst
    # After the burst is spent, one start per interval (to the millisecond they are asked at).
    tail = admitted[burst + 1 :]
    gaps = {b - a for a, b in pairwise(tail)}
    assert all(abs(gap - throttle.interval) < ms(1) for gap in gaps)
    assert tail[-1] - tail[0] >= throttle.interval * (len(tail) - 1)


def test_no_burst_spaces_the_starts_evenly():
    throttle = Throttle(limit=4, period_ms=1000)
    admitted = starts(throttle, [T0 + ms(n) for n in range(1001)])
    assert admitted == [T0 + ms(250 * n) for n in range(5)]


def test_a_quiet_spell_refills_the_bucket_to_one_plus_burst_and_no_more():
    throttle = Throttle(limit=1, period_ms=1000, burst=2)
    tat = take(T0, T0, throttle)
    later = T0 + timedelta(hours=1)
    assert starts(throttle, [later] * 10, tat=tat) == [later] * 3


def test_next_free_and_allows():
    throttle = Throttle(limit=1, period_ms=1000, burst=1)
    tat = T0 + timedelta(seconds=2)
    assert next_free(tat, throttle) == T0 + timedelta(seconds=1)
    assert not allows(tat, T0 + timedelta(seconds=1) - US, throttle)
    assert allows(tat, T0 + timedelta(seconds=1), throttle)
    assert take(tat, T0 + timedelta(seconds=1), throttle) == T0 + timedelta(seconds=3)
    assert take(T0, T0 + timedelta(seconds=5), throttle) == T0 + timedelta(seconds=6)  # from now


def test_places_for_waiting_work_follow_each_other_one_interval_apart():
    throttle = Throttle(limit=2, period_ms=1000)
    tat = take(T0, T0, throttle)  # one started now
    horizon = tat
    slots = []
    for _ in range(3):
        slot = place(horizon, T0, throttle)
        slots.append(slot)
        horizon = placed(horizon, slot, throttle)
    assert slots == [T0 + ms(500), T0 + ms(1000), T0 + ms(1500)]


def test_a_place_is_never_before_now_and_is_rounded_up_to_the_millisecond():
    throttle = Throttle(limit=3, period_ms=1000)
    assert place(T0 - timedelta(hours=1), T0, throttle) == T0
    horizon = T0 + throttle.interval  # 333.334 ms
    assert place(horizon, T0, throttle) == T0 + ms(334)
    assert ceil_ms(T0 + ms(1)) == T0 + ms(1)
    assert ceil_ms(T0 + US) == T0 + ms(1)


def test_a_clock_jump_back_lets_nothing_more_start():
    throttle = Throttle(limit=1, period_ms=1000, burst=2)
    tat = T0
    for _ in range(3):
        tat = take(tat, T0, throttle)  # the bucket is just emptied at T0
    back = T0 - timedelta(hours=1)
    again = settled(tat, back, throttle)
    # Taken as just emptied at the earlier instant: no start now, the next one an interval on.
    assert again == back + throttle.tolerance + throttle.interval
    assert not allows(again, back, throttle)
    assert next_free(again, throttle) == back + throttle.interval
    # A bucket that is not ahead of the ceiling is left as it is.
    assert settled(T0, T0 + timedelta(seconds=1), throttle) == T0


def test_a_clock_jump_forward_fills_the_bucket_once():
    throttle = Throttle(limit=1, period_ms=1000, burst=2)
    tat = take(T0, T0, throttle)
    ahead = T0 + timedelta(days=1)
    admitted = starts(throttle, [ahead] * 10 + [ahead + ms(999), ahead + ms(1000)], tat=tat)
    assert admitted == [ahead] * 3 + [ahead + ms(1000)]


def test_stored_round_trip():
    throttle = normalize_throttle({"limit": 100, "period": 5, "burst": 20, "key": "{account}"})
    assert throttle == Throttle(limit=100, period_ms=5000, burst=20, key="{account}")
    assert throttle is not None
    assert Throttle.from_stored(throttle.stored()) == throttle
    assert normalize_throttle(throttle.stored()) == throttle
    assert normalize_throttle(throttle) == throttle
    assert normalize_throttle({"limit": 1, "period": timedelta(minutes=1), "burst": None}) == Throttle(
        1, 60_000
    )
    assert normalize_throttle(None) is None


def test_render_key():
    assert render_key(None, {"a": 1}) is None
    assert render_key("acct-{a}", {"a": 1, "b": 2}) == "acct-1"
