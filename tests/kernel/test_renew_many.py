"""Renewing everything a worker holds at once: one UPDATE (and on MariaDB one SELECT) and one
insert of the events, however many leases; fenced as a single renewal is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Event, Occurrence

pytestmark = pytest.mark.django_db

OWNER = "w"


def claimed(clock, n: int, *, owner: str = OWNER, lease: float = 30, first: int = 0) -> list[Occurrence]:
    """``n`` occurrences of job-a claimed by ``owner``."""
    scheduler.enqueue_many(
        "job-a", [{"scheduled_for": clock(), "trigger_key": f"t{i}"} for i in range(first, first + n)]
    )
    return kernel.claim_batch(owner=owner, lease=lease, limit=n)


def leases(rows):
    return [(row.pk, row.fence) for row in rows]


def expiry(row):
    return Occurrence.objects.get(pk=row.pk).lease_expires_at


def test_extends_every_lease_held_and_records_each_renewal(job, clock):
    rows = claimed(clock, 3)
    clock.advance(20)
    renewals = kernel.renew_many(leases(rows), owner=OWNER, lease=30)
    assert renewals.renewed == {row.pk for row in rows}
    assert renewals.cancel_requested == set()
    assert {expiry(row) for row in rows} == {clock() + timedelta(seconds=30)}
    events = Event.objects.filter(event_type="occurrence_renewed")
    assert sorted(events.values_list("occurrence_id", "owner_id", "fence", "job_id")) == sorted(
        (row.pk, OWNER, row.fence, "job-a") for row in rows
    )
    wanted = scheduler.history(occurrence_id=rows[0].pk)[0]
    assert wanted.data["leaseExpiresAt"].startswith(
        (clock() + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S")
    )


def test_the_same_events_as_renew(job, clock):
    one, other = claimed(clock, 2)
    clock.advance(5)
    kernel.renew(one.pk, owner=OWNER, fence=one.fence, lease=40)
    kernel.renew_many([(other.pk, other.fence)], owner=OWNER, lease=40)
    single, batched = (
        Event.objects.get(event_type="occurrence_renewed", occurrence_id=row.pk) for row in (one, other)
    )
    for name in ("event_type", "job_id", "owner_id", "fence", "data", "occurred_at"):
        assert getattr(single, name) == getattr(batched, name), name


def test_a_lease_not_held_is_reported_and_left_alone(job, clock):
    mine, stale, theirs, settled, expired = claimed(clock, 5, lease=10)
    # theirs: another owner holds it (reclaimed after expiry); expired: nobody took it yet.
    Occurrence.objects.filter(pk=theirs.pk).update(lease_owner="other")
    kernel.settle(settled.pk, owner=OWNER, fence=settled.fence, outcome="succeeded")
    Occurrence.objects.filter(pk=expired.pk).update(lease_expires_at=clock() - timedelta(seconds=1))
    before = {row.pk: Occurrence.objects.get(pk=row.pk) for row in (stale, theirs, settled, expired)}
    asked = [(mine.pk, mine.fence), (stale.pk, stale.fence + 1), *leases([theirs, settled, expired])]
    renewals = kernel.renew_many(asked, owner=OWNER, lease=60)
    assert renewals.renewed == {mine.pk}
    assert expiry(mine) == clock() + timedelta(seconds=60)
    for pk, row in before.items():
        now = Occurrence.objects.get(pk=pk)
        assert (now.status, now.lease_owner, now.fence, now.lease_expires_at, now.updated_at) == (
            row.status,
            row.lease_owner,
            row.fence,
            row.lease_expires_at,
            row.updated_at,
        )
    assert list(
        Event.objects.filter(event_type="occurrence_renewed").values_list("occurrence_id", flat=True)
    ) == [mine.pk]


def test_never_shortens_a_lease(job, clock):
    (row,) = claimed(clock, 1, lease=60)
    clock.advance(5)
    assert kernel.renew_many(leases([row]), owner=OWNER, lease=10).renewed == {row.pk}
    assert expiry(row) == row.lease_expires_at  # a 60 s lease not cut to 15
    event = Event.objects.get(event_type="occurrence_renewed")
    assert event.data["leaseExpiresAt"] == scheduler.history(occurrence_id=row.pk)[0].data["leaseExpiresAt"]
    assert kernel.renew_many(leases([row]), owner=OWNER, lease=120).renewed == {row.pk}
    assert expiry(row) == clock() + timedelta(seconds=120)


def test_a_cancel_requested_comes_back(job, clock):
    asked, left = claimed(clock, 2)
    kernel.cancel(asked.pk)
    renewals = kernel.renew_many(leases([asked, left]), owner=OWNER, lease=30)
    assert renewals.renewed == {asked.pk, left.pk}
    assert renewals.cancel_requested == {asked.pk}


def statements(clock, n: int, first: int) -> int:
    rows = claimed(clock, n, first=first)
    with CaptureQueriesContext(connection) as queries:
        assert len(kernel.renew_many(leases(rows), owner=OWNER, lease=30).renewed) == n
    for row in rows:
        kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome="succeeded")
    return len(queries)


def test_a_bounded_number_of_statements_however_many_are_held(job, clock):
    one = statements(clock, 1, first=0)
    many = statements(clock, 200, first=1)
    # The events go by bulk_create, which splits them where Django's bound on one statement's
    # parameters says (999 on SQLite before Django 6: 200 events are two statements there).
    per_statement = (connection.features.max_query_params or 65535) // 7
    assert many - one == (200 - 1) // per_statement
    assert one <= 5  # savepoint, write lock (SQLite), UPDATE, SELECT (MariaDB), INSERT, release


def test_nothing_held_is_no_statement(job, clock):
    with CaptureQueriesContext(connection) as queries:
        assert kernel.renew_many([], owner=OWNER, lease=30) == kernel.Renewals(set(), set())
    assert not queries


def test_chunks_cover_every_lease(job, clock, monkeypatch):
    from django_durable_scheduler.kernel import leases as module

    monkeypatch.setattr(module, "RENEW_CHUNK", 2)
    rows = claimed(clock, 5)
    clock.advance(10)
    assert kernel.renew_many(leases(rows), owner=OWNER, lease=30).renewed == {row.pk for row in rows}
    assert {expiry(row) for row in rows} == {clock() + timedelta(seconds=30)}


def test_bad_arguments_are_refused(job, clock):
    (row,) = claimed(clock, 1)
    for bad in ({"owner": ""}, {"lease": 0}):
        args = {"owner": OWNER, "lease": 30, **bad}
        with pytest.raises(scheduler.InvalidArgument):
            kernel.renew_many(leases([row]), **args)
    with pytest.raises(scheduler.InvalidArgument):
        kernel.renew_many([(row.pk, 0)], owner=OWNER, lease=30)
