"""The claim pacer, with plain numbers: how many occurrences a worker claims, and how long its
loop waits (no database, no threads)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError

from django_durable_scheduler.worker.pacing import (
    HOLD_AHEAD,
    LOCKED_RETRY,
    MATERIALIZE_EVERY,
    SWEEP_EVERY,
    ClaimPacer,
    claim_ahead,
)


def pacer(**kw) -> ClaimPacer:
    kw.setdefault("concurrency", 4)
    kw.setdefault("lease", 30.0)
    kw.setdefault("poll_interval", 1.0)
    kw.setdefault("max_batch", 500)
    return ClaimPacer(**kw)


def test_claim_ahead_follows_the_handlers_speed_from_the_first_runs():
    paced = pacer()
    assert paced.capacity() == 4  # nothing run yet: no claim-ahead
    paced.learn(0.001)
    # 1 ms handlers: HOLD_AHEAD (50 ms) of work per thread (the average is 1 ms give or
    # take a float's last digit, hence the range).
    assert 4 * 49 <= paced.capacity() <= 4 * 50
    for _ in range(40):
        paced.learn(0.5)  # the handlers became slow: no claim-ahead
    assert paced.capacity() == 4
    for _ in range(3):
        paced.learn(0.0)
    assert paced.capacity() == 4  # a few fast runs move a long average only part of the way
    for _ in range(200):
        paced.learn(0.0099)
    assert paced.capacity() == 4 * 5  # 50 ms / 9.9 ms, rounded down


def test_claim_ahead_is_sized_by_the_work_not_by_the_thread_count():
    def ahead(concurrency=1, handler=0.001, turn=0.0, lease=30.0, max_batch=500):
        sizes = {"handler_seconds": handler, "turn_seconds": turn, "lease": lease, "max_batch": max_batch}
        return claim_ahead(concurrency=concurrency, **sizes)

    assert ahead(concurrency=3, handler=0.05) == 3, "slow handlers: no claim-ahead"
    assert ahead(concurrency=3, handler=2.0, turn=5.0) == 3
    # One thread and near-instant handlers: as large a batch as MAX_CLAIM_BATCH allows.
    assert ahead(handler=0.00002) == 500
    assert ahead(handler=0.00002, max_batch=64) == 64
    assert ahead(handler=0.0, max_batch=64) == 64
    # HOLD_AHEAD of work per thread, or TURNS_AHEAD turns of it when turns take longer.
    assert ahead(handler=0.001) == round(HOLD_AHEAD / 0.001)
    assert ahead(handler=0.001, turn=0.1) == 200
    assert ahead(concurrency=4, handler=0.001, turn=0.1) == 500
    # Never more than a quarter of the lease of queued work per thread.
    assert ahead(handler=0.001, turn=10.0, lease=0.4) == 100
    assert ahead(handler=0.001, turn=10.0, lease=0.4, concurrency=2) == 200
    # Never fewer than one per thread.
    assert ahead(concurrency=6, handler=0.049, lease=0.01) == 6


def test_a_worker_holds_no_more_than_its_loop_gets_through_in_a_quarter_of_the_lease():
    def ahead(handler=0.0, row=0.0, lease=1.0, concurrency=4):
        return claim_ahead(
            concurrency=concurrency,
            handler_seconds=handler,
            turn_seconds=10.0,
            lease=lease,
            max_batch=500,
            row_seconds=row,
        )

    assert ahead() == 500, "a loop that costs nothing per row: MAX_CLAIM_BATCH"
    assert ahead(row=0.001) == 250  # 250 ms of the lease at 1 ms a row
    assert ahead(row=0.001, handler=0.004) == 125  # and 1 ms of handler time per thread
    assert ahead(row=0.001, lease=30.0) == 500
    assert ahead(row=1.0) == 4, "never fewer than one per thread"


def test_the_loop_cost_per_row_leaves_out_its_waits_for_the_lock():
    paced = pacer(concurrency=4, lease=1.0)
    paced.learn(0.0)
    paced.turn_took(0.04, 4)
    assert paced.capacity() == 25, "250 ms of the lease at 10 ms a row"
    for _ in range(80):
        paced.turn_took(0.04 + 2.0, 40, waited=2.0)  # long waits for SQLite's write lock
    assert 245 <= paced.capacity() <= 250, "1 ms a row once the waits are left out"


def test_slow_turns_make_fast_workers_hold_more():
    paced = pacer(concurrency=1)
    paced.learn(0.001)
    assert 49 <= paced.capacity() <= 50  # 1 ms, give or take a float's last digit
    for _ in range(30):
        paced.turn_took(0.1)  # two turns of 100 ms: 200 ms of work per thread
    assert 190 <= paced.capacity() <= 200


def test_stuck_threads_and_once_shrink_the_capacity():
    paced = pacer(concurrency=4)
    assert [paced.capacity(stuck) for stuck in (0, 1, 3, 4, 5)] == [4, 3, 1, 0, 0]
    paced.learn(0.001)
    assert 3 * 49 <= paced.capacity(1) <= 3 * 50
    once = pacer(concurrency=4, once=True)
    once.learn(0.001)
    assert once.capacity() == 4, "--once claims one per thread, never ahead"


def test_free_slots_count_what_is_held_and_max_occurrences():
    paced = pacer(concurrency=4)
    assert paced.free(held=0, processed=0) == 4
    assert paced.free(held=3, processed=100) == 1
    assert paced.free(held=1, processed=0, stuck=2) == 1
    limited = pacer(concurrency=4, max_occurrences=5)
    assert limited.free(held=0, processed=3) == 2
    assert limited.free(held=1, processed=3) == 1
    assert not limited.done(held=1, processed=3)
    assert limited.done(held=2, processed=3) and limited.done(held=0, processed=5)
    assert not paced.done(held=10**6, processed=10**6)


def test_a_claim_asks_for_at_most_max_batch(settings):
    assert pacer(max_batch=64).batch(100) == 64
    assert pacer(max_batch=64).batch(3) == 3
    settings.DURABLE_SCHEDULER_MAX_CLAIM_BATCH = 7
    assert pacer(max_batch=None).batch(100) == 7, "without max_batch: the setting, read on use"


def test_work_held_elsewhere_backs_off_doubling_up_to_the_poll_interval():
    paced = pacer(poll_interval=0.1)
    waits = [paced.wait(1.0, held_elsewhere=True) for _ in range(5)]
    assert waits == [LOCKED_RETRY, 2 * LOCKED_RETRY, 4 * LOCKED_RETRY, 0.1, 0.1]
    assert paced.wait(0.05, held_elsewhere=True) == 0.05, "never past the idle wait"
    assert paced.wait(0.7, held_elsewhere=False) == 0.7
    assert paced.wait(1.0, held_elsewhere=True) == LOCKED_RETRY, "any other turn resets the back-off"


def test_the_idle_wait_is_the_poll_or_the_next_slot_read_at_most_every_materialize_period():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    reads: list[datetime | None] = [now + timedelta(seconds=0.3)]

    def next_due() -> datetime | None:
        return reads[-1]

    paced = pacer(poll_interval=1.0)
    assert paced.idle_wait(100.0, next_due, clock=lambda: now) == pytest.approx(0.3)
    reads.append(None)  # the slot was materialized: no next one
    assert paced.idle_wait(100.0 + MATERIALIZE_EVERY / 2, next_due, clock=lambda: now) == pytest.approx(0.3)
    assert paced.idle_wait(100.0 + MATERIALIZE_EVERY, next_due, clock=lambda: now) == 1.0
    reads.append(now - timedelta(seconds=5))  # overdue: no wait
    assert paced.idle_wait(101.0, next_due, clock=lambda: now) == 0.0
    reads.append(now + timedelta(hours=1))  # far off: the poll interval
    assert paced.idle_wait(102.0, next_due, clock=lambda: now) == 1.0

    def down() -> datetime | None:
        raise OperationalError("the database does not answer")

    assert paced.idle_wait(103.0, down, clock=lambda: now) == 1.0


def test_upkeep_runs_each_task_on_its_own_period():
    paced = pacer()
    assert paced.upkeep(10.0) == (True, True)
    assert paced.upkeep(10.0 + MATERIALIZE_EVERY / 2) == (False, False)
    assert paced.upkeep(10.0 + MATERIALIZE_EVERY) == (True, False)
    assert paced.upkeep(10.0 + SWEEP_EVERY) == (True, True)
