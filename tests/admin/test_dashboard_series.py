"""The dashboard's figures over time (admin/dashboard_series.py, on rollups.py): runs by
outcome per bucket of the last hour, day and week, per kind and in all, the retried attempts,
the pickup lag's percentiles from the counted histogram, the queue depth, follow-ups and
batches; the same figures from the hourly counts as live; empty ranges; and the kernel's
``batch_completed`` and ``follow_up_enqueued`` signals, sent after the commit only."""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

import pytest
from django.db import transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel, signals
from django_durable_scheduler.admin import dashboard_charts, dashboard_series
from django_durable_scheduler.admin.dashboard_series import percentile
from django_durable_scheduler.housekeeping import rollups
from django_durable_scheduler.models import Batch, Occurrence, OutcomeCount

pytestmark = pytest.mark.django_db
OWNER = "w-series"


def run(job_id: str, clock, *, lag: float = 0, outcome: str = "succeeded", **enqueue) -> Occurrence:
    """An occurrence of ``job_id`` due now, claimed ``lag`` seconds later and settled."""
    occurrence, _ = kernel.enqueue(
        job_id, scheduled_for=clock(), trigger_key=f"t{clock().timestamp()}", **enqueue
    )
    clock.advance(lag)
    held = kernel.claim(owner=OWNER, lease=600)
    assert held is not None and held.pk == occurrence.pk
    policy = scheduler.get_policy("app", "durable_scheduler")
    scheduler.reserve_authority(held.pk, policy_revision=policy.revision)
    failed = {"outcome": "failed", "retryable": False} if outcome != "succeeded" else {"outcome": outcome}
    return kernel.settle(held.pk, owner=OWNER, fence=held.fence, **failed)


@pytest.fixture
def jobs(clock):
    scheduler.create_job("mail", "mail.send")
    scheduler.create_job("sync", "crm.sync")


def test_percentiles_read_from_the_histogram():
    bounds = rollups.LAG_BOUNDS
    histogram = [0] * (len(bounds) + 1)
    assert percentile(histogram, 0.5) is None
    histogram[bounds.index(30)] = 4  # four runs that waited between 10 s and 30 s
    assert percentile(histogram, 0.5) == pytest.approx(20.0)
    assert percentile(histogram, 1.0) == pytest.approx(30.0)
    histogram[-1] = 1  # and one beyond the largest bound: it reads as that bound
    assert percentile(histogram, 0.95) == float(bounds[-1])
    assert percentile(histogram, 0.2) == pytest.approx(15.0)  # the first of five


@pytest.mark.parametrize(
    ("name", "count", "step"), [("hour", 12, 300), ("day", 24, 3600), ("week", 28, 21600)]
)
def test_the_buckets_are_aligned_and_end_with_now(clock, name, count, step):
    span = dashboard_series.RANGES[name]
    starts = dashboard_series.bucket_starts(span, clock())
    assert len(starts) == count
    assert all(s.timestamp() % step == 0 for s in starts)
    assert starts[-1] <= clock() < starts[-1] + span.step


def test_an_empty_range(jobs, clock):
    for name in dashboard_series.RANGES:
        timeline = dashboard_series.collect(name, None, clock(), "default")
        assert all(not +b.counts and b.lag(0.5) is None and b.depth == 0 for b in timeline.buckets)
        for chart in dashboard_charts.charts(timeline):
            assert chart.empty and not any(bar["segments"] for bar in chart.bars)


def test_a_day_per_kind_and_in_all(jobs, clock):
    start = clock()
    run("mail", clock, lag=20)  # hour 0
    run("mail", clock, lag=20)
    run("sync", clock, lag=0.05, outcome="failed")
    clock.advance(hours=3)
    run("mail", clock, lag=200)  # hour 3
    clock.advance(hours=2)  # hours 0 and 3 are over: read from their counts
    now = clock()
    every = dashboard_series.collect("day", None, now, "default")
    mail = dashboard_series.collect("day", "mail.send", now, "default")
    assert OutcomeCount.objects.filter(kind=rollups.MARK).exists()
    by_start = {b.start: b for b in every.buckets}
    first = by_start[start.replace(minute=0, second=0, microsecond=0)]
    assert first.counts["succeeded"] == 2 and first.counts["dead_letter"] == 1
    assert first.lag(0.5) == pytest.approx(10 + 20 * (0.5 / 2))  # 3 runs: 1 below 0.1 s, 2 in 10-30 s
    assert {b.start: b.counts["succeeded"] for b in mail.buckets if b.counts["succeeded"]} == {
        first.start: 2,
        first.start + timedelta(hours=3): 1,
    }
    assert mail.total("dead_letter") == 0 and every.total("dead_letter") == 1
    later = by_start[first.start + timedelta(hours=3)]
    assert later.lag(0.5) == pytest.approx(210.0) and later.lag(0.95) == pytest.approx(291.0)  # 120-300 s
    # The hourly counts hold what a live count of the same hours finds.
    live = rollups._of_kind(rollups.grouped(first.start, now, "hour", "default"), None)
    stored = rollups.hourly(first.start, now, alias="default")
    assert +live == +stored
    assert Counter(live)[(first.start, rollups.WAITED)] == 40_000 + 50


def test_the_last_hour_in_five_minute_buckets_and_a_week_in_six_hours(jobs, clock):
    run("mail", clock)
    clock.advance(minutes=12)
    run("sync", clock)
    hour = dashboard_series.collect("hour", None, clock(), "default")
    assert [b.counts["succeeded"] for b in hour.buckets if b.counts["succeeded"]] == [1, 1]
    clock.advance(days=2)
    run("sync", clock, outcome="failed")
    week = dashboard_series.collect("week", None, clock(), "default")
    assert week.total("succeeded") == 2 and week.total("dead_letter") == 1
    assert sum(1 for b in week.buckets if +b.counts) == 2


