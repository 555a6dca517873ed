"""Claiming and authorizing in one transaction (``claiming.claim_authorized``, what the
worker runs each turn): one commit between a due occurrence and its handler's start, with
the verdicts, budget accounting and fairness of ``claim_batch`` followed by
``authorize_batch``."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler.kernel import claiming
from django_durable_scheduler.kernel.authority import reservations
from django_durable_scheduler.models import AuthorityReservation, AuthorityUsage, Event, Occurrence
from django_durable_scheduler.worker import Worker

from ..conftest import authority_for, snapshot
from ..procs.runner import queue_race, start_racers

pytestmark = pytest.mark.django_db
OWNER = "w-one"


def world(clock):
    """ann (budget of 2 runs, 3 due), bea (no policy, 1 due), cid (4 due, room for all)."""
    for name, runs in (("ann", 2), ("cid", 10)):
        scheduler.set_policy(
            "user", name, capabilities=["reports.send"], window=3600, max_runs=runs, max_units=100
        )
    due = {"ann": 3, "bea": 1, "cid": 4}
    for name, count in due.items():
        scheduler.create_job(f"job-{name}", "reports.send", authority=authority_for(name, "reports.send"))
        for i in range(count):
            scheduler.enqueue(
                f"job-{name}", scheduled_for=clock() - timedelta(seconds=10 - i), trigger_key=f"t{i}"
            )


def principal(row):
    return row.authority["principal"]["id"]


def assert_usage_matches_reservations():
    """Per principal, the usage rows (one per policy revision and window) add up to its
    reservations."""
    for ptype, pid in set(AuthorityUsage.objects.values_list("principal_type", "principal_id")):
        usage = AuthorityUsage.objects.filter(principal_type=ptype, principal_id=pid)
        held = AuthorityReservation.objects.filter(principal_type=ptype, principal_id=pid)
        assert sum(usage.values_list("runs", flat=True)) == held.count()
        assert sum(usage.values_list("units", flat=True)) == sum(held.values_list("units", flat=True))


@pytest.fixture
def commits(monkeypatch):
    """The number of COMMITs the test's connection has sent since the fixture started."""
    count = [0]
    commit = connection.commit

    def counting() -> None:
        count[0] += 1
        commit()

    monkeypatch.setattr(connection, "commit", counting)
    return count


@pytest.mark.django_db(transaction=True)
def test_one_commit_claims_and_authorizes_a_batch(clock, commits):
    world(clock)
    commits[0] = 0
    batch = claiming.claim_authorized(owner=OWNER, lease=60, limit=8)
    assert commits[0] == 1
    assert len(batch.claimed) == 8
    verdicts = {row.pk: (principal(row), result.verdict) for row, result in batch.refused}
    assert sorted(v for v in verdicts.values()) == [("ann", "deferred"), ("bea", "denied")]
    assert sorted(principal(row) for row in batch.runnable) == ["ann", "ann", "cid", "cid", "cid", "cid"]
    assert batch.unpriced == []
    stored = {row.pk: row for row in Occurrence.objects.all()}
    for row in batch.runnable:
        assert stored[row.pk].status == "running" and stored[row.pk].lease_owner == OWNER
        assert stored[row.pk].fence == row.fence == 1
    for pk, (_, verdict) in verdicts.items():
        if verdict == "deferred":  # back in the queue until the window ends, no attempt used
            assert stored[pk].status == "queued" and stored[pk].attempt == 0
            assert stored[pk].available_at == clock().replace(minute=0, second=0, microsecond=0) + timedelta(
                hours=1
            )
        else:
            assert stored[pk].status == "dead_letter" and stored[pk].last_error["reason"] == "policy_required"
    (denied,) = [result for _, result in batch.refused if result.verdict == "denied"]
    assert denied.error["reason"] == "policy_required"
    assert Event.objects.filter(event_type="authority_deferred").count() == 1
    assert Event.objects.filter(event_type="authority_denied").count() == 1
    assert sorted(AuthorityReservation.objects.values_list("occurrence_id", flat=True)) == sorted(
        row.pk for row in batch.runnable
    )
    assert_usage_matches_reservations()


