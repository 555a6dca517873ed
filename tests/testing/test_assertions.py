"""``enqueued()``, ``assert_enqueued()`` and ``assert_not_enqueued()``: what waits to run, by
job, kind, payload, time, unique key, trigger key and batch; a failure lists what is there."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import testing

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(frozen):
    scheduler.create_job("invoices", "billing.send")
    scheduler.create_job("reports", "reports.send")
    scheduler.create_job("summary", "reports.summary")
    scheduler.enqueue(
        "invoices", scheduled_for=frozen.now, trigger_key="order:1", payload={"order": 1, "to": {"a": 1}}
    )
    scheduler.enqueue(
        "invoices",
        scheduled_for=frozen.now + timedelta(hours=1),
        trigger_key="order:2",
        payload={"order": 2},
        unique_key="customer-2",
    )
    batch, _ = scheduler.enqueue_batch(
        "reports", [{"scheduled_for": frozen.now, "trigger_key": "r1", "payload": None}], callback="summary"
    )
    return batch


def test_filters_pick_what_waits(queue, frozen):
    assert len(testing.enqueued()) == 3
    assert [o.trigger_key for o in testing.enqueued(job="invoices")] == ["order:1", "order:2"]
    assert [o.job_id for o in testing.enqueued(kind="reports.send")] == ["reports"]
    assert [o.trigger_key for o in testing.enqueued(payload={"order": 2})] == ["order:2"]
    assert testing.enqueued(payload={"order": 1}) == []  # equal means the whole payload
    assert [o.trigger_key for o in testing.enqueued(payload_contains={"to": {"a": 1}})] == ["order:1"]
    later = frozen.now + timedelta(hours=1)
    assert [o.trigger_key for o in testing.enqueued(scheduled_for=later)] == ["order:2"]
    assert [o.trigger_key for o in testing.enqueued(unique_key="customer-2")] == ["order:2"]
    assert [o.trigger_key for o in testing.enqueued(batch=queue)] == ["r1"]
    assert [o.trigger_key for o in testing.enqueued(batch=queue.batch_id, payload=None)] == ["r1"]
    job = scheduler.get_job("invoices")
    assert len(testing.enqueued(job=job, trigger_key="order:1")) == 1


def test_assert_enqueued_returns_the_matches_and_counts(queue):
    (occurrence,) = testing.assert_enqueued(job="invoices", payload_contains={"order": 1}, count=1)
    assert occurrence.payload == {"order": 1, "to": {"a": 1}}
    testing.assert_enqueued(kind="billing.send", count=2)
    testing.assert_not_enqueued(job="reports", payload_contains={"order": 1})
    testing.assert_enqueued(job="nobody", count=0)


def test_a_failing_assertion_lists_what_is_enqueued(queue):
    with pytest.raises(AssertionError) as failed:
        testing.assert_enqueued(job="invoices", payload_contains={"order": 3})
    message = str(failed.value)
    assert "expected something enqueued matching job='invoices', payload_contains={'order': 3}" in message
    assert "found 0; enqueued (3):" in message
    assert "invoices (billing.send) queued" in message and "unique_key='customer-2'" in message
    assert f"batch={queue.batch_id}" in message
    with pytest.raises(AssertionError, match=r"expected 1 enqueued matching kind='billing\.send', found 2"):
        testing.assert_enqueued(kind="billing.send", count=1)
    with pytest.raises(
        AssertionError, match=r"expected nothing enqueued matching job='reports', found 1:\n  reports"
    ):
        testing.assert_not_enqueued(job="reports")


def test_only_waiting_work_counts_unless_a_status_is_asked_for(queue, frozen, handle):
    handle("reports.send")(lambda ctx: "sent")
    testing.drain(kinds=["reports.send"])
    testing.assert_not_enqueued(job="reports")
    testing.assert_enqueued(job="reports", status="succeeded", count=1)
    testing.assert_enqueued(job="summary", count=1)  # the batch's callback
    testing.assert_enqueued(status=["queued", "succeeded"], count=4)


def test_nothing_enqueued_says_so(db):
    with pytest.raises(AssertionError, match="found 0; nothing is enqueued"):
        testing.assert_enqueued()
