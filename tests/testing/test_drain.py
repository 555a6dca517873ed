"""``testing.drain()``: what is due runs in the test's thread, through the worker's own claim,
authorization, settle, retry, follow-up and batch code, in pytest-django's ``db`` (a
transaction that never commits) and ``transactional_db`` alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import signals, testing
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.testing import draining
from django_durable_scheduler.worker.loop import Worker

from .conftest import START

# Each test runs twice: in a transaction rolled back at its end (TestCase's way), and
# committing as it goes (TransactionTestCase's).
both = pytest.mark.parametrize(
    "database", ["db", "transactional_db"], ids=["in-a-transaction", "committing"], indirect=True
)


@pytest.fixture
def database(request):
    request.getfixturevalue(request.param)


@both
def test_what_is_due_runs_and_the_drain_says_how_it_ended(database, frozen, handle):
    @handle("t.greet")
    def greet(ctx):
        return {"hello": ctx.payload["name"], "attempt": ctx.attempt}

    scheduler.create_job("greet", "t.greet")
    occurrence, _ = scheduler.enqueue(
        "greet", scheduled_for=frozen.now, trigger_key="k", payload={"name": "Ada"}
    )
    (ran,) = testing.drain()
    assert ran == testing.DrainedRun(
        occurrence_id=occurrence.occurrence_id,
        job_id="greet",
        kind="t.greet",
        attempt=1,
        scheduled_for=frozen.now,
        status="succeeded",
        result={"hello": "Ada", "attempt": 1},
    )
    assert ran.succeeded and not ran.denied
    assert Occurrence.objects.get().result == {"hello": "Ada", "attempt": 1}
    assert testing.drain() == []  # nothing more is due


@both
def test_a_failure_retries_once_the_clock_passes_its_backoff(database, frozen, handle):
    @handle("t.flaky")
    def flaky(ctx):
        if ctx.attempt == 1:
            raise RuntimeError("down")
        return "up"

    # Backoff 10 s, +-20 % jitter: between 8 and 12 s.
    scheduler.create_job("flaky", "t.flaky", retry_base_delay=10)
    scheduler.enqueue("flaky", scheduled_for=frozen.now, trigger_key="k")
    (first,) = testing.drain()
    assert first.status == "retry_wait" and first.error is not None
    assert (first.error["type"], first.error["message"]) == ("RuntimeError", "down")
    frozen.advance(seconds=7)
    assert testing.drain() == []
    frozen.advance(seconds=6)
    (second,) = testing.drain()
    assert (second.attempt, second.status, second.result) == (2, "succeeded", "up")


def test_retry_and_permanent_failure_end_as_the_worker_ends_them(db, frozen, handle):
    @handle("t.later")
    def later(ctx):
        raise scheduler.Retry("not yet", delay=120)

    @handle("t.never")
    def never(ctx):
        raise scheduler.PermanentFailure("cannot", code="E_NO")

    scheduler.create_job("later", "t.later", max_attempts=2)
    scheduler.create_job("never", "t.never")
    scheduler.enqueue("later", scheduled_for=frozen.now, trigger_key="k")
    scheduler.enqueue("never", scheduled_for=frozen.now, trigger_key="k")
    ran = {run.job_id: run for run in testing.drain()}
    assert ran["later"].status == "retry_wait"
    assert ran["never"].status == "dead_letter" and (ran["never"].error or {})["code"] == "E_NO"
    testing.assert_enqueued(job="later", status="retry_wait")
    frozen.advance(minutes=2)
    (last,) = testing.drain()
    assert (last.attempt, last.status) == (2, "dead_letter")  # its last attempt


@both
def test_a_chain_and_a_batch_callback_run_in_the_same_drain(database, frozen, handle):
    @handle("t.export")
    def export(ctx):
        if ctx.payload == {"fail": True}:
            raise scheduler.PermanentFailure("no")
        return {"rows": 3}

    @handle("t.report")
    def report(ctx):
        return {"from": ctx.predecessor["result"] if ctx.predecessor else ctx.batch["counts"]}

    scheduler.create_job("report", "t.report")
    scheduler.create_job("export", "t.export", then=["report"])
    scheduler.enqueue("export", scheduled_for=frozen.now, trigger_key="one")
    ran = testing.drain()
    assert [(run.job_id, run.result) for run in ran] == [
        ("export", {"rows": 3}),
        ("report", {"from": {"rows": 3}}),
    ]

    scheduler.create_job("members", "t.export")
    items = [
        {"scheduled_for": frozen.now, "trigger_key": f"m{i}", "payload": {"fail": i == 0}} for i in range(3)
    ]
    batch, _ = scheduler.enqueue_batch("members", items, callback="report")
    ran = testing.drain()
    assert [run.job_id for run in ran] == ["members"] * 3 + ["report"]
    assert ran[-1].result == {"from": {"succeeded": 2, "dead_letter": 1, "cancelled": 0}}
    assert scheduler.get_batch(batch.batch_id).status == "completed"


@both
def test_cron_slots_follow_daylight_saving_as_the_clock_moves(database, frozen, handle):
    handle("t.daily")(lambda ctx: None)
    scheduler.create_job("daily", "t.daily", trigger={"cron": "0 9 * * *", "timezone": "Europe/Berlin"})
    assert testing.drain() == []  # 13:00 in Berlin: today's slot was before the job existed
    frozen.set(datetime(2026, 3, 28, 7, 59, tzinfo=UTC))
    # The slots of the days in between are past the catch-up window (an hour): skipped.
    assert testing.drain() == []
    frozen.advance(minutes=1)  # 09:00 CET, the last day of winter time
    assert [run.scheduled_for for run in testing.drain()] == [datetime(2026, 3, 28, 8, 0, tzinfo=UTC)]
    frozen.advance(hours=22, minutes=59)  # 06:59 UTC on Sunday: 08:59 CEST, summer time
    assert testing.drain() == []
    frozen.advance(minutes=1)
    assert [run.scheduled_for for run in testing.drain()] == [datetime(2026, 3, 29, 7, 0, tzinfo=UTC)]


def test_missed_interval_slots_follow_the_misfire_policy(db, frozen, handle):
    handle("t.tick")(lambda ctx: None)
    scheduler.create_job("latest", "t.tick", trigger={"every": 300})
    scheduler.create_job("all", "t.tick", trigger={"every": 300, "misfire": "run_all"})
    frozen.advance(hours=1)
    ran = testing.drain()
    assert sum(run.job_id == "latest" for run in ran) == 1
    assert sum(run.job_id == "all" for run in ran) == 12


@both
def test_denials_and_budget_deferrals_show_in_the_drain(database, frozen, handle):
    handle("t.secret")(lambda ctx: "done")
    bob = {"principal": {"type": "user", "id": "bob"}, "requestedCapabilities": ["t.secret"]}
    scheduler.create_job("secret", "t.secret", authority=bob)
    scheduler.enqueue("secret", scheduled_for=frozen.now, trigger_key="no-policy")
    (denied,) = testing.drain()
    assert denied.denied and denied.status == "dead_letter"
    assert denied.denial is not None and denied.denial["verdict"] == "denied" and denied.denial["reason"]

    testing.grant("user:bob", "t.secret", runs=1, window=3600)
    for key in ("a", "b"):
        scheduler.enqueue("secret", scheduled_for=frozen.now, trigger_key=key)
    ran = testing.drain()
    assert [(run.status, run.deferred) for run in ran] == [("succeeded", False), ("queued", True)]
    frozen.advance(hours=1)  # the next budget window
    assert [run.status for run in testing.drain()] == ["succeeded"]


def test_an_expired_lease_is_reclaimed_once_the_clock_passes_it(db, frozen, handle):
    handle("t.work")(lambda ctx: ctx.attempt)
    scheduler.create_job("work", "t.work")
    scheduler.enqueue("work", scheduled_for=frozen.now, trigger_key="k")
    assert scheduler.claim(owner="crashed-worker", lease=30) is not None
    assert testing.drain() == []  # its lease still runs
    frozen.advance(seconds=31)
    (ran,) = testing.drain()
    assert (ran.attempt, ran.result) == (2, 2)


def test_limits_kinds_and_work_without_a_handler(db, frozen, handle):
    handle("t.a")(lambda ctx: "a")
    handle("t.b")(lambda ctx: "b")
    for job_id, kind in (("a", "t.a"), ("b", "t.b"), ("orphan", "t.unhandled")):
        scheduler.create_job(job_id, kind)
        for n in range(3):
            scheduler.enqueue(job_id, scheduled_for=frozen.now, trigger_key=f"{n}")
    assert len(testing.drain(max_runs=2)) == 2
    assert {run.kind for run in testing.drain(kinds=["t.b"])} == {"t.b"}
    testing.assert_not_enqueued(kind="t.b")
    assert {run.kind for run in testing.drain()} == {"t.a"}
    testing.assert_enqueued(job="orphan", count=3)  # no handler here: never claimed


def test_the_handler_context_writes_and_the_workers_signals_are_sent(db, frozen, handle):
    @handle("t.charge")
    def charge(ctx):
        ctx.record_metadata({"step": "charged"})
        ctx.record_receipt({"charge": "ch_1"})
        return "ok"

    heard = []

    def receiver(sender, **kwargs):
        heard.append((sender, kwargs["outcome"], kwargs["worker_id"]))

    scheduler.create_job("charge", "t.charge")
    scheduler.enqueue("charge", scheduled_for=frozen.now, trigger_key="k")
    signals.occurrence_finished.connect(receiver)
    try:
        testing.drain()
    finally:
        signals.occurrence_finished.disconnect(receiver)
    row = Occurrence.objects.get()
    assert (row.metadata, row.receipt) == ({"step": "charged"}, {"charge": "ch_1"})
    ((sender, outcome, worker_id),) = heard
    assert sender is Worker and outcome == "succeeded" and worker_id.startswith("testing-drain:")


def test_a_drain_that_never_ends_stops_and_says_why(db, frozen, handle, monkeypatch):
    monkeypatch.setattr(draining, "RUNAWAY", 5)

    @handle("t.again")
    def again(ctx):
        scheduler.enqueue("again", scheduled_for=frozen.now, trigger_key=f"{ctx.attempt}-{ctx.occurrence_id}")

    scheduler.create_job("again", "t.again")
    scheduler.enqueue("again", scheduled_for=frozen.now, trigger_key="first")
    with pytest.raises(AssertionError, match="work is still due"):
        testing.drain()
    assert len(testing.drain(max_runs=3)) == 3


def test_without_a_frozen_clock_the_drain_runs_what_is_due_by_the_real_time(db, handle):
    handle("t.now")(lambda ctx: "now")
    scheduler.create_job("now", "t.now")
    scheduler.enqueue("now", scheduled_for=datetime.now(UTC) - timedelta(seconds=1), trigger_key="k")
    scheduler.enqueue("now", scheduled_for=START + timedelta(days=3650), trigger_key="later")
    assert [run.result for run in testing.drain()] == ["now"]
    testing.assert_enqueued(job="now", trigger_key="later")
