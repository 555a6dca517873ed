"""Materialization: due slots become occurrences once, with misfire and overlap policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Event, Job, Occurrence

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 11, 59, 30, tzinfo=UTC)


def slots(job_id="hourly"):
    return sorted(o.trigger_key for o in Occurrence.objects.filter(job_id=job_id))


def skipped(job_id="hourly"):
    """Each slot_skipped event: one per range of consecutive slots skipped for one reason."""
    return sorted(
        (e.data["from"], e.data["to"], e.data["count"], e.data["reason"])
        for e in Event.objects.filter(job_id=job_id, event_type="slot_skipped")
    )


def hourly(clock, **options):
    clock.set(T0)
    return scheduler.create_job("hourly", "k", authority=AUTHORITY, trigger={"cron": "0 * * * *", **options})


def test_next_fire_time_is_persisted(clock):
    job = hourly(clock, timezone="Europe/Berlin")
    assert job.next_fire_at == datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    assert Job.objects.get().next_fire_at == job.next_fire_at
    assert scheduler.create_job("none", "k", authority=AUTHORITY).next_fire_at is None


def test_due_slot_materializes_once(clock):
    hourly(clock)
    assert kernel.materialize_due() == 0
    clock.set(datetime(2026, 1, 5, 12, 0, 0, 500_000, tzinfo=UTC))
    assert kernel.materialize_due() == 1
    assert kernel.materialize_due() == 0
    assert slots() == ["schedule:2026-01-05T12:00:00.000Z"]
    occ = Occurrence.objects.get()
    assert occ.scheduled_for == datetime(2026, 1, 5, 12, 0, tzinfo=UTC) == occ.available_at
    assert Job.objects.get().next_fire_at == datetime(2026, 1, 5, 13, 0, tzinfo=UTC)


def outage(clock):
    clock.set(datetime(2026, 1, 5, 15, 30, tzinfo=UTC))  # down from 11:59:30 to 15:30
    kernel.materialize_due()


def test_misfire_skip_after_outage(clock):
    hourly(clock, misfire="skip", catchup_window=4 * 3600)
    outage(clock)
    assert slots() == []
    assert skipped() == [("2026-01-05T12:00:00.000Z", "2026-01-05T15:00:00.000Z", 4, "misfire_skip")]
    assert Job.objects.get().next_fire_at == datetime(2026, 1, 5, 16, 0, tzinfo=UTC)


def test_misfire_run_latest_after_outage(clock):
    hourly(clock, catchup_window=4 * 3600)  # run_latest is the default
    outage(clock)
    assert slots() == ["schedule:2026-01-05T15:00:00.000Z"]
    assert skipped() == [("2026-01-05T12:00:00.000Z", "2026-01-05T14:00:00.000Z", 3, "misfire_coalesced")]


def test_misfire_run_all_after_outage(clock):
    hourly(clock, misfire="run_all", catchup_window=4 * 3600)
    outage(clock)
    assert slots() == [f"schedule:2026-01-05T{h}:00:00.000Z" for h in (12, 13, 14, 15)]
    assert skipped() == []


def test_catchup_window_bounds_run_all(clock):
    hourly(clock, misfire="run_all")  # default window: one hour
    outage(clock)
    assert slots() == ["schedule:2026-01-05T15:00:00.000Z"]
    assert skipped() == [
        ("2026-01-05T12:00:00.000Z", "2026-01-05T14:00:00.000Z", 3, "outside_catchup_window")
    ]


def test_run_all_fires_at_most_100_slots(clock):
    clock.set(T0)
    scheduler.create_job("fast", "k", authority=AUTHORITY, trigger={"every": 1, "misfire": "run_all"})
    clock.advance(150)
    kernel.materialize_due()
    assert Occurrence.objects.count() == 100
    assert skipped("fast") == [("2026-01-05T11:59:31.000Z", "2026-01-05T12:00:20.000Z", 50, "catchup_limit")]


def test_overlap_skip(clock):
    clock.set(T0)
    scheduler.create_job("ov", "k", authority=AUTHORITY, trigger={"every": 60, "overlap": "skip"})
    clock.advance(60)
    assert kernel.materialize_due() == 1
    clock.advance(60)  # the first is still queued
    assert kernel.materialize_due() == 0
    assert skipped("ov") == [("2026-01-05T12:01:30.000Z", "2026-01-05T12:01:30.000Z", 1, "overlap")]
    first = scheduler.claim(owner="w", lease=30)
    scheduler.settle(first.pk, owner="w", fence=1, outcome="succeeded")
    clock.advance(60)
    assert kernel.materialize_due() == 1


def test_overlap_allow_fires_while_running(clock):
    clock.set(T0)
    scheduler.create_job("ov", "k", authority=AUTHORITY, trigger={"every": 60})
    clock.advance(60)
    kernel.materialize_due()
    scheduler.claim(owner="w", lease=300)
    clock.advance(60)
    assert kernel.materialize_due() == 1


def test_disabled_job_does_not_materialize(clock):
    job = hourly(clock)
    scheduler.update_job("hourly", expected_revision=job.revision, enabled=False)
    clock.set(datetime(2026, 1, 5, 12, 0, 1, tzinfo=UTC))
    assert kernel.materialize_due() == 0
    assert slots() == []


def test_edit_supersedes_and_never_refires_a_slot(clock):
    job = hourly(clock)
    explicit, _ = scheduler.enqueue("hourly", scheduled_for=clock(), trigger_key="manual")
    clock.set(datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC))
    kernel.materialize_due()
    slot = Occurrence.objects.get(trigger_key="schedule:2026-01-05T12:00:00.000Z")
    # Edit at the slot's own instant, to a trigger that also has a 12:00 slot.
    job = scheduler.update_job("hourly", expected_revision=job.revision, trigger={"cron": "0,30 * * * *"})
    slot.refresh_from_db()
    assert (slot.status, slot.last_error["message"]) == ("cancelled", "superseded")
    assert Occurrence.objects.get(pk=explicit.pk).status == "queued"  # explicit work keeps running
    assert job.next_fire_at == datetime(2026, 1, 5, 12, 30, tzinfo=UTC)
    clock.set(datetime(2026, 1, 5, 12, 30, tzinfo=UTC))
    kernel.materialize_due()
    assert Occurrence.objects.filter(trigger_key="schedule:2026-01-05T12:00:00.000Z").count() == 1
    assert (
        Occurrence.objects.filter(trigger_key="schedule:2026-01-05T12:30:00.000Z", job_revision=2).count()
        == 1
    )


def test_last_slot_guard_survives_pruning_and_edits(clock):
    job = hourly(clock)
    clock.set(datetime(2026, 1, 5, 12, 0, tzinfo=UTC))
    kernel.materialize_due()
    occ = scheduler.claim(owner="w", lease=30)
    scheduler.settle(occ.pk, owner="w", fence=1, outcome="succeeded")
    Event.objects.filter(occurrence=occ).delete()  # pruned
    Occurrence.objects.filter(pk=occ.pk).delete()
    # Even forcing the next fire time back (a bad edit, clock skew) cannot refire 12:00.
    Job.objects.filter(pk="hourly").update(next_fire_at=datetime(2026, 1, 5, 12, 0, tzinfo=UTC))
    assert kernel.materialize_due() == 0
    assert slots() == []
    assert job.job_id == "hourly"


def test_at_trigger_fires_once(clock):
    clock.set(T0)
    at = T0 + timedelta(seconds=10)
    job = scheduler.create_job("once", "k", authority=AUTHORITY, trigger={"at": at.isoformat()})
    assert job.next_fire_at == at
    clock.advance(10)
    assert kernel.materialize_due() == 1
    assert Job.objects.get().next_fire_at is None
    clock.advance(3600)
    assert kernel.materialize_due() == 0


def test_dst_slot_in_gap_fires_after_the_gap(clock):
    # Europe/Berlin springs forward at 2026-03-29 02:00 -> 03:00 (01:00 UTC).
    clock.set(datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    job = scheduler.create_job(
        "dst", "k", authority=AUTHORITY, trigger={"cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    )
    assert job.next_fire_at == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    clock.set(datetime(2026, 3, 29, 1, 0, tzinfo=UTC))
    assert kernel.materialize_due() == 1
    assert Job.objects.get().next_fire_at == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)


def test_nothing_due_is_one_query(clock, django_assert_num_queries):
    for n in range(20):
        scheduler.create_job(f"j{n}", "k", authority=AUTHORITY, trigger={"cron": "0 0 1 1 *"})
    with django_assert_num_queries(1):
        assert kernel.materialize_due() == 0


def test_bad_trigger_is_refused_naming_the_field(clock):
    for trigger, field in [
        ({"cron": "0 0 * * * *"}, "trigger.cron"),
        ({"cron": "*/0 * * * *"}, "trigger.cron"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "trigger.timezone"),
        ({"every": -5}, "trigger.every"),
        ({"at": "2026-12-01T09:00:00"}, "trigger.at"),
        ({"every": 5, "jitter": 1}, "trigger.jitter"),
    ]:
        with pytest.raises(scheduler.InvalidArgument) as info:
            scheduler.create_job("bad", "k", authority=AUTHORITY, trigger=trigger)
        assert info.value.details["field"] == field
    assert not Job.objects.exists()
