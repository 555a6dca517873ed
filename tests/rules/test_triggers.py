"""Tests for ``django_durable_scheduler.rules.triggers`` (pure Python, no database)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from django_durable_scheduler.exceptions import InvalidArgument, SchedulerError
from django_durable_scheduler.rules.triggers import (
    DEFAULT_CATCHUP_WINDOW,
    MAX_CATCHUP_SLOTS,
    MISFIRE_POLICIES,
    OVERLAP_POLICIES,
    validate_trigger,
)
from django_durable_scheduler.rules.triggers.cron import parse_cron
from django_durable_scheduler.rules.triggers.descriptions import describe_trigger
from django_durable_scheduler.rules.triggers.fire_times import (
    next_fire_time,
    next_fire_times,
    slot_trigger_key,
)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fires(trigger: dict[str, Any], after: datetime, count: int = 3, **kwargs: Any) -> list[datetime]:
    return next_fire_times(trigger, after=after, count=count, **kwargs)


def cron_in(expression: str, zone: str) -> dict[str, Any]:
    return {"cron": expression, "timezone": zone}


def refused(trigger: Any, field: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        validate_trigger(trigger)
    exc = info.value
    assert exc.field == field
    assert exc.details["field"] == field
    assert exc.code == "SCHEDULER_INVALID_ARGUMENT"
    assert str(exc).startswith(field + ": ")
    return exc


# ----------------------------------------------------------------------------- constants


def test_constants() -> None:
    assert MISFIRE_POLICIES == ("skip", "run_latest", "run_all")
    assert OVERLAP_POLICIES == ("allow", "skip")
    assert DEFAULT_CATCHUP_WINDOW == 3600
    assert MAX_CATCHUP_SLOTS == 100


# ----------------------------------------------------------------------------- validation: shape


@pytest.mark.parametrize("value", [None, [], "0 9 * * *", 5, ("cron",)])
def test_non_dict_refused(value: Any) -> None:
    exc = refused(value, "trigger")
    assert isinstance(exc, SchedulerError) and isinstance(exc, ValueError)


def test_custom_field_prefix() -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_trigger({"cron": "61 * * * *"}, field="changes.trigger")
    assert info.value.field == "changes.trigger.cron"


def test_non_string_key_refused() -> None:
    refused({1: "x"}, "trigger")


def test_unknown_key_refused() -> None:
    exc = refused({"cron": "* * * * *", "unknown_key": 1}, "trigger.unknown_key")
    assert "not a trigger key" in str(exc)
    refused({"unknown_key": 1}, "trigger.unknown_key")
    refused({"every": 60, "seconds": 1}, "trigger.seconds")


def test_two_schedules_refused() -> None:
    refused({"cron": "* * * * *", "every": 60}, "trigger.every")
    refused({"every": 60, "at": "2026-12-01T09:00:00Z"}, "trigger.at")


@pytest.mark.parametrize(
    "key", ["misfire", "catchup_window", "overlap", "start_at", "end_at", "timezone", "anchor"]
)
def test_options_without_schedule_refused(key: str) -> None:
    refused({key: "x"}, f"trigger.{key}")


def test_timezone_only_with_cron_and_anchor_only_with_every() -> None:
    refused({"every": 60, "timezone": "UTC"}, "trigger.timezone")
    refused({"at": "2026-12-01T09:00:00Z", "timezone": "UTC"}, "trigger.timezone")
    refused({"cron": "* * * * *", "anchor": "2026-01-01T00:00:00Z"}, "trigger.anchor")
    refused({"at": "2026-12-01T09:00:00Z", "anchor": "2026-01-01T00:00:00Z"}, "trigger.anchor")


# ----------------------------------------------------------------------------- validation: cron


@pytest.mark.parametrize(
    ("expression", "needle"),
    [
        (5, "string"),
        (None, "string"),
        ("", "empty"),
        ("   \t ", "empty"),
        ("* * * *", "5 fields"),
        ("0 * * * * *", "seconds"),  # 6 fields
        ("0 0 * * * * 2026", "seconds"),  # 7 fields
        ("61 * * * *", "61"),
        ("60 * * * *", "60"),
        ("* 24 * * *", "24"),
        ("0 0 0 * *", "day of month"),
        ("0 0 32 * *", "day of month"),
        ("0 0 * 0 *", "month"),
        ("0 0 * 13 *", "month"),
        ("0 0 * * 8", "day of week"),
        ("*/0 * * * *", "step"),
        ("0 */0 * * *", "step"),
        ("*/61 * * * *", "step"),
        ("0-59/0 * * * *", "step"),
        ("foo bar baz qux quux", "foo"),
        ("a b c d e", "not a number"),
        ("0 0 * FOO *", "FOO"),
        ("0 0 * * FUNDAY", "FUNDAY"),
        ("0 0 JAN * *", "not a number"),  # names only in month / day-of-week
        ("5-1 * * * *", "backwards"),
        ("0 0 * * FRI-MON", "backwards"),
        ("5/15 * * * *", "step needs"),
        ("1,,2 * * * *", "not valid"),
        (",1 * * * *", "not valid"),
        ("-1 * * * *", "not valid"),
        ("1- * * * *", "not valid"),
        ("0 0 L * *", "not a number"),
        ("0 0 15W * *", "not"),
        ("0 0 * * 1#2", "#"),
        ("0 0 ? * *", "?"),
        ("H * * * *", "not a number"),
        ("0 0 30 2 *", "never fire"),
        ("0 0 31 4,6,9,11 *", "never fire"),
        ("@reboot", "@reboot"),
        ("@every 5m", "macro"),
        ("@fortnightly", "macro"),
        ("* " * 600, "1024"),
    ],
)
def test_bad_cron_refused(expression: Any, needle: str) -> None:
    exc = refused({"cron": expression}, "trigger.cron")
    assert needle in str(exc)


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * *",
        "0 9 * * 1-5",
        "*/15 0-6,22-23 1,15 JAN-MAR,dec mon-fri",
        "0 0 * * 7",
        "0 0 * * 0-7",
        "0-30/10 */2 1-31/2 */3 */2",
        "00 09 01 01 *",
        "0 0 29 2 *",  # leap days only
        "0 0 31 2 5",  # Feb 31 never, but Fridays in February do
    ],
)
def test_good_cron_accepted(expression: str) -> None:
    assert validate_trigger({"cron": expression})["cron"] == expression


@pytest.mark.parametrize(
    "zone",
    [
        "Mars/Olympus",
        "Europe",
        "europe/berlin",
        "Europe/Berlin ",
        "",
        "../etc/passwd",
        "/etc/localtime",
        "localtime",
    ],
)
def test_unknown_time_zone_refused(zone: str) -> None:
    refused({"cron": "0 9 * * *", "timezone": zone}, "trigger.timezone")


def test_non_string_time_zone_refused() -> None:
    refused({"cron": "0 9 * * *", "timezone": 1}, "trigger.timezone")
    refused({"cron": "0 9 * * *", "timezone": None}, "trigger.timezone")


# ------------------------------------------------------------------ validation: every / at / options


@pytest.mark.parametrize("every", [-1, 0, 1.5, 300.0, True, False, "300", None, 366 * 86_400 + 1, 10**30])
def test_bad_every_refused(every: Any) -> None:
    refused({"every": every}, "trigger.every")


@pytest.mark.parametrize("key", ["at", "start_at", "end_at"])
@pytest.mark.parametrize(
    "value",
    [
        "2026-12-01T09:00:00",  # naive
        "2026-12-01",  # a date, naive
        "tomorrow",
        "",
        1_700_000_000,
        1_700_000_000_000,
        datetime(2026, 12, 1, 9, tzinfo=UTC),  # not a string: triggers are JSON
        None,
        "1969-12-31T23:59:59Z",
    ],
)
def test_bad_datetimes_refused(key: str, value: Any) -> None:
    trigger: dict[str, Any] = {"at": "2026-12-01T09:00:00Z"} if key != "at" else {}
    trigger[key] = value
    refused(trigger, f"trigger.{key}")


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00", 0, "soon"])
def test_bad_anchor_refused(value: Any) -> None:
    refused({"every": 60, "anchor": value}, "trigger.anchor")


def test_naive_message_names_the_problem() -> None:
    exc = refused({"at": "2026-12-01T09:00:00"}, "trigger.at")
    assert "UTC offset" in str(exc)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("misfire", "never"),
        ("misfire", None),
        ("misfire", "SKIP"),
        ("overlap", "forbid"),
        ("overlap", 1),
        ("catchup_window", -1),
        ("catchup_window", 31 * 86_400 + 1),
        ("catchup_window", 1.5),
        ("catchup_window", True),
        ("catchup_window", "60"),
    ],
)
def test_bad_options_refused(key: str, value: Any) -> None:
    refused({"every": 60, key: value}, f"trigger.{key}")


def test_end_at_must_follow_start_at() -> None:
    same = "2026-12-01T09:00:00Z"
    refused({"every": 60, "start_at": same, "end_at": same}, "trigger.end_at")
    refused({"every": 60, "start_at": same, "end_at": "2026-12-01T08:59:59.999Z"}, "trigger.end_at")
    # same instant, written in another offset
    refused({"every": 60, "start_at": same, "end_at": "2026-12-01T10:00:00+01:00"}, "trigger.end_at")


# ----------------------------------------------------------------------------- normalization


def test_empty_trigger_is_no_schedule() -> None:
    assert validate_trigger({}) == {}


def test_defaults_filled_for_cron() -> None:
    assert validate_trigger({"cron": " 0  9 * *\t1-5 "}) == {
        "cron": "0 9 * * 1-5",
        "timezone": "UTC",
        "misfire": "run_latest",
        "catchup_window": 3600,
        "overlap": "allow",
    }


def test_everything_normalized() -> None:
    trigger = {
        "every": 300,
        "anchor": "2026-01-01T01:00:00.123456+01:00",
        "misfire": "run_all",
        "catchup_window": 0,
        "overlap": "skip",
        "start_at": "2026-01-01 09:00Z",
        "end_at": "2026-12-31T23:59:59-05:00",
    }
    original = copy.deepcopy(trigger)
    assert validate_trigger(trigger) == {
        "every": 300,
        "anchor": "2026-01-01T00:00:00.123Z",
        "misfire": "run_all",
        "catchup_window": 0,
        "overlap": "skip",
        "start_at": "2026-01-01T09:00:00.000Z",
        "end_at": "2027-01-01T04:59:59.000Z",
    }
    assert trigger == original  # the input is not modified


def test_at_normalized_and_result_is_a_new_dict() -> None:
    trigger = {"at": "2026-12-01T10:00:00+01:00"}
    result = validate_trigger(trigger)
    assert result == {
        "at": "2026-12-01T09:00:00.000Z",
        "misfire": "run_latest",
        "catchup_window": 3600,
        "overlap": "allow",
    }
    assert result is not trigger


@pytest.mark.parametrize(
    ("macro", "expression"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        (" @Daily ", "0 0 * * *"),
    ],
)
def test_macros_are_translated(macro: str, expression: str) -> None:
    assert validate_trigger({"cron": macro})["cron"] == expression


@pytest.mark.parametrize(
    "trigger",
    [
        {},
        {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin", "misfire": "skip"},
        {"cron": "@hourly"},
        {"every": 60, "anchor": "2026-01-01T00:00:00.5+00:00", "start_at": "2026-01-02T00:00:00Z"},
        {"at": "2026-12-01T09:00:00+05:30", "end_at": "2027-01-01T00:00:00Z"},
    ],
)
def test_validation_is_idempotent(trigger: dict[str, Any]) -> None:
    once = validate_trigger(trigger)
    assert validate_trigger(once) == once


def test_parse_cron_sets() -> None:
    spec = parse_cron("0-30/10 2,*/12 13 JAN-MAR,Dec SUN,7,MON-WED")
    assert spec.minutes == (0, 10, 20, 30)
    assert spec.hours == (0, 2, 12)
    assert spec.days == {13}
    assert spec.months == {1, 2, 3, 12}
    assert spec.weekdays == {0, 1, 2, 3}
    assert not spec.hour_star and not spec.dom_star and not spec.dow_star
    assert parse_cron("* * * * *").hour_star
    assert not parse_cron("* */1 * * *").hour_star


# ----------------------------------------------------------------------------- next_fire_times: arguments


def test_after_must_be_aware() -> None:
    with pytest.raises(InvalidArgument) as info:
        next_fire_times({"every": 60}, after=datetime(2026, 1, 1))
    assert info.value.field == "after"
    assert "after" in str(info.value)


def test_after_accepts_other_offsets_and_epoch_ms() -> None:
    berlin = datetime(2026, 1, 1, 1, 0, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert next_fire_times({"every": 60}, after=berlin) == [utc(2026, 1, 1, 0, 1)]
    assert next_fire_times({"every": 60}, after=60_000) == [utc(1970, 1, 1, 0, 2)]


@pytest.mark.parametrize("count", [0, -1, 1001, 1.0, True, "3", None])
def test_bad_count_refused(count: Any) -> None:
    with pytest.raises(InvalidArgument) as info:
        next_fire_times({"every": 60}, after=utc(2026, 1, 1), count=count)
    assert info.value.field == "count"


def test_bad_anchor_argument_refused() -> None:
    with pytest.raises(InvalidArgument) as info:
        next_fire_times({"every": 60}, after=utc(2026, 1, 1), anchor=datetime(2026, 1, 1))
    assert info.value.field == "anchor"


def test_next_fire_times_validates_the_trigger() -> None:
    with pytest.raises(InvalidArgument) as info:
        next_fire_times({"cron": "*/0 * * * *"}, after=utc(2026, 1, 1))
    assert info.value.field == "trigger.cron"
    with pytest.raises(InvalidArgument) as info:
        next_fire_times({"cron": "0 9 * * *", "timezone": "Nowhere/City"}, after=utc(2026, 1, 1))
    assert info.value.field == "trigger.timezone"
    with pytest.raises(InvalidArgument) as info:
        next_fire_time("daily", after=utc(2026, 1, 1))
    assert info.value.field == "trigger"


def test_no_schedule_never_fires() -> None:
    assert next_fire_times({}, after=utc(2026, 1, 1), count=5) == []
    assert next_fire_time({}, after=utc(2026, 1, 1)) is None


def test_max_count() -> None:
    got = next_fire_times(
        {"cron": "* * * * *", "timezone": "Europe/Berlin"}, after=utc(2026, 3, 28, 12), count=1000
    )
    assert len(got) == 1000
    assert got == sorted(set(got))


# ----------------------------------------------------------------------------- at


def test_at_fires_once_strictly_after() -> None:
    trigger = {"at": "2026-12-01T10:00:00+01:00"}
    at = utc(2026, 12, 1, 9)
    assert fires(trigger, utc(2026, 11, 1)) == [at]
    assert next_fire_time(trigger, after=at - timedelta(milliseconds=1)) == at
    assert fires(trigger, at) == []
    assert fires(trigger, utc(2027, 1, 1)) == []


def test_at_respects_start_and_end() -> None:
    assert fires({"at": "2026-12-01T09:00:00Z", "start_at": "2026-12-01T09:00:01Z"}, utc(2026, 1, 1)) == []
    assert fires({"at": "2026-12-01T09:00:00Z", "end_at": "2026-12-01T08:00:00Z"}, utc(2026, 1, 1)) == []
    assert fires({"at": "2026-12-01T09:00:00Z", "start_at": "2026-12-01T09:00:00Z"}, utc(2026, 1, 1)) == [
        utc(2026, 12, 1, 9)
    ]
    assert fires({"at": "2026-12-01T09:00:00Z", "end_at": "2026-12-01T09:00:00Z"}, utc(2026, 1, 1)) == [
        utc(2026, 12, 1, 9)
    ]


# ----------------------------------------------------------------------------- every


def test_every_defaults_to_the_epoch_anchor() -> None:
    assert fires({"every": 300}, utc(2026, 3, 2, 10, 2, 30)) == [
        utc(2026, 3, 2, 10, 5),
        utc(2026, 3, 2, 10, 10),
        utc(2026, 3, 2, 10, 15),
    ]
    assert fires({"every": 300}, utc(2026, 3, 2, 10, 5), count=1) == [
        utc(2026, 3, 2, 10, 10)
    ]  # strictly after


def test_every_anchor_argument() -> None:
    anchor = datetime(2026, 3, 2, 10, 1, 7, 250_999, tzinfo=UTC)  # truncated to ms
    got = fires({"every": 60}, utc(2026, 3, 2, 12), count=2, anchor=anchor)
    assert got == [
        datetime(2026, 3, 2, 12, 0, 7, 250_000, tzinfo=UTC),
        datetime(2026, 3, 2, 12, 1, 7, 250_000, tzinfo=UTC),
    ]


def test_every_trigger_anchor_wins_over_argument() -> None:
    trigger = {"every": 3600, "anchor": "2026-03-02T10:30:00+00:00"}
    got = fires(trigger, utc(2026, 3, 2, 12), count=2, anchor=utc(2026, 1, 1, 0, 7))
    assert got == [utc(2026, 3, 2, 12, 30), utc(2026, 3, 2, 13, 30)]


def test_every_future_anchor_first_fires_at_the_anchor() -> None:
    trigger = {"every": 86_400, "anchor": "2026-06-01T09:00:00Z"}
    assert fires(trigger, utc(2026, 1, 1), count=2) == [utc(2026, 6, 1, 9), utc(2026, 6, 2, 9)]
    assert fires(trigger, utc(2026, 6, 1, 9), count=1) == [utc(2026, 6, 2, 9)]


def test_every_respects_start_and_end() -> None:
    trigger = {"every": 600, "start_at": "2026-03-02T10:05:00Z", "end_at": "2026-03-02T10:40:00Z"}
    assert fires(trigger, utc(2026, 3, 1), count=10) == [
        utc(2026, 3, 2, 10, 10),
        utc(2026, 3, 2, 10, 20),
        utc(2026, 3, 2, 10, 30),
        utc(2026, 3, 2, 10, 40),
    ]
    on_start = {"every": 600, "start_at": "2026-03-02T10:10:00Z"}
    assert fires(on_start, utc(2026, 3, 1), count=1) == [utc(2026, 3, 2, 10, 10)]
    assert fires(trigger, utc(2026, 3, 2, 10, 40)) == []


def test_every_is_not_affected_by_dst() -> None:
    got = fires({"every": 3600}, utc(2026, 3, 29, 0, 30), count=3)
    assert got == [utc(2026, 3, 29, 1), utc(2026, 3, 29, 2), utc(2026, 3, 29, 3)]


# ----------------------------------------------------------------------------- cron basics


def test_cron_utc_basics() -> None:
    assert fires({"cron": "0 9 * * 1-5"}, utc(2026, 3, 6, 9)) == [
        utc(2026, 3, 9, 9),
        utc(2026, 3, 10, 9),
        utc(2026, 3, 11, 9),
    ]
    assert fires({"cron": "*/20 * * * *"}, utc(2026, 1, 1, 0, 0, 0)) == [
        utc(2026, 1, 1, 0, 20),
        utc(2026, 1, 1, 0, 40),
        utc(2026, 1, 1, 1, 0),
    ]


def test_cron_strictly_after_and_millisecond_after() -> None:
    assert next_fire_time({"cron": "0 9 * * *"}, after=utc(2026, 3, 6, 9)) == utc(2026, 3, 7, 9)
    just_before = utc(2026, 3, 6, 9) - timedelta(microseconds=1)
    assert next_fire_time({"cron": "0 9 * * *"}, after=just_before) == utc(2026, 3, 6, 9)


def test_cron_results_are_utc_and_millisecond_truncated() -> None:
    for slot in fires(
        cron_in("*/7 * * * *", "Asia/Kolkata"), datetime(2026, 5, 5, 5, 5, 5, 555_555, tzinfo=UTC)
    ):
        assert slot.tzinfo is UTC
        assert slot.microsecond == 0 and slot.second == 0


def test_cron_respects_start_and_end() -> None:
    trigger = {"cron": "0 * * * *", "start_at": "2026-03-02T10:00:00Z", "end_at": "2026-03-02T12:00:00Z"}
    assert fires(trigger, utc(2026, 3, 1), count=10) == [
        utc(2026, 3, 2, 10),
        utc(2026, 3, 2, 11),
        utc(2026, 3, 2, 12),
    ]
    assert fires(trigger, utc(2026, 3, 2, 12)) == []


def test_cron_leap_day_only() -> None:
    assert fires({"cron": "0 0 29 2 *"}, utc(2026, 1, 1), count=2) == [utc(2028, 2, 29), utc(2032, 2, 29)]


def test_cron_runs_out_at_year_9999() -> None:
    assert fires({"cron": "0 0 1 1 *"}, utc(9998, 6, 1), count=5) == [utc(9999, 1, 1)]


def test_cron_sunday_is_0_and_7_and_names_work() -> None:
    sundays = [utc(2026, 3, 8), utc(2026, 3, 15)]
    assert fires({"cron": "0 0 * * 0"}, utc(2026, 3, 2), count=2) == sundays
    assert fires({"cron": "0 0 * * 7"}, utc(2026, 3, 2), count=2) == sundays
    assert fires({"cron": "0 0 * * sun"}, utc(2026, 3, 2), count=2) == sundays
    assert fires({"cron": "0 0 1 jun,JAN *"}, utc(2026, 3, 2), count=2) == [utc(2026, 6, 1), utc(2027, 1, 1)]


# ----------------------------------------------------------------------------- day of month / day of week


def test_dom_dow_both_restricted_either_matches() -> None:
    # March 2026: Fridays are 6, 13, 20, 27; the 13th is itself a Friday.
    got = fires({"cron": "0 9 13 * 5"}, utc(2026, 3, 1), count=6)
    assert got == [
        utc(2026, 3, 6, 9),
        utc(2026, 3, 13, 9),
        utc(2026, 3, 20, 9),
        utc(2026, 3, 27, 9),
        utc(2026, 4, 3, 9),
        utc(2026, 4, 10, 9),
    ]
    got = fires({"cron": "0 9 13 * 5"}, utc(2026, 4, 10, 9), count=2)
    assert got == [utc(2026, 4, 13, 9), utc(2026, 4, 17, 9)]  # Monday the 13th, then Friday


def test_dom_star_only_dow_applies() -> None:
    assert fires({"cron": "0 9 * * 5"}, utc(2026, 4, 10, 9), count=2) == [
        utc(2026, 4, 17, 9),
        utc(2026, 4, 24, 9),
    ]


def test_dow_star_only_dom_applies() -> None:
    assert fires({"cron": "0 9 13 * *"}, utc(2026, 3, 1), count=2) == [
        utc(2026, 3, 13, 9),
        utc(2026, 4, 13, 9),
    ]


def test_full_range_day_field_is_restricted() -> None:
    # "1-31" is not the literal "*": both day fields restricted -> OR -> every day.
    assert fires({"cron": "0 9 1-31 * 5"}, utc(2026, 3, 2), count=3) == [
        utc(2026, 3, 2, 9),
        utc(2026, 3, 3, 9),
        utc(2026, 3, 4, 9),
    ]
    # "*/2" likewise: odd days or Mondays.
    assert fires({"cron": "0 9 */2 * 1"}, utc(2026, 3, 1, 10), count=4) == [
        utc(2026, 3, 2, 9),
        utc(2026, 3, 3, 9),
        utc(2026, 3, 5, 9),
        utc(2026, 3, 7, 9),
    ]


def test_month_restricts_both_day_fields() -> None:
    # February only: the 13th or Fridays of February.
    got = fires({"cron": "0 9 13 2 5"}, utc(2026, 3, 1), count=3)
    assert got == [utc(2027, 2, 5, 9), utc(2027, 2, 12, 9), utc(2027, 2, 13, 9)]


# ----------------------------------------------------------------------------- DST: Europe/Berlin


def test_berlin_spring_real_time_skips_the_gap() -> None:
    # 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z); 02:30 does not exist.
    got = fires(cron_in("30 * * * *", "Europe/Berlin"), utc(2026, 3, 28, 23, 50))
    assert got == [
        utc(2026, 3, 29, 0, 30),
        utc(2026, 3, 29, 1, 30),
        utc(2026, 3, 29, 2, 30),
    ]  # 01:30 CET, 03:30, 04:30 CEST


def test_berlin_spring_specific_hour_fires_after_the_gap() -> None:
    got = fires(cron_in("30 2 * * *", "Europe/Berlin"), utc(2026, 3, 28, 12), count=2)
    assert got == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]  # 03:00 CEST, then 02:30 CEST
    assert next_fire_time(cron_in("30 2 * * *", "Europe/Berlin"), after=utc(2026, 3, 29, 1)) == utc(
        2026, 3, 30, 0, 30
    )


def test_berlin_spring_several_gap_slots_fire_once() -> None:
    got = fires(cron_in("0,30 2 * * *", "Europe/Berlin"), utc(2026, 3, 28, 12))
    assert got == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0), utc(2026, 3, 30, 0, 30)]
    got = fires(cron_in("* 2 * * *", "Europe/Berlin"), utc(2026, 3, 28, 12))
    assert got == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0), utc(2026, 3, 30, 0, 1)]


def test_berlin_spring_gap_slot_then_the_next_hour() -> None:
    got = fires(cron_in("30 2,3 * * *", "Europe/Berlin"), utc(2026, 3, 28, 12))
    assert got == [utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30), utc(2026, 3, 30, 0, 30)]


def test_berlin_fall_real_time_fires_in_both_instances() -> None:
    # 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z); 02:00-02:59 happens twice.
    got = fires(cron_in("30 * * * *", "Europe/Berlin"), utc(2026, 10, 24, 23, 50), count=4)
    assert got == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 1, 30),
        utc(2026, 10, 25, 2, 30),
        utc(2026, 10, 25, 3, 30),
    ]
    # After the first 02:50 (CEST), the next :10 is 02:10 CET.
    assert next_fire_time(cron_in("10 * * * *", "Europe/Berlin"), after=utc(2026, 10, 25, 0, 50)) == utc(
        2026, 10, 25, 1, 10
    )


def test_berlin_fall_specific_hour_fires_first_instance_only() -> None:
    got = fires(cron_in("30 2 * * *", "Europe/Berlin"), utc(2026, 10, 24, 12), count=2)
    assert got == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    got = fires(cron_in("0 1-3 * * *", "Europe/Berlin"), utc(2026, 10, 24, 12), count=4)
    assert got == [utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 2), utc(2026, 10, 26, 0)]


# ----------------------------------------------------------------------------- DST: America/New_York


def test_new_york_spring_real_time() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z)
    got = fires(cron_in("30 * * * *", "America/New_York"), utc(2026, 3, 8, 5, 50))
    assert got == [utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7, 30), utc(2026, 3, 8, 8, 30)]


def test_new_york_spring_specific_hour() -> None:
    got = fires(cron_in("30 2 * * *", "America/New_York"), utc(2026, 3, 7, 12), count=2)
    assert got == [utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)]


def test_new_york_fall_real_time() -> None:
    # 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z); 01:00-01:59 happens twice.
    got = fires(cron_in("30 * * * *", "America/New_York"), utc(2026, 11, 1, 4, 50))
    assert got == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 7, 30)]


def test_new_york_fall_specific_hour() -> None:
    got = fires(cron_in("30 1 * * *", "America/New_York"), utc(2026, 10, 31, 12), count=2)
    assert got == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]


# ------------------------------------------------------------------ DST: Australia/Lord_Howe (30 minutes)


def test_lord_howe_fall_real_time() -> None:
    # 2026-04-05 02:00 (+11) -> 01:30 (+10:30) at 15:00Z on 04-04; 01:30-01:59 happens twice.
    got = fires(cron_in("*/15 * * * *", "Australia/Lord_Howe"), utc(2026, 4, 4, 14), count=7)
    assert got == [
        utc(2026, 4, 4, 14, 15),  # 01:15 +11
        utc(2026, 4, 4, 14, 30),  # 01:30 +11
        utc(2026, 4, 4, 14, 45),  # 01:45 +11
        utc(2026, 4, 4, 15, 0),  # 01:30 +10:30
        utc(2026, 4, 4, 15, 15),  # 01:45 +10:30
        utc(2026, 4, 4, 15, 30),  # 02:00 +10:30
        utc(2026, 4, 4, 15, 45),
    ]


def test_lord_howe_fall_specific_hour() -> None:
    got = fires(cron_in("45 1 * * *", "Australia/Lord_Howe"), utc(2026, 4, 4), count=2)
    assert got == [utc(2026, 4, 4, 14, 45), utc(2026, 4, 5, 15, 15)]


def test_lord_howe_spring_real_time() -> None:
    # 2026-10-04 02:00 (+10:30) -> 02:30 (+11) at 15:30Z on 10-03; 02:00 and 02:15 do not exist.
    got = fires(cron_in("*/15 * * * *", "Australia/Lord_Howe"), utc(2026, 10, 3, 15))
    assert got == [
        utc(2026, 10, 3, 15, 15),
        utc(2026, 10, 3, 15, 30),
        utc(2026, 10, 3, 15, 45),
    ]  # 01:45, 02:30, 02:45


def test_lord_howe_spring_specific_hour() -> None:
    got = fires(cron_in("15 2 * * *", "Australia/Lord_Howe"), utc(2026, 10, 3), count=2)
    assert got == [utc(2026, 10, 3, 15, 30), utc(2026, 10, 4, 15, 15)]  # 02:30 +11, then 02:15 +11
    # 02:00 and 02:15 (in the gap) and 02:30 (right after it) are one instant: it fires once.
    got = fires(cron_in("0,15,30,45 2 * * *", "Australia/Lord_Howe"), utc(2026, 10, 3))
    assert got == [utc(2026, 10, 3, 15, 30), utc(2026, 10, 3, 15, 45), utc(2026, 10, 4, 15)]


# ----------------------------------------------------------------------------- Asia/Kolkata (+05:30, no DST)


def test_kolkata() -> None:
    assert fires(cron_in("0 9 * * *", "Asia/Kolkata"), utc(2026, 3, 28), count=2) == [
        utc(2026, 3, 28, 3, 30),
        utc(2026, 3, 29, 3, 30),
    ]
    # :30 local is :00 UTC
    assert fires(cron_in("30 * * * *", "Asia/Kolkata"), utc(2026, 3, 28, 0, 10), count=2) == [
        utc(2026, 3, 28, 1),
        utc(2026, 3, 28, 2),
    ]


# ----------------------------------------------------------------------------- choices at the edges


def test_hour_star_slash_one_is_restricted() -> None:
    """Only the literal ``*`` hour runs on real time; ``*/1`` fires each wall slot once."""
    spring = fires(cron_in("30 */1 * * *", "Europe/Berlin"), utc(2026, 3, 29, 0, 45), count=2)
    assert spring == [utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30)]  # 02:30 -> 03:00 CEST, then 03:30
    fall = fires(cron_in("30 */1 * * *", "Europe/Berlin"), utc(2026, 10, 25, 0, 15), count=2)
    assert fall == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2, 30)]  # 02:30 CEST once, then 03:30 CET
    real = fires(cron_in("30 * * * *", "Europe/Berlin"), utc(2026, 10, 25, 0, 15), count=2)
    assert real == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)]


def test_midnight_gap_and_fold_havana() -> None:
    # Cuba changes clocks at midnight: 2026-03-08 00:00 -> 01:00, 2026-11-01 01:00 -> 00:00.
    spring = fires(cron_in("0 0 * * *", "America/Havana"), utc(2026, 3, 7, 12), count=2)
    assert spring == [utc(2026, 3, 8, 5), utc(2026, 3, 9, 4)]
    fall = fires(cron_in("0 0 * * *", "America/Havana"), utc(2026, 10, 31, 12), count=2)
    assert fall == [utc(2026, 11, 1, 4), utc(2026, 11, 2, 5)]


def test_fixed_offset_zone_names() -> None:
    assert fires(cron_in("0 9 * * *", "Etc/GMT-3"), utc(2026, 1, 1), count=1) == [utc(2026, 1, 1, 6)]


# ----------------------------------------------------------------------------- croniter 7.0.0 divergences
#
# We do not use croniter's time zone handling. Each test below pins a case where croniter
# 7.0.0 breaks our daylight-saving rules; the croniter assertion accepts the wrong value it gives
# today or the right one, so a fixed croniter does not break the suite.


def croniter_next(expression: str, zone: str, after: datetime, count: int) -> list[datetime]:
    iterator = croniter(expression, after.astimezone(ZoneInfo(zone)))
    return [iterator.get_next(datetime).astimezone(UTC) for _ in range(count)]


def show_croniter(
    expression: str, zone: str, after: datetime, count: int, expected: list[datetime], wrong: list[datetime]
) -> None:
    assert fires(cron_in(expression, zone), after, count=count) == expected
    assert croniter_next(expression, zone, after, count) in (wrong, expected)


def test_croniter_bug_fold_specific_hour_fires_twice_berlin() -> None:
    show_croniter(
        "30 2 * * *",
        "Europe/Berlin",
        utc(2026, 10, 24, 12),
        2,
        expected=[utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
        wrong=[utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)],  # 02:30 CEST and 02:30 CET
    )


def test_croniter_bug_fold_specific_hour_range_berlin() -> None:
    show_croniter(
        "0 1-3 * * *",
        "Europe/Berlin",
        utc(2026, 10, 24, 22, 30),
        3,
        expected=[utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 2)],
        wrong=[utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 1)],  # 02:00 CET again
    )


def test_croniter_bug_fold_specific_hour_fires_twice_new_york() -> None:
    show_croniter(
        "30 1 * * *",
        "America/New_York",
        utc(2026, 10, 31, 12),
        2,
        expected=[utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)],
        wrong=[utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30)],
    )


def test_croniter_bug_fold_specific_hour_fires_twice_lord_howe() -> None:
    show_croniter(
        "45 1 * * *",
        "Australia/Lord_Howe",
        utc(2026, 4, 4),
        2,
        expected=[utc(2026, 4, 4, 14, 45), utc(2026, 4, 5, 15, 15)],
        wrong=[utc(2026, 4, 4, 14, 45), utc(2026, 4, 4, 15, 15)],  # 01:45 +11 and 01:45 +10:30
    )


def test_croniter_bug_fold_specific_hour_fires_twice_havana_midnight() -> None:
    show_croniter(
        "0 0 * * *",
        "America/Havana",
        utc(2026, 10, 31, 12),
        2,
        expected=[utc(2026, 11, 1, 4), utc(2026, 11, 2, 5)],
        wrong=[utc(2026, 11, 1, 4), utc(2026, 11, 1, 5)],
    )


def test_croniter_bug_started_between_instances_fires_the_second() -> None:
    # after = 02:40 CEST, between the two 02:30s: the slot already fired at 02:30 CEST.
    show_croniter(
        "30 2 * * *",
        "Europe/Berlin",
        utc(2026, 10, 25, 0, 40),
        1,
        expected=[utc(2026, 10, 26, 1, 30)],
        wrong=[utc(2026, 10, 25, 1, 30)],
    )
    # after = 02:01 CET: every 02:xx slot fired in the first instance already.
    show_croniter(
        "* 2 * * *",
        "Europe/Berlin",
        utc(2026, 10, 25, 1, 1),
        1,
        expected=[utc(2026, 10, 26, 1)],
        wrong=[utc(2026, 10, 25, 1, 2)],
    )


def test_croniter_bug_one_value_range_is_the_whole_field() -> None:
    # Not a DST bug, but one more reason not to iterate with croniter: it reads "1-1" as "*".
    assert croniter.expand("0 1-1 * * *")[0][1] in (["*"], [1])
    assert fires({"cron": "0 1-1 * * *"}, utc(2026, 3, 2), count=2) == [
        utc(2026, 3, 2, 1),
        utc(2026, 3, 3, 1),
    ]


# ------------------------------------------------------------------ describe_trigger / slot_trigger_key


@pytest.mark.parametrize(
    ("trigger", "text"),
    [
        ({}, "no schedule (enqueue only)"),
        ({"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}, "cron 0 9 * * 1-5 (Europe/Berlin)"),
        ({"cron": "@daily"}, "cron 0 0 * * * (UTC)"),
        ({"every": 300}, "every 5 minutes"),
        ({"every": 60}, "every minute"),
        ({"every": 90}, "every 90 seconds"),
        ({"every": 1}, "every second"),
        ({"every": 7200}, "every 2 hours"),
        ({"every": 86_400}, "every day"),
        ({"every": 7 * 86_400}, "every 7 days"),
        ({"every": 3600, "anchor": "2026-01-01T00:30:00Z"}, "every hour from 2026-01-01 00:30 UTC"),
        ({"at": "2026-12-01T09:00:00+00:00"}, "once at 2026-12-01 09:00 UTC"),
        ({"at": "2026-12-01T10:00:30.250+01:00"}, "once at 2026-12-01 09:00:30.250 UTC"),
        (
            {"every": 300, "start_at": "2026-01-01T00:00:00Z", "end_at": "2026-02-01T00:00:00Z"},
            "every 5 minutes, from 2026-01-01 00:00 UTC, until 2026-02-01 00:00 UTC",
        ),
    ],
)
def test_describe_trigger(trigger: dict[str, Any], text: str) -> None:
    assert describe_trigger(trigger) == text


def test_describe_trigger_validates() -> None:
    with pytest.raises(InvalidArgument) as info:
        describe_trigger({"every": 0})
    assert info.value.field == "trigger.every"


def test_slot_trigger_key() -> None:
    assert slot_trigger_key(utc(2026, 3, 29, 1)) == "schedule:2026-03-29T01:00:00.000Z"
    berlin = datetime(2026, 3, 29, 3, 0, 0, 123_456, tzinfo=ZoneInfo("Europe/Berlin"))
    assert slot_trigger_key(berlin) == "schedule:2026-03-29T01:00:00.123Z"
    assert slot_trigger_key(datetime(2026, 1, 1, 5, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))) == (
        "schedule:2026-01-01T00:00:00.000Z"
    )
    with pytest.raises(InvalidArgument) as info:
        slot_trigger_key(datetime(2026, 1, 1))
    assert info.value.field == "slot"


def test_slot_trigger_keys_of_fire_times_are_unique() -> None:
    got = fires(cron_in("* 2 * * *", "Europe/Berlin"), utc(2026, 3, 28, 12), count=100)
    keys = [slot_trigger_key(slot) for slot in got]
    assert len(set(keys)) == len(keys)
