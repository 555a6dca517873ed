"""Fair claims across separate calls: ``claim()`` and a ``claim_batch`` without a cursor of
its own continue the round-robin after the principal of the newest claim in the event log,
the same rule the batched claim applies within one call (``docs/design.md``, "Fair claiming")."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.kernel.candidates import last_claimed_principal
from django_durable_scheduler.kernel.claim_sql import CURSOR_EVENTS
from django_durable_scheduler.models import Event
from django_durable_scheduler.rules.authority import Principal

from ..conftest import authority_for

pytestmark = pytest.mark.django_db


def backlog(clock, counts: dict[str, int]) -> None:
    """One job per principal; ``counts[p]`` due occurrences each. The first principal's are
    the earliest due, so a claim that ignored fairness would serve it until it ran out."""
    for offset, (pid, count) in enumerate(counts.items()):
        scheduler.create_job(f"job-{pid}", "k", authority=authority_for(pid, "x.run"))
        for n in range(count):
            at = clock() - timedelta(hours=1) + timedelta(minutes=10 * offset, seconds=n)
            scheduler.enqueue(f"job-{pid}", scheduled_for=at, trigger_key=f"t{n}")


def principal_of(row) -> str:
    return row.authority["principal"]["id"]


def test_successive_claims_go_round_the_principals(clock):
    backlog(clock, {"a": 6, "b": 2, "c": 2})
    got = []
    while (row := scheduler.claim(owner="w", lease=60)) is not None:
        got.append(principal_of(row))
    assert got == ["a", "b", "c", "a", "b", "c", "a", "a", "a", "a"]


def test_claims_of_several_owners_share_one_rotation(clock):
    # The cursor is in the database, not in the caller: owners taking turns continue it.
    backlog(clock, {"a": 4, "b": 2, "c": 2})
    got = [principal_of(scheduler.claim(owner=f"w{n % 3}", lease=60)) for n in range(6)]
    assert got == ["a", "b", "c", "a", "b", "c"]


def test_settling_between_claims_keeps_the_rotation(clock):
    backlog(clock, {"a": 3, "b": 3, "c": 1})
    got = []
    while (row := scheduler.claim(owner="w", lease=60)) is not None:
        got.append(principal_of(row))
        scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    assert got == ["a", "b", "c", "a", "b", "a", "b"]


def test_single_and_batched_claims_follow_the_same_rule(clock):
    """One batch of n takes what n single claims take, in the same order, and a single
    claim after a batch continues where the batch ended."""
    counts = {"a": 5, "b": 3, "c": 1, "d": 2}
    backlog(clock, counts)
    singles = [scheduler.claim(owner="w", lease=60) for _ in range(7)]
    single_order = [principal_of(row) for row in singles]
    assert single_order == ["a", "b", "c", "d", "a", "b", "d"]
    # The same backlog again, under other job ids, claimed in one batch after the same cursor.
    for row in singles:
        scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    rest = scheduler.claim_batch(owner="w", lease=60, limit=100)
    for row in rest:
        scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    assert [principal_of(row) for row in rest] == ["a", "b", "a", "a"]
    Event.objects.all().delete()  # no claim history: the next rotation starts afresh
    for offset, (pid, count) in enumerate(counts.items()):
        for n in range(count):
            at = clock() - timedelta(minutes=50) + timedelta(minutes=10 * offset, seconds=n)
            scheduler.enqueue(f"job-{pid}", scheduled_for=at, trigger_key=f"again{n}")
    batch = scheduler.claim_batch(owner="w", lease=60, limit=7)
    assert [principal_of(row) for row in batch] == single_order
    # The next single claim continues the rotation after the batch's last principal (d).
    assert principal_of(scheduler.claim(owner="w", lease=60)) == "a"
    assert principal_of(scheduler.claim(owner="w", lease=60)) == "b"


def test_a_cursor_of_the_callers_own_takes_precedence(clock):
    backlog(clock, {"a": 2, "b": 2, "c": 2})
    assert principal_of(scheduler.claim(owner="w", lease=60)) == "a"
    after_c = Principal.of(authority_for("c")).key
    (row,) = scheduler.claim_batch(owner="w", lease=60, limit=1, after_principal=after_c)
    assert principal_of(row) == "a"


def test_the_cursor_is_the_newest_claim(clock):
    backlog(clock, {"a": 1, "b": 1})
    assert last_claimed_principal("default") is None
    first = scheduler.claim(owner="w", lease=60)
    assert last_claimed_principal("default") == first.principal_key
    second = scheduler.claim(owner="w", lease=60)
    assert principal_of(second) == "b" and last_claimed_principal("default") == second.principal_key
    # A reclaim counts as a claim too (both leases expired: the rotation comes to a again).
    clock.advance(61)
    reclaimed = scheduler.claim(owner="w2", lease=60)
    assert (principal_of(reclaimed), reclaimed.attempt) == ("a", 2)
    assert Event.objects.order_by("-pk").first().event_type == "occurrence_reclaimed"
    assert last_claimed_principal("default") == reclaimed.principal_key


def test_a_claim_older_than_the_cursor_window_is_forgotten(clock):
    backlog(clock, {"a": 3, "b": 1})
    assert principal_of(scheduler.claim(owner="w", lease=60)) == "a"
    # More events than the cursor looks through (a bulk enqueue of a later slot range).
    scheduler.create_job("filler", "other", authority=authority_for("z", "x.run"))
    scheduler.enqueue_many(
        "filler",
        [
            {"scheduled_for": clock() + timedelta(days=1, seconds=n), "trigger_key": f"f{n}"}
            for n in range(CURSOR_EVENTS)
        ],
    )
    assert last_claimed_principal("default") is None
    # Without a cursor, principals come in the order their earliest work became due.
    assert principal_of(scheduler.claim(owner="w", lease=60)) == "a"
    assert principal_of(scheduler.claim(owner="w", lease=60)) == "b"


def _strand(clock, principal: str, lease: float) -> str:
    """One occurrence of ``principal``, due now, claimed with a ``lease`` its owner never
    renews (a killed worker): returns its id."""
    scheduler.create_job(f"job-{principal}", "k", authority=authority_for(principal, "x.run"))
    scheduler.enqueue(f"job-{principal}", scheduled_for=clock(), trigger_key="stranded")
    (row,) = scheduler.claim_batch(owner="killed", lease=lease, limit=1)
    return row.pk


def test_a_reclaim_ranks_by_when_it_first_became_due(clock):
    """A killed worker's row comes back in the place it first had, not at its lease's
    expiry: before the rows that became due after it, though they became due before the
    lease expired."""
    stranded = _strand(clock, "a", lease=30)
    for n in range(3):  # due 10, 11 and 12 s after it, all before its lease expires
        at = clock() + timedelta(seconds=10 + n)
        scheduler.enqueue("job-a", scheduled_for=at, trigger_key=f"later{n}")
    clock.advance(31)
    rows = scheduler.claim_batch(owner="w", lease=60, limit=2)
    assert rows[0].pk == stranded
    assert (rows[0].status, rows[0].attempt, rows[0].fence) == ("running", 2, 2)
    assert rows[1].scheduled_for == clock() - timedelta(seconds=21)


def test_a_principal_with_a_reclaim_ranks_by_its_first_due_time(clock):
    """Without claim history, principals come in the order their earliest work became due:
    for a reclaim, when the stranded row first became due."""
    stranded = _strand(clock, "a", lease=30)
    scheduler.create_job("job-b", "k", authority=authority_for("b", "x.run"))
    scheduler.enqueue("job-b", scheduled_for=clock() + timedelta(seconds=5), trigger_key="b")
    clock.advance(31)
    Event.objects.all().delete()  # no cursor: the rotation starts by due time
    (row,) = scheduler.claim_batch(owner="w", lease=60, limit=1)
    assert row.pk == stranded
    assert principal_of(scheduler.claim(owner="w", lease=60)) == "b"
