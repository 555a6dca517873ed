"""How much a worker claims and how long it waits between turns.

Pure arithmetic on what the loop tells it (handler run times, turn times, what is held,
the next due slot): no database, no threads, so every rule here is checked with plain numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError

from .. import conf

# How often the loop looks for due schedule slots and for expired final attempts (seconds):
# each check is one cheap query, but not one per claim.
MATERIALIZE_EVERY = 0.2
SWEEP_EVERY = 1.0
# Handlers that take less than this on average (seconds) are "fast": the loop then claims
# ahead (see claim_ahead), so that each turn's settle and claim transactions are
# shared by that many more occurrences: for handlers of a millisecond or less the loop's
# per-turn cost, not the handlers, bounds the rate. Slow handlers get no claim-ahead: rows
# waiting behind them would be rows other workers could run.
FAST_HANDLER = 0.05
# The least queued work (seconds per handler thread) a fast worker holds; it holds more when
# its turns take longer (TURNS_AHEAD of them), so the threads do not run dry before the next
# claim, and never more than it gets through (its handlers and its loop's share of a turn per
# row) in LEASE_SHARE of the lease.
HOLD_AHEAD = 0.05
TURNS_AHEAD = 2
LEASE_SHARE = 0.25
# An empty claim while work is due means other claimers hold those rows (SKIP LOCKED) or
# cannot yet take them: the loop looks again after this, doubling up to the poll interval,
# rather than idling a whole poll interval with nothing running (nothing would wake it).
LOCKED_RETRY = 0.02


def claim_ahead(
    *,
    concurrency: int,
    handler_seconds: float,
    turn_seconds: float,
    lease: float,
    max_batch: int,
    row_seconds: float = 0.0,
) -> int:
    """How many occurrences a worker holds at once (running or queued for a handler thread).

    ``concurrency`` for slow handlers. For fast ones, as many as the threads run in the
    longer of HOLD_AHEAD and TURNS_AHEAD of the loop's recent turns, so that a worker with
    one thread batches as much as its handlers' speed allows, not a fixed multiple of its
    thread count; and no more than the worker gets through in LEASE_SHARE of its lease, each
    row costing its handler's share of the threads and ``row_seconds`` of the loop (its share
    of a turn's settle and claim), so that what a worker holds is settled long before its
    lease needs the heartbeat. At most ``max_batch`` (MAX_CLAIM_BATCH).
    """
    if handler_seconds >= FAST_HANDLER:
        return concurrency
    horizon = min(max(HOLD_AHEAD, TURNS_AHEAD * turn_seconds), LEASE_SHARE * lease)
    per_thread = horizon / max(handler_seconds, 1e-6)
    through = LEASE_SHARE * lease / max(handler_seconds / concurrency + row_seconds, 1e-6)
    return max(concurrency, min(int(concurrency * per_thread), int(through), max_batch))


class ClaimPacer:
    """How many occurrences the next claim asks for, and how long the loop sleeps.

    ``max_batch`` is MAX_CLAIM_BATCH, read from the settings on each use when not given.
    """

    def __init__(
        self,
        *,
        concurrency: int,
        lease: float,
        poll_interval: float,
        once: bool = False,
        max_occurrences: int | None = None,
        max_batch: int | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll_interval
        self.once = once
        self.max_occurrences = max_occurrences
        self._max_batch = max_batch
        self._handler_seconds = 1.0  # moving average of handler run time (starts "slow")
        self._handler_runs = 0
        self.seeded = False  # seed() was called: the recent runs were read for this worker
        self._turn_seconds = 0.0  # moving average of a turn that claimed (settle to authorize)
        self._row_seconds = 0.0  # moving average of such a turn's time per row it claimed
        self._turns = 0
        self._retry_wait = 0.0  # the current back-off while due work is held elsewhere
        self._next_due: tuple[float, datetime | None] | None = None  # (read at, value)
        self._next_materialize = 0.0
        self._next_sweep = 0.0

    @property
    def max_batch(self) -> int:
        return conf.settings.MAX_CLAIM_BATCH if self._max_batch is None else self._max_batch

    def learn(self, seconds: float) -> None:
        """Fold one handler run time into the average that sizes the claim-ahead: the mean
        of the runs so far, then a moving average over about the last 20 (a race between
        threads loses an update at worst). A worker learns its handlers' speed from its
        first few runs, not after the hundred that the slow starting guess would take."""
        self._handler_runs += 1
        self._handler_seconds += (seconds - self._handler_seconds) / min(self._handler_runs, 20)

    def seed(self, seconds: float | None) -> None:
        """Start from ``seconds``, what the kinds' recent runs took (worker/recent.py), counted
        as one run: the worker claims at that pace from its first turn, and its own runs
        take over the average from its second. None: no recent run (the slow guess stays)."""
        self.seeded = True
        if seconds is not None:
            self._handler_seconds = seconds
            self._handler_runs = 1

    def turn_took(self, seconds: float, rows: int = 0, waited: float = 0.0) -> None:
        """Fold the time of a turn that claimed something into its moving average, and that
        time per row claimed (``rows``, when given) less what the turn ``waited`` for a lock
        into the loop's cost per row: the mean of the first turns, then a moving average over
        about the last 10. A wait does not grow with the rows: counted per row, it would
        shrink the batches it does not come from, down to one per thread."""
        self._turn_seconds += (seconds - self._turn_seconds) / 10
        if rows > 0:
            self._turns += 1
            cost = max(seconds - waited, 0.0) / rows
            self._row_seconds += (cost - self._row_seconds) / min(self._turns, 10)

    def capacity(self, stuck: int = 0) -> int:
        """How many occurrences to hold at once (see claim_ahead) while ``stuck`` threads are
        lost to handlers past their timeout; never more than --max-occurrences allows (free
        checks)."""
        threads = self.concurrency - stuck
        if self.once or threads <= 0:
            return max(threads, 0)
        return claim_ahead(
            concurrency=threads,
            handler_seconds=self._handler_seconds,
            turn_seconds=self._turn_seconds,
            lease=self.lease,
            max_batch=self.max_batch,
            row_seconds=self._row_seconds,
        )

    def free(self, *, held: int, processed: int, stuck: int = 0) -> int:
        """How many more occurrences this turn may claim, holding ``held`` and having
        processed ``processed``."""
        free = self.capacity(stuck) - held
        if self.max_occurrences is not None:
            free = min(free, self.max_occurrences - processed - held)
        return free

    def batch(self, free: int) -> int:
        """How many the claim asks for when ``free`` more may be held."""
        return min(free, self.max_batch)

    def done(self, *, held: int, processed: int) -> bool:
        """Whether --max-occurrences is reached (counting what is held)."""
        return self.max_occurrences is not None and processed + held >= self.max_occurrences

    def upkeep(self, now: float) -> tuple[bool, bool]:
        """Whether to materialize the jobs' due slots, and whether to dead-letter expired
        leases, at ``now`` (monotonic): each on its own period, MATERIALIZE_EVERY and
        SWEEP_EVERY; a True answer starts the next period."""
        materialize, sweep = now >= self._next_materialize, now >= self._next_sweep
        if materialize:
            self._next_materialize = now + MATERIALIZE_EVERY
        if sweep:
            self._next_sweep = now + SWEEP_EVERY
        return materialize, sweep

    def idle_wait(
        self, now: float, next_due: Callable[[], datetime | None], clock: Callable[[], datetime] | None = None
    ) -> float:
        """Sleep until the next poll, or sooner when a job's next slot comes first. The
        earliest next fire time (``next_due()``) is read at most every MATERIALIZE_EVERY
        (``now`` is monotonic): a busy loop waits often, and a slot learnt of that much
        later is materialized that much later. While it cannot be read, the poll interval."""
        if self._next_due is None or now - self._next_due[0] >= MATERIALIZE_EVERY:
            try:
                self._next_due = (now, next_due())
            except DatabaseError:
                return self.poll_interval
        due = self._next_due[1]
        if due is None:
            return self.poll_interval
        return max(0.0, min(self.poll_interval, (due - (clock or conf.now)()).total_seconds()))

    def wait(self, idle: float, *, held_elsewhere: bool) -> float:
        """How long to sleep after a turn whose idle wait is ``idle``: when due work is held
        elsewhere, the back-off (from LOCKED_RETRY, doubling up to the poll interval),
        reset by any other turn."""
        if not held_elsewhere:
            self._retry_wait = 0.0
            return idle
        self._retry_wait = min(self.poll_interval, max(LOCKED_RETRY, 2 * self._retry_wait))
        return min(idle, self._retry_wait)