@pytest.mark.django_db(transaction=True)
def test_the_old_path_commits_twice(clock, commits):
    """What one commit replaces: a claim, then an authorization, each committed."""
    world(clock)
    commits[0] = 0
    rows = scheduler.claim_batch(owner=OWNER, lease=60, limit=8, sweep_expired=False)
    reservations.authorize_batch([(row, 1) for row in rows], owner=OWNER)
    assert commits[0] == 2


@pytest.mark.django_db(transaction=True)
def test_the_workers_claim_turn_is_one_commit(clock, commits, registered):
    calls = registered("one.commit")
    scheduler.set_policy("user", "ann", capabilities=["x.run"], window=3600, max_runs=10, max_units=10)
    scheduler.create_job("j", "one.commit", authority=authority_for("ann", "x.run"))
    for i in range(3):
        scheduler.enqueue("j", scheduled_for=clock(), trigger_key=f"t{i}")
    worker = Worker(worker_id=OWNER, concurrency=3)
    commits[0] = 0
    claimed = worker.claim(3, ["one.commit"])
    assert commits[0] == 1
    assert len(claimed) == 3 and worker.pool.queued == 3  # all three handed to the handler threads
    assert AuthorityReservation.objects.filter(status="reserved").count() == 3
    assert calls == []


def test_verdicts_match_claim_then_authorize(clock):
    """The same world through both paths gives the same verdicts per principal."""
    world(clock)
    with transaction.atomic():  # rolled back: the two-step path then gets the same rows
        batch = claiming.claim_authorized(owner=OWNER, lease=60, limit=8)
        one = sorted(
            [(principal(row), "reserved") for row in batch.runnable]
            + [(principal(row), result.verdict) for row, result in batch.refused]
        )
        transaction.set_rollback(True)
    rows = scheduler.claim_batch(owner=OWNER, lease=60, limit=8)
    verdicts = reservations.authorize_many([(row, 1) for row in rows], owner=OWNER)
    two = sorted((principal(row), verdict) for row, verdict in zip(rows, verdicts, strict=True))
    assert one == two


def test_fair_across_principals(clock):
    world(clock)
    first = claiming.claim_authorized(owner=OWNER, lease=60, limit=3)
    assert sorted(principal(row) for row in first.claimed) == ["ann", "bea", "cid"]
    second = claiming.claim_authorized(
        owner=OWNER, lease=60, limit=2, after_principal=first.claimed[-1].principal_key
    )
    assert sorted(principal(row) for row in second.claimed) == ["ann", "cid"]


def test_units_per_kind_and_a_failing_units_function(clock):
    scheduler.set_policy("user", "ann", capabilities=["x.run"], window=3600, max_runs=10, max_units=100)
    for job_id, kind in (("cheap", "k.cheap"), ("dear", "k.dear"), ("broken", "k.broken")):
        scheduler.create_job(job_id, kind, authority=authority_for("ann", "x.run"))
        scheduler.enqueue(job_id, scheduled_for=clock(), trigger_key="t")

    def fails(occurrence):
        raise ValueError("no price")

    units = {"k.cheap": 1, "k.dear": lambda occurrence: 7, "k.broken": fails}
    batch = claiming.claim_authorized(
        owner=OWNER, lease=60, limit=3, units_of=lambda occurrence: units[occurrence.claimed_kind]
    )
    assert sorted(row.job_id for row in batch.runnable) == ["cheap", "dear"]
    ((held, error),) = batch.unpriced
    assert held.job_id == "broken" and error.details["field"] == "units"
    # Still held (the caller settles it as failed), never charged.
    assert Occurrence.objects.get(pk=held.pk).status == "running"
    assert sorted(AuthorityReservation.objects.values_list("units", flat=True)) == [1, 7]
    assert list(AuthorityUsage.objects.values_list("runs", "units")) == [(2, 8)]


