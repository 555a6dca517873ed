"""Misfire after outages of any length, overlap against earlier and later work, past one-offs.

The clock is the settable test clock (``DURABLE_SCHEDULER_CLOCK``): an outage is the clock
jumping forward between two materialization passes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Event, Job, Occurrence
from django_durable_scheduler.rules.triggers import fire_times
from django_durable_scheduler.rules.triggers.fire_times import MAX_COUNTED_SLOTS
from django_durable_scheduler.rules.validation import iso_ms

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db

CREATED = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
BACK = datetime(2026, 1, 5, 12, 0, 0, 500_000, tzinfo=UTC)  # after a 2-hour outage
BACK_10Y = datetime(2036, 1, 5, 12, 0, 0, 500_000, tzinfo=UTC)  # after a 10-year outage
SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)


def t(hh_mm_ss: str, day: datetime = BACK) -> datetime:
    hour, minute, second = (int(part) for part in hh_mm_ss.split(":"))
    return day.replace(hour=hour, minute=minute, second=second, microsecond=0)


def fired(job_id: str) -> list[datetime]:
    return sorted(o.scheduled_for for o in Occurrence.objects.filter(job_id=job_id))


def skips(job_id: str) -> list[tuple[str, str, int | None, str]]:
    """(from, to, count, reason) of each slot_skipped event, oldest range first."""
    events = Event.objects.filter(job_id=job_id, event_type="slot_skipped")
    out = []
    for event in events:
        assert event.data["slot"] == event.data["from"]  # the key that predates ranges
        out.append((event.data["from"], event.data["to"], event.data["count"], event.data["reason"]))
    return sorted(out)


def slots_from(first: datetime, last: datetime, step: timedelta) -> list[datetime]:
    assert (last - first) % step == timedelta(0)
    return [first + step * n for n in range((last - first) // step + 1)]


def make(clock, job_id: str, **trigger) -> Job:
    clock.set(CREATED)
    return scheduler.create_job(job_id, "k", authority=AUTHORITY, trigger=trigger)


# ------------------------------------------------------------------- every second, 2 hours


def test_every_second_run_all_after_two_hours(clock):
    make(clock, "fast", every=1, misfire="run_all")
    clock.set(BACK)
    assert kernel.materialize_due() == 100
    assert fired("fast") == slots_from(t("11:58:21"), t("12:00:00"), SECOND)
    assert skips("fast") == [
        ("2026-01-05T10:00:01.000Z", "2026-01-05T11:00:00.000Z", 3600, "outside_catchup_window"),
        ("2026-01-05T11:00:01.000Z", "2026-01-05T11:58:20.000Z", 3500, "catchup_limit"),
    ]
    job = Job.objects.get()
    assert (job.next_fire_at, job.last_slot_at) == (t("12:00:01"), t("12:00:00"))
    clock.advance(1)  # running normally again: the next slot, and only it
    assert kernel.materialize_due() == 1
    assert fired("fast")[-1] == t("12:00:01")


@pytest.mark.parametrize("misfire", ["run_latest", "skip"])
def test_every_second_fires_the_on_time_slots_after_two_hours(clock, misfire):
    # The last 60 s of slots are on time (MISFIRE_GRACE) under every policy, the 12:00:00
    # slot among them; the rest of the window is coalesced or skipped.
    make(clock, "fast", every=1, misfire=misfire)
    clock.set(BACK)
    assert kernel.materialize_due() == 60
    assert fired("fast") == slots_from(t("11:59:01"), t("12:00:00"), SECOND)
    reason = {"run_latest": "misfire_coalesced", "skip": "misfire_skip"}[misfire]
    assert skips("fast") == [
        ("2026-01-05T10:00:01.000Z", "2026-01-05T11:00:00.000Z", 3600, "outside_catchup_window"),
        ("2026-01-05T11:00:01.000Z", "2026-01-05T11:59:00.000Z", 3540, reason),
    ]


def test_run_latest_fires_the_latest_missed_slot_when_none_is_on_time(clock):
    make(clock, "tens", every=600)
    clock.set(BACK + timedelta(minutes=5))  # the 12:00 slot is 5 minutes late: missed
    assert kernel.materialize_due() == 1
    assert fired("tens") == [t("12:00:00")]
    assert skips("tens") == [
        ("2026-01-05T10:10:00.000Z", "2026-01-05T11:00:00.000Z", 6, "outside_catchup_window"),
        ("2026-01-05T11:10:00.000Z", "2026-01-05T11:50:00.000Z", 5, "misfire_coalesced"),
    ]
    assert Job.objects.get().next_fire_at == t("12:10:00")


# ------------------------------------------------------------------ every second, 10 years


@pytest.mark.parametrize("misfire", ["run_all", "run_latest", "skip"])
def test_every_second_after_ten_years(clock, misfire):
    # 315 million missed slots: only arithmetic gets through them within the test's timeout.
    make(clock, "fast", every=1, misfire=misfire)
    clock.set(BACK_10Y)
    first_fired = {"run_all": "11:58:21", "run_latest": "11:59:01", "skip": "11:59:01"}[misfire]
    fired_slots = slots_from(t(first_fired, BACK_10Y), t("12:00:00", BACK_10Y), SECOND)
    assert kernel.materialize_due() == len(fired_slots)
    assert fired("fast") == fired_slots
    outside = int((t("11:00:00", BACK_10Y) - CREATED).total_seconds())
    reason = {"run_all": "catchup_limit", "run_latest": "misfire_coalesced", "skip": "misfire_skip"}[misfire]
    assert skips("fast") == [
        ("2026-01-05T10:00:01.000Z", "2036-01-05T11:00:00.000Z", outside, "outside_catchup_window"),
        ("2036-01-05T11:00:01.000Z", iso_ms(fired_slots[0] - SECOND), 3600 - len(fired_slots), reason),
    ]
    assert Job.objects.get().next_fire_at == t("12:00:01", BACK_10Y)


# -------------------------------------------------------------------- every-minute cron


@pytest.mark.parametrize("back", [BACK, BACK_10Y], ids=["2h", "10y"])
@pytest.mark.parametrize("misfire", ["run_all", "run_latest", "skip"])
def test_every_minute_cron_after_an_outage(clock, misfire, back):
    make(clock, "cron", cron="* * * * *", timezone="Europe/Berlin", misfire=misfire)
    clock.set(back)
    fired_slots = (
        slots_from(t("11:01:00", back), t("12:00:00", back), MINUTE)
        if misfire == "run_all"
        else [t("12:00:00", back)]
    )
    assert kernel.materialize_due() == len(fired_slots)
    assert fired("cron") == fired_slots  # the on-time 12:00 slot always among them
    # Slots older than the window are counted when there are few; ten years of minutes are
    # not walked (count None: more than MAX_COUNTED_SLOTS).
    outside_count = 60 if back == BACK else None
    expected = [
        ("2026-01-05T10:01:00.000Z", iso_ms(t("11:00:00", back)), outside_count, "outside_catchup_window")
    ]
    if misfire != "run_all":
        reason = {"run_latest": "misfire_coalesced", "skip": "misfire_skip"}[misfire]
        expected.append((iso_ms(t("11:01:00", back)), iso_ms(t("11:59:00", back)), 59, reason))
    assert skips("cron") == expected
    assert Job.objects.get().next_fire_at == t("12:01:00", back)


def test_ten_year_cron_outage_walks_a_bounded_number_of_slots(clock, monkeypatch):
    """A linear scan would walk five million wall-clock minutes; the plan walks a few thousand."""
    walked = 0

    def counting(walk):
        def wrapper(*args):
            nonlocal walked
            for wall in walk(*args):
                walked += 1
                yield wall

        return wrapper

    monkeypatch.setattr(fire_times, "_iter_walls", counting(fire_times._iter_walls))
    monkeypatch.setattr(fire_times, "_iter_walls_back", counting(fire_times._iter_walls_back))
    make(clock, "cron", cron="* * * * *", misfire="run_all")
    clock.set(BACK_10Y)
    assert kernel.materialize_due() == 60
    assert 0 < walked < 4 * MAX_COUNTED_SLOTS


def test_dst_fall_back_outage_fires_both_instances_of_a_real_time_hour(clock):
    # Europe/Berlin falls back at 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC): a cron whose
    # hour field is * fires in both 02:xx hours, also when they are caught up after an outage.
    clock.set(datetime(2026, 10, 24, 23, 0, tzinfo=UTC))
    scheduler.create_job(
        "dst",
        "k",
        authority=AUTHORITY,
        trigger={
            "cron": "*/30 * * * *",
            "timezone": "Europe/Berlin",
            "misfire": "run_all",
            "catchup_window": 7200,
        },
    )
    clock.set(datetime(2026, 10, 25, 1, 45, tzinfo=UTC))
    kernel.materialize_due()
    utc = [datetime(2026, 10, 25, h, m, tzinfo=UTC) for h, m in ((0, 0), (0, 30), (1, 0), (1, 30))]
    assert fired("dst") == utc  # 02:00 CEST, 02:30 CEST, 02:00 CET, 02:30 CET
    assert skips("dst") == [
        ("2026-10-24T23:30:00.000Z", "2026-10-24T23:30:00.000Z", 1, "outside_catchup_window")
    ]


# --------------------------------------------------------------------------------- overlap


def test_overlap_is_not_blocked_by_later_work(clock):
    clock.set(CREATED)
    scheduler.create_job("ov", "k", authority=AUTHORITY, trigger={"every": 60, "overlap": "skip"})
    tomorrow = CREATED + timedelta(days=1)
    scheduler.enqueue("ov", scheduled_for=tomorrow, trigger_key="tomorrow")
    for minute in (1, 2, 3):
        clock.set(CREATED + minute * MINUTE)
        assert kernel.materialize_due() == 1
        occurrence = scheduler.claim(owner="w", lease=30)
        assert occurrence.scheduled_for == clock()
        scheduler.settle(occurrence.pk, owner="w", fence=occurrence.fence, outcome="succeeded")
    assert skips("ov") == []
    assert Occurrence.objects.get(trigger_key="tomorrow").status == "queued"


def test_overlap_is_blocked_by_earlier_work(clock):
    clock.set(CREATED)
    scheduler.create_job("ov", "k", authority=AUTHORITY, trigger={"every": 60, "overlap": "skip"})
    earlier, _ = scheduler.enqueue("ov", scheduled_for=CREATED - MINUTE, trigger_key="earlier")
    clock.set(CREATED + MINUTE)
    assert kernel.materialize_due() == 0
    assert skips("ov") == [("2026-01-05T10:01:00.000Z", "2026-01-05T10:01:00.000Z", 1, "overlap")]
    claimed = scheduler.claim(owner="w", lease=300)
    assert claimed.pk == earlier.pk
    clock.set(CREATED + 2 * MINUTE)  # running now: still blocks
    assert kernel.materialize_due() == 0
    scheduler.settle(claimed.pk, owner="w", fence=claimed.fence, outcome="succeeded")
    clock.set(CREATED + 3 * MINUTE)
    assert kernel.materialize_due() == 1
    assert fired("ov")[-1] == CREATED + 3 * MINUTE


def test_overlap_is_blocked_by_running_work_even_if_scheduled_later(clock):
    # A running occurrence is running now, whatever its scheduled time: the slot would overlap it.
    clock.set(CREATED)
    scheduler.create_job("ov", "k", authority=AUTHORITY, trigger={"every": 60, "overlap": "skip"})
    scheduler.enqueue(
        "ov", scheduled_for=CREATED + timedelta(days=1), trigger_key="early", available_at=CREATED
    )
    assert scheduler.claim(owner="w", lease=300).trigger_key == "early"
    clock.set(CREATED + MINUTE)
    assert kernel.materialize_due() == 0
    assert [reason for *_, reason in skips("ov")] == ["overlap"]


def test_overlap_after_an_outage_fires_the_first_slot_only(clock):
    make(clock, "ov", every=60, misfire="run_all", overlap="skip")
    scheduler.enqueue("ov", scheduled_for=CREATED + timedelta(days=1), trigger_key="tomorrow")
    clock.set(CREATED + 5 * MINUTE)
    assert kernel.materialize_due() == 1
    assert fired("ov")[0] == CREATED + MINUTE
    assert skips("ov") == [("2026-01-05T10:02:00.000Z", "2026-01-05T10:05:00.000Z", 4, "overlap")]


# --------------------------------------------------------------------------- past one-offs


def one_off(clock, at: datetime, **options) -> Job:
    clock.set(BACK)
    return scheduler.create_job("once", "k", authority=AUTHORITY, trigger={"at": iso_ms(at), **options})


@pytest.mark.parametrize("misfire", ["run_latest", "run_all"])
def test_past_one_off_within_the_window_fires_once(clock, misfire):
    at = BACK - timedelta(minutes=30)
    job = one_off(clock, at, misfire=misfire)
    assert job.next_fire_at == at
    assert kernel.materialize_due() == 1
    assert fired("once") == [at]
    assert skips("once") == []
    assert Job.objects.get().next_fire_at is None
    clock.advance(3600)
    assert kernel.materialize_due() == 0


def test_past_one_off_within_the_window_with_misfire_skip_is_skipped(clock):
    at = BACK - timedelta(minutes=30)
    one_off(clock, at, misfire="skip")
    assert kernel.materialize_due() == 0
    assert skips("once") == [(iso_ms(at), iso_ms(at), 1, "misfire_skip")]
    assert Job.objects.get().next_fire_at is None


def test_one_off_a_moment_late_is_on_time_under_every_policy(clock):
    for misfire in ("skip", "run_latest", "run_all"):
        clock.set(BACK)
        at = BACK - timedelta(seconds=30)
        scheduler.create_job(
            misfire, "k", authority=AUTHORITY, trigger={"at": iso_ms(at), "misfire": misfire}
        )
        assert kernel.materialize_due() == 1
        assert fired(misfire) == [at]


@pytest.mark.parametrize("misfire", ["run_latest", "run_all", "skip"])
def test_past_one_off_beyond_the_window_is_recorded_as_skipped(clock, misfire):
    at = BACK - timedelta(hours=2)
    job = one_off(clock, at, misfire=misfire)
    assert job.next_fire_at is None
    assert Job.objects.get().next_fire_at is None
    assert skips("once") == [(iso_ms(at), iso_ms(at), 1, "outside_catchup_window")]
    assert kernel.materialize_due() == 0
    assert fired("once") == []


def test_past_one_off_with_a_wider_window_fires(clock):
    at = BACK - timedelta(hours=2)
    job = one_off(clock, at, catchup_window=3 * 3600)
    assert job.next_fire_at == at
    assert kernel.materialize_due() == 1
    assert skips("once") == []


def test_retriggering_to_a_past_one_off_records_the_skip(clock):
    job = make(clock, "once", every=3600)
    clock.set(BACK)
    at = BACK - timedelta(days=1)
    job = scheduler.update_job("once", expected_revision=job.revision, trigger={"at": iso_ms(at)})
    assert job.next_fire_at is None
    assert skips("once") == [(iso_ms(at), iso_ms(at), 1, "outside_catchup_window")]


def test_past_one_off_outside_its_own_bounds_records_nothing(clock):
    # end_at before at: the trigger has no slot at all, so there is nothing to skip.
    at = BACK - timedelta(hours=2)
    job = one_off(clock, at, end_at=iso_ms(at - timedelta(hours=1)))
    assert job.next_fire_at is None
    assert skips("once") == []


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: fire_times.previous_fire_times({"every": 60}, before=datetime(2026, 1, 5, 12, 0)), "before"),
        (lambda: fire_times.previous_fire_times({"every": 60}, before=BACK, count=0), "count"),
        (lambda: fire_times.previous_fire_times({"every": 60}, before=BACK, not_before="soon"), "not_before"),
        (lambda: fire_times.previous_fire_times({"every": 0}, before=BACK), "trigger.every"),
        (lambda: fire_times.count_fire_times({"cron": "* * * *"}, first=CREATED, last=BACK), "trigger.cron"),
        (lambda: fire_times.count_fire_times({"every": 60}, first=None, last=BACK), "first"),
        (lambda: fire_times.count_fire_times({"every": 60}, first=CREATED, last=BACK, limit=-1), "limit"),
    ],
)
def test_backward_fire_time_functions_refuse_bad_input(call, field):
    with pytest.raises(scheduler.InvalidArgument) as info:
        call()
    assert info.value.details["field"] == field
