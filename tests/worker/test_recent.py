"""A starting worker's first claims, sized by what its kinds' recent runs took (read from the
claims' events and the settled rows), not by the slow guess it would otherwise start from."""

from __future__ import annotations

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.worker import Worker, loop
from django_durable_scheduler.worker.pacing import HOLD_AHEAD
from django_durable_scheduler.worker.recent import RecentReading, recent_run_seconds, seed_pacer

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db


def run(clock, rows: int, *, claims: int, held: float, owner: str = "peer") -> None:
    """``rows`` occurrences of kind test.ok, claimed by ``owner`` in ``claims`` equal claims,
    each settled ``held`` seconds after its claim."""
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job(f"ok-{owner}", "test.ok", authority=AUTHORITY)
    for n in range(rows):
        scheduler.enqueue(f"ok-{owner}", scheduled_for=clock(), trigger_key=f"{owner}-{n}")
    for _ in range(claims):
        claimed = scheduler.claim_batch(owner=owner, lease=30, limit=rows // claims, kinds=["test.ok"])
        clock.advance(held)
        outcomes = [{"occurrence_id": o.pk, "fence": o.fence, "outcome": "succeeded"} for o in claimed]
        scheduler.settle_many(outcomes, owner=owner)


def test_nothing_run_recently_says_nothing(clock):
    assert recent_run_seconds(["test.ok"], 8) is None
    assert recent_run_seconds([], 8) is None


def test_a_large_claim_settled_fast_seeds_fast_handlers(clock):
    run(clock, 200, claims=1, held=0.002)
    # 8 threads ran 200 rows in 2 ms: at most 0.08 ms each.
    assert recent_run_seconds(["test.ok"], 8) == pytest.approx(8 * 0.002 / 200)
    assert recent_run_seconds(["test.echo"], 8) is None  # another kind's runs say nothing
    worker = Worker(worker_id="fresh", concurrency=8, kinds=["test.ok"])
    assert worker.pacer.capacity() == 8  # no run timed yet: the slow guess
    seed_pacer(worker.pacer, ["test.ok"], 8, None)
    assert worker.pacer.capacity() == 500  # at the others' pace from its first claim


def test_claims_as_large_as_the_claimers_made_bound_the_run_time(clock):
    run(clock, 200, claims=2, held=5.0)  # slow settles, but 100 rows a claim with 8 threads
    assert recent_run_seconds(["test.ok"], 8) == pytest.approx(8 * HOLD_AHEAD / 100)


def test_small_slow_claims_seed_slow_handlers(clock):
    run(clock, 8, claims=8, held=2.0)
    seconds = recent_run_seconds(["test.ok"], 8)
    assert seconds is not None and seconds >= HOLD_AHEAD  # not fast: no claim-ahead
    worker = Worker(worker_id="fresh", concurrency=8, kinds=["test.ok"])
    seed_pacer(worker.pacer, ["test.ok"], 8, None)
    assert worker.pacer.capacity() == 8


def test_a_worker_seeded_by_its_supervisor_reads_nothing_at_its_start(clock, monkeypatch):
    run(clock, 200, claims=1, held=0.002)
    reads: list[object] = []
    monkeypatch.setattr(loop, "seed_pacer", lambda *args: reads.append(args))
    monkeypatch.setattr(loop, "_listen", lambda *args: None)
    reading = RecentReading(every=10)
    worker = Worker(worker_id="child", concurrency=8, kinds=["test.ok"], retention=False)
    monkeypatch.setattr(worker.pool, "start", lambda: None)
    reading.hand_to(worker.pacer)  # nothing read yet: nothing handed
    assert not worker.pacer.seeded
    reading.read(["test.ok"], 8, None)
    reading.hand_to(worker.pacer)
    assert worker.pacer.capacity() == 500  # the supervisor's reading sizes its first claim
    worker.start()
    assert reads == []  # and it reads nothing of its own
    unseeded = Worker(worker_id="other", concurrency=8, kinds=["test.ok"], retention=False)
    unseeded.pacer.seed(None)  # the supervisor found no recent run: the slow guess, and no read
    assert unseeded.pacer.capacity() == 8 and unseeded.pacer.seeded
