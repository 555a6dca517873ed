"""Batches in the kernel: members added until the batch is closed, one callback once every
member is terminal (with the counts by outcome), no write to the batch row when a member
settles, cancelling, the sweep that completes what a crash left, and bad input refused with
nothing written."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.exceptions import Conflict, InvalidArgument, InvalidState, NotFound
from django_durable_scheduler.models import Batch, BatchStatus, Event, Occurrence, OccurrenceStatus

from ..conftest import CLOCK_START, authority_for, snapshot

pytestmark = pytest.mark.django_db(transaction=True)
OWNER = "w-batch"


@pytest.fixture
def jobs(clock):
    kernel.create_job("export", "reports.export", authority=authority_for("alice", "reports.export"))
    kernel.create_job(
        "report", "reports.send", authority=authority_for("bob", "reports.send"), payload={"to": "ops"}
    )


def _items(n: int, prefix: str = "k") -> list[dict]:
    return [
        {"scheduled_for": CLOCK_START, "trigger_key": f"{prefix}{i}", "payload": {"i": i}} for i in range(n)
    ]


def _settle_all(outcome: str = "succeeded", **settle) -> list[Occurrence]:
    rows = kernel.claim_batch(owner=OWNER, lease=60, limit=500, sweep_expired=False)
    return [kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome=outcome, **settle) for row in rows]


def test_the_callback_is_enqueued_once_when_the_last_member_ends(jobs, clock):
    batch, results = kernel.enqueue_batch(
        "export", _items(3), callback="report", description="nightly", created_by="alice"
    )
    assert batch.status == BatchStatus.CLOSED and batch.size == 3
    assert {row.batch_id for row, _ in results} == {batch.batch_id}
    rows = kernel.claim_batch(owner=OWNER, lease=60, limit=3, sweep_expired=False)
    kernel.settle(rows[0].pk, owner=OWNER, fence=rows[0].fence, outcome="succeeded")
    kernel.settle(rows[1].pk, owner=OWNER, fence=rows[1].fence, outcome="failed", retryable=False)
    assert Batch.objects.get().status == BatchStatus.CLOSED  # one is still running
    kernel.settle(rows[2].pk, owner=OWNER, fence=rows[2].fence, outcome="succeeded")
    done = Batch.objects.get()
    assert done.status == BatchStatus.COMPLETED and done.counts == {
        "succeeded": 2,
        "dead_letter": 1,
        "cancelled": 0,
    }
    callback = Occurrence.objects.get(job_id="report")
    assert done.callback == callback.pk and callback.payload == {"to": "ops"}
    assert callback.cause == {
        "batch_id": batch.batch_id,
        "description": "nightly",
        "size": 3,
        "counts": {"succeeded": 2, "dead_letter": 1, "cancelled": 0},
        "cancelled": False,
    }
    types = list(
        Event.objects.filter(data__batchId=batch.batch_id, occurrence__isnull=True)
        .order_by("event_id")
        .values_list("event_type", flat=True)
    )
    assert types == ["batch_opened", "batch_closed", "batch_completed"]
    opened = Event.objects.get(event_type="batch_opened")
    assert opened.data["createdBy"] == "alice" and opened.job_id == "report"
    # Looking again changes nothing: exactly one callback.
    assert kernel.complete_due_batches() == 0
    assert Occurrence.objects.filter(job_id="report").count() == 1


def test_settling_a_member_never_writes_the_batch_row(jobs, clock):
    kernel.enqueue_batch("export", _items(2), callback="report")
    (row, _) = kernel.claim_batch(owner=OWNER, lease=60, limit=2, sweep_expired=False)
    table = Batch._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome="succeeded")
    writes = [
        q["sql"] for q in queries if table in q["sql"] and not q["sql"].lstrip().upper().startswith("SELECT")
    ]
    assert writes == []


def test_an_open_batch_waits_for_its_close_and_takes_members_until_then(jobs, clock):
    batch = kernel.open_batch("report", payload={"say": "done"}, batch_id="b-1")
    assert kernel.open_batch("report", payload={"say": "done"}, batch_id="b-1").pk == "b-1"  # idempotent
    kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="a", batch="b-1")
    kernel.enqueue_many("export", _items(2), batch="b-1")
    again, deduplicated = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="a", batch="b-1")
    assert deduplicated and again.batch_id == "b-1"
    _settle_all()
    assert Batch.objects.get().status == BatchStatus.OPEN  # all done, but more may come
    assert kernel.get_batch("b-1").size == 3
    closed = kernel.close_batch(batch.batch_id)
    assert closed.pk == "b-1"
    done = Batch.objects.get()
    assert done.status == BatchStatus.COMPLETED and done.counts["succeeded"] == 3
    assert Occurrence.objects.get(job_id="report").payload == {"say": "done"}
    with pytest.raises(InvalidState, match="takes no more members") as raised:
        kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="late", batch="b-1")
    assert raised.value.details["field"] == "batch"


def test_a_batch_with_no_members_completes_when_closed(jobs, clock):
    batch, results = kernel.enqueue_batch("export", [], callback="report")
    assert results == []
    done = Batch.objects.get(pk=batch.pk)
    assert done.status == BatchStatus.COMPLETED and done.counts == {
        "succeeded": 0,
        "dead_letter": 0,
        "cancelled": 0,
    }
    assert Occurrence.objects.filter(job_id="report").count() == 1


def test_cancelling_cancels_the_waiting_members_and_the_callback_says_so(jobs, clock):
    batch, _ = kernel.enqueue_batch("export", _items(4), callback="report")
    (running,) = kernel.claim_batch(owner=OWNER, lease=60, limit=1, sweep_expired=False)
    cancelled = kernel.cancel_batch(batch.batch_id, reason="wrong day", requested_by="alice")
    assert cancelled.cancelled_at is not None and cancelled.cancelled_by == "alice"
    assert kernel.batch_progress(batch.batch_id) == {
        "queued": 0,
        "running": 1,
        "retry_wait": 0,
        "succeeded": 0,
        "dead_letter": 0,
        "cancelled": 3,
        "total": 4,
    }
    assert Batch.objects.get().status == BatchStatus.CLOSED  # the running one finishes first
    kernel.settle(running.pk, owner=OWNER, fence=running.fence, outcome="succeeded")
    done = Batch.objects.get()
    assert done.status == BatchStatus.COMPLETED and done.counts == {
        "succeeded": 1,
        "dead_letter": 0,
        "cancelled": 3,
    }
    assert Occurrence.objects.get(job_id="report").cause["cancelled"] is True
    assert len(kernel.batch_members(batch.batch_id, status="cancelled")) == 3
    with pytest.raises(InvalidState, match="completed"):
        kernel.cancel_batch(batch.batch_id)


def test_the_sweep_completes_a_batch_whose_look_was_lost(jobs, clock):
    batch, _ = kernel.enqueue_batch("export", _items(2), callback="report")
    # As if the worker died between its settle's commit and the look after it.
    Occurrence.objects.filter(batch_id=batch.pk).update(
        status=OccurrenceStatus.SUCCEEDED, settled_at=CLOCK_START
    )
    assert Batch.objects.get().status == BatchStatus.CLOSED
    assert kernel.complete_due_batches() == 1
    assert Batch.objects.get().status == BatchStatus.COMPLETED
    assert kernel.complete_due_batches() == 0
    assert Occurrence.objects.filter(job_id="report").count() == 1


def test_a_disabled_callback_job_gets_its_callback_which_waits(jobs, clock):
    kernel.enqueue_batch("export", _items(1), callback="report")
    kernel.update_job("report", expected_revision=1, enabled=False)
    _settle_all()
    callback = Occurrence.objects.get(job_id="report")
    assert callback.status == OccurrenceStatus.QUEUED and Batch.objects.get().callback == callback.pk


def test_members_of_several_jobs_and_their_own_chains(jobs, clock):
    kernel.create_job("other", "reports.export", authority=authority_for("dave", "reports.export"))
    batch = kernel.open_batch("report")
    first, _ = kernel.enqueue(
        "export", scheduled_for=CLOCK_START, trigger_key="x", batch=batch.pk, then="other"
    )
    kernel.enqueue("other", scheduled_for=CLOCK_START, trigger_key="y", batch=batch.pk)
    kernel.close_batch(batch.pk)
    _settle_all()
    # The follow-up of a member is not a member: the batch completed with its two.
    follow = Occurrence.objects.get(caused_by=first.pk)
    assert follow.batch_id is None
    assert Batch.objects.get().counts["succeeded"] == 2


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda: kernel.open_batch("nope"), NotFound, "callback"),
        (lambda: kernel.open_batch("report", batch_id=""), InvalidArgument, "batch_id"),
        (lambda: kernel.open_batch("report", batch_id="x" * 201), InvalidArgument, "batch_id"),
        (lambda: kernel.open_batch("report", description=5), InvalidArgument, "description"),
        (lambda: kernel.open_batch("report", created_by=" "), InvalidArgument, "created_by"),
        (
            lambda: kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="a", batch="nope"),
            NotFound,
            "batch",
        ),
        (lambda: kernel.enqueue_many("export", _items(2), batch="nope"), NotFound, "batch"),
        (lambda: kernel.close_batch("nope"), NotFound, "batch"),
        (lambda: kernel.cancel_batch("nope"), NotFound, "batch"),
        (lambda: kernel.enqueue_batch("export", _items(2), callback="nope"), NotFound, "callback"),
        (lambda: kernel.enqueue_batch("nope", _items(2), callback="report"), NotFound, None),
        # A lone surrogate reached the batch lookup unchecked (psycopg: UnicodeEncodeError).
        (
            lambda: kernel.enqueue_batch("export", _items(2), callback="report", batch_id="\ud800"),
            InvalidArgument,
            "batch_id",
        ),
        (
            lambda: kernel.enqueue(
                "export", scheduled_for=CLOCK_START, trigger_key="a", batch="b", unique_key="u"
            ),
            InvalidArgument,
            "unique_key",
        ),
    ],
)
def test_bad_input_is_refused_with_nothing_written(jobs, clock, call, error, field):
    before = snapshot()
    batches_before = list(Batch.objects.values_list("pk", "status", "size"))
    with pytest.raises(error) as raised:
        call()
    if field is not None:
        assert raised.value.details["field"] == field
    assert snapshot() == before
    assert list(Batch.objects.values_list("pk", "status", "size")) == batches_before


def test_an_occurrence_of_another_batch_cannot_join(jobs, clock):
    kernel.open_batch("report", batch_id="b-1")
    kernel.open_batch("report", batch_id="b-2")
    kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="a", batch="b-1")
    with pytest.raises(Conflict, match="batch 'b-1'"):
        kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="a", batch="b-2")
    with pytest.raises(Conflict, match="another callback"):
        kernel.open_batch("export", batch_id="b-1")
    assert kernel.get_batch("b-2").size == 0


def test_the_public_names(jobs):
    for name in (
        "enqueue_batch",
        "open_batch",
        "close_batch",
        "cancel_batch",
        "get_batch",
        "batch_progress",
        "batch_members",
    ):
        assert callable(getattr(scheduler, name))


def test_retention_keeps_the_members_of_a_batch_until_it_completes(jobs, clock):
    from datetime import timedelta

    from django_durable_scheduler.housekeeping.retention.plan import prune

    batch = kernel.open_batch("report")
    kernel.enqueue_many("export", _items(2), batch=batch.pk)
    _settle_all()
    clock.advance(40 * 86400)
    kept = prune(timedelta(days=7))
    assert kept.kept_for_batches == 2 and Occurrence.objects.filter(batch_id=batch.pk).count() == 2
    kernel.close_batch(batch.pk)
    assert Batch.objects.get().counts == {"succeeded": 2, "dead_letter": 0, "cancelled": 0}
    _settle_all()  # the callback
    clock.advance(40 * 86400)
    gone = prune(timedelta(days=7))
    # The members went, and with them the completed batch; its counts were in the callback.
    assert gone.occurrences == 3 and gone.batches == 1
    assert not Batch.objects.exists()


def test_enqueue_batch_again_returns_the_batch_and_its_members(jobs, clock):
    batch, first = kernel.enqueue_batch("export", _items(3), callback="report", batch_id="nightly")
    again, second = kernel.enqueue_batch("export", _items(3), callback="report", batch_id="nightly")
    assert again.pk == batch.pk and again.size == 3
    assert [row.pk for row, _ in second] == [row.pk for row, _ in first]
    assert all(deduplicated for _, deduplicated in second)
    with pytest.raises(InvalidState, match="takes no more members"):
        kernel.enqueue_batch("export", _items(4), callback="report", batch_id="nightly")
    assert Occurrence.objects.filter(batch_id="nightly").count() == 3


def test_the_status_lists_unfinished_batches_and_a_stalled_one(jobs, clock):
    from datetime import timedelta

    from django_durable_scheduler.housekeeping import ops

    kernel.open_batch("report", batch_id="still-open")
    kernel.enqueue_batch("export", _items(1), callback="report", batch_id="stalled")
    assert ops.collect_status().batches == {"open": 1, "closed": 1}
    # Its member done, but the look after the commit lost (a crash), and no worker sweeping.
    Occurrence.objects.filter(batch_id="stalled").update(
        status=OccurrenceStatus.SUCCEEDED, settled_at=clock()
    )
    clock.advance(600)
    status = ops.collect_status(max_lag=timedelta(seconds=300))
    assert status.stalled_batches == ["stalled"]
    assert any("stalled" in problem for problem in status.problems)
    assert "batches not completed: closed 1, open 1" in ops.format_status(status)