def test_a_retry_reuses_its_reservation(clock):
    scheduler.set_policy("user", "ann", capabilities=["x.run"], window=3600, max_runs=1, max_units=10)
    scheduler.create_job("j", "k", authority=authority_for("ann", "x.run"), max_attempts=3)
    occ, _ = scheduler.enqueue("j", scheduled_for=clock(), trigger_key="t")
    (first,) = claiming.claim_authorized(owner=OWNER, lease=60).runnable
    scheduler.settle(
        first.pk, owner=OWNER, fence=first.fence, outcome="failed", error="flaky", retry_at=clock()
    )
    again = claiming.claim_authorized(owner=OWNER, lease=60)
    assert [row.pk for row in again.runnable] == [occ.pk] and again.runnable[0].attempt == 2
    assert list(AuthorityUsage.objects.values_list("runs", flat=True)) == [1]  # no second charge


def test_a_released_attempt_reuses_its_reservation(clock):
    """Release gives the attempt back, not the fence: the next claim takes attempt 1 again at
    fence 2, and still finds the reservation the charged first claim made (a claim looks for
    reservations only at fences above 1). With one run in the budget, a second charge would
    defer it instead."""
    scheduler.set_policy("user", "ann", capabilities=["x.run"], window=3600, max_runs=1, max_units=10)
    scheduler.create_job("j", "k", authority=authority_for("ann", "x.run"), max_attempts=3)
    occ, _ = scheduler.enqueue("j", scheduled_for=clock(), trigger_key="t")
    (first,) = claiming.claim_authorized(owner=OWNER, lease=60).runnable
    assert (first.attempt, first.fence, first.charged_units) == (1, 1, 1)
    scheduler.release(first.pk, owner=OWNER, fence=first.fence)
    again = claiming.claim_authorized(owner=OWNER, lease=60)
    assert [(row.pk, row.attempt, row.fence) for row in again.runnable] == [(occ.pk, 1, 2)]
    assert again.runnable[0].charged_units == 0  # reused
    assert list(AuthorityUsage.objects.values_list("runs", flat=True)) == [1]


def test_nothing_due_is_empty(clock):
    batch = claiming.claim_authorized(owner=OWNER, lease=60, limit=5)
    assert (batch.claimed, batch.runnable, batch.refused, batch.unpriced) == ([], [], [], [])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"units_of": 3}, "units_of"),
        ({"owner": ""}, "owner"),
        ({"lease": 0}, "lease"),
        ({"limit": 0}, "limit"),
        ({"kinds": "k"}, "kinds"),
        ({"after_principal": 5}, "after_principal"),
    ],
)
def test_bad_input_writes_nothing(clock, kwargs, field):
    world(clock)
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as info:
        claiming.claim_authorized(**{"owner": OWNER, "lease": 60, **kwargs})
    assert info.value.details["field"] == field
    assert snapshot() == before


RACERS = 4
QUEUED = 200


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_claimers_and_policy_changes_never_deadlock(settings):
    """Worker processes claiming and authorizing while the policy of the principal they
    serve keeps changing (each change locks the policy row, then that principal's pending
    occurrences): every claim takes the policy rows before the occurrence rows, the order the
    change takes, so neither side is ever aborted as a deadlock victim. The changes run in
    the test's own transaction, where ``set_policy`` does not retry a deadlock but raises it.
    The claimed occurrences are left running: on MariaDB a settle's event insert waits for
    the job row a change holds while holding the occurrence row that change scans, a wait of
    its own that this test is not about."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has one writer at a time and no row locks: no lock order to get wrong")
    policy = queue_race(settings, QUEUED, 10**6)
    budget = {"capabilities": ["x.run"], "window": timedelta(hours=24), "max_units": 10**6}
    procs = start_racers(RACERS, "claim_authorized", policy.revision, "hold")
    changes = 0
    while any(proc.poll() is None for proc in procs):
        with transaction.atomic():
            policy = scheduler.set_policy("user", "racer", max_runs=10**6 - changes % 2, **budget)
        changes += 1
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-6000:]
        lines += [line.split() for line in out.splitlines() if line.strip()]
    assert changes > 1 and policy.revision == changes + 1
    # Each occurrence claimed once and authorized once; a change never came between a claim and its
    # authorization (no policy_stale denials).
    assert Counter(verdict for verdict, _ in lines) == {"reserved": QUEUED}
    assert len({pk for _, pk in lines}) == QUEUED
    assert Occurrence.objects.filter(status="running", attempt=1).count() == QUEUED
    assert AuthorityReservation.objects.filter(status="reserved").count() == QUEUED
    assert_usage_matches_reservations()
