"""kernel.record_progress: a running handler's progress stored on its occurrence, by the
lease's holder at its fence only, with bad input refused naming the field and nothing
written (docs/design.md, "Progress")."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_durable_scheduler import kernel
from django_durable_scheduler.exceptions import InvalidArgument, LeaseLost
from django_durable_scheduler.models import Occurrence

from ..conftest import CLOCK_START, snapshot

LEASE = 30


@pytest.fixture
def running(job, clock):
    kernel.enqueue("job-a", scheduled_for=CLOCK_START, trigger_key="p")
    (row,) = kernel.claim_batch(owner="w1", lease=LEASE, limit=1, sweep_expired=False)
    return row


def test_a_report_is_stored_with_the_fence_of_the_attempt(running):
    stored = kernel.record_progress(
        running.pk, owner="w1", fence=running.fence, done=40, total=100, note="rows"
    )
    assert stored.describe() == "40 / 100 (40%) rows"
    row = Occurrence.objects.get(pk=running.pk)
    assert row.progress == {"done": 40, "total": 100, "note": "rows", "fence": running.fence}
    assert row.status == "running"


def test_a_later_report_replaces_the_last_one(running):
    held = {"owner": "w1", "fence": running.fence}
    kernel.record_progress(running.pk, done=1, total=3, note="first", **held)
    kernel.record_progress(running.pk, done=2.5, **held)
    assert Occurrence.objects.get(pk=running.pk).progress == {
        "done": 2.5,
        "total": None,
        "note": None,
        "fence": running.fence,
    }


def test_a_write_by_a_stale_fence_is_refused_and_writes_nothing(running, clock):
    held = {"owner": "w1", "fence": running.fence}
    kernel.record_progress(running.pk, done=5, total=10, **held)
    clock.advance(LEASE + 1)  # the lease expired: another worker reclaims it
    (again,) = kernel.claim_batch(owner="w2", lease=LEASE, limit=1, sweep_expired=False)
    assert again.fence == running.fence + 1
    kernel.record_progress(again.pk, owner="w2", fence=again.fence, done=1, total=10)
    before = snapshot()
    with pytest.raises(LeaseLost) as refused:
        kernel.record_progress(running.pk, done=9, total=10, **held)
    assert refused.value.details["reason"] == "wrong_owner"
    with pytest.raises(LeaseLost) as refused:
        kernel.record_progress(running.pk, owner="w2", fence=running.fence, done=9, total=10)
    assert refused.value.details["reason"] == "wrong_fence"
    assert snapshot() == before
    assert Occurrence.objects.get(pk=running.pk).progress["done"] == 1


def test_an_expired_lease_or_a_settled_occurrence_is_refused(running, clock):
    held = {"owner": "w1", "fence": running.fence}
    clock.advance(LEASE + 1)
    with pytest.raises(LeaseLost) as refused:
        kernel.record_progress(running.pk, done=1, **held)
    assert refused.value.details["reason"] == "lease_expired"
    clock.advance(-LEASE - 1)
    kernel.settle(running.pk, outcome="succeeded", **held)
    with pytest.raises(LeaseLost) as refused:
        kernel.record_progress(running.pk, done=1, **held)
    assert refused.value.details["reason"] == "not_running"
    with pytest.raises(LeaseLost) as refused:
        kernel.record_progress("occ-missing", done=1, **held)
    assert refused.value.details["reason"] == "not_found"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"done": -1}, "done"),
        ({"done": "3"}, "done"),
        ({"done": None}, "done"),
        ({"done": True}, "done"),
        ({"done": float("nan")}, "done"),
        ({"done": 5, "total": 4}, "total"),
        ({"done": 1, "total": -2}, "total"),
        ({"done": 1, "total": "10"}, "total"),
        ({"done": 1, "note": "x" * 201}, "note"),
        ({"done": 1, "note": 7}, "note"),
        ({"done": 1, "note": "line\nbreak"}, "note"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(running, kwargs, field):
    before = snapshot()
    with pytest.raises(InvalidArgument) as refused:
        kernel.record_progress(running.pk, owner="w1", fence=running.fence, **kwargs)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")
    assert snapshot() == before


def test_bad_input_is_refused_before_the_lease_is_looked_at(db):
    """Nothing is read for a report that could never be stored."""
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidArgument):
        kernel.record_progress("occ-x", owner="w1", fence=1, done=-1)
    assert not queries.captured_queries


def test_a_report_is_one_update_in_its_transaction(running):
    with CaptureQueriesContext(connection) as queries:
        kernel.record_progress(running.pk, owner="w1", fence=running.fence, done=1, total=2)
    sql = [q["sql"] for q in queries.captured_queries]
    assert [s for s in sql if s.startswith("UPDATE")] and not [s for s in sql if s.startswith("SELECT")], sql
    assert sum(s.startswith("UPDATE") for s in sql) == 1