def test_queue_depth_counts_the_waiting_and_what_waited(jobs, clock):
    run("mail", clock, lag=1800)  # waited half an hour, settled in this hour
    kernel.enqueue("sync", scheduled_for=clock(), trigger_key="waits")
    clock.advance(hours=2)
    timeline = dashboard_series.collect("day", None, clock(), "default")
    depths = [round(b.depth, 2) for b in timeline.buckets if b.depth]
    # Half an hour waited in an hour (0.5), then the one that still waits, at first for the
    # part of the hour after it became due, then for whole hours.
    assert depths[0] >= 0.5 and depths[-2:] == [1.0, 1.0]
    assert dashboard_series.collect("day", "mail.send", clock(), "default").buckets[-1].depth == 0


@pytest.mark.django_db(transaction=True)
def test_follow_ups_and_batches_are_counted_and_signalled(jobs, clock):
    heard: dict[str, list[dict]] = {"batch": [], "follow_up": []}

    def on_batch(sender, **kwargs):
        heard["batch"].append({"sender": sender, **kwargs})

    def on_follow_up(sender, **kwargs):
        heard["follow_up"].append({"sender": sender, **kwargs})

    signals.batch_completed.connect(on_batch, weak=False)
    signals.follow_up_enqueued.connect(on_follow_up, weak=False)
    try:
        first = run("mail", clock, then=["sync"])
        follow_up = Occurrence.objects.get(caused_by=first.pk)
        batch, _ = kernel.enqueue_batch(
            "mail", [{"scheduled_for": clock(), "trigger_key": "m1"}], callback="sync", description="b"
        )
        rows = kernel.claim_batch(owner=OWNER, lease=60, limit=5, sweep_expired=False)
        member = next(row for row in rows if row.batch_id == batch.pk)
        kernel.settle(member.pk, owner=OWNER, fence=member.fence, outcome="succeeded")
        for row in kernel.claim_batch(owner=OWNER, lease=60, limit=5, sweep_expired=False) + rows:
            if row.pk != member.pk:  # the follow-up and the batch's callback, out of the way
                kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome="succeeded")
        clock.advance(1)
        with pytest.raises(RuntimeError), transaction.atomic():  # rolled back: never heard
            run("mail", clock, then=["sync"])
            raise RuntimeError
    finally:
        signals.batch_completed.disconnect(on_batch)
        signals.follow_up_enqueued.disconnect(on_follow_up)
    (done,) = heard["batch"]
    assert done["sender"] is Batch and done["batch"].pk == batch.pk and done["kind"] == "crm.sync"
    assert done["batch"].counts["succeeded"] == 1 and done["cancelled"] is False
    (followed,) = heard["follow_up"]
    assert followed["sender"] is Occurrence and followed["occurrence"].pk == follow_up.pk
    assert (followed["kind"], followed["predecessor"], followed["on"]) == ("crm.sync", first.pk, "then")
    timeline = dashboard_series.collect("hour", None, clock(), "default")
    assert timeline.total(rollups.FOLLOW_UPS) == 1 and timeline.total(rollups.BATCHES) == 1
    assert dashboard_series.collect("hour", "mail.send", clock(), "default").total(rollups.BATCHES) == 0


def test_an_unheard_signal_registers_nothing_after_the_commit(jobs, clock, monkeypatch):
    registered = []
    monkeypatch.setattr(transaction, "on_commit", lambda *a, **k: registered.append(a))
    monkeypatch.setattr("django_durable_scheduler.telemetry.metrics.get", lambda: None)
    assert not signals.follow_up_enqueued.has_listeners(Occurrence)
    run("mail", clock, then=["sync"])
    assert Occurrence.objects.filter(job_id="sync").count() == 1
    assert not any("announce" in getattr(call[0], "__name__", "") for call in registered)


def test_a_count_of_one_reads_in_the_singular(clock):
    """A bar's tooltip and the line of totals say "1 batch completed", "2 batches completed":
    each series' label agrees with its count."""
    from django.template.loader import render_to_string

    span = dashboard_series.RANGES["hour"]
    starts = dashboard_series.bucket_starts(span, clock())
    keys = (dashboard_series.SUCCEEDED, rollups.RETRIES, rollups.BATCHES, rollups.FOLLOW_UPS)
    counts = [Counter(dict.fromkeys(keys, 1)), Counter(dict.fromkeys(keys, 2))]
    buckets = [
        dashboard_series.Bucket(s, s + span.step, counts[i] if i < 2 else Counter(), 0.0)
        for i, s in enumerate(starts)
    ]
    timeline = dashboard_series.Timeline(span, None, clock(), buckets)
    titles = []
    for chart in dashboard_charts.charts(timeline):
        html = render_to_string(
            "admin/durable_scheduler/dashboard_chart.html", {"chart": chart, "timeline": timeline}
        )
        titles += re.findall(r"<title>\d\d:\d\d: (.*?)</title>", html)
    for one, two in [
        ("1 succeeded", "2 succeeded"),
        ("1 attempt failed and retried", "2 attempts failed and retried"),
        ("1 batch completed", "2 batches completed"),
        ("1 follow-up enqueued", "2 follow-ups enqueued"),
    ]:
        assert one in titles and two in titles, (one, two, titles)
    totals = [f"{n} {label}" for label, n in timeline.summary]
    assert "3 batches completed" in totals and "3 follow-ups enqueued" in totals
    empty = dashboard_series.Timeline(span, None, clock(), buckets[:1])
    assert [f"{n} {label}" for label, n in empty.summary][-2:] == [
        "1 batch completed",
        "1 follow-up enqueued",
    ]
