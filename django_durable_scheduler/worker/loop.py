"""The lease-and-dispatch loop behind ``manage.py runscheduler``.

The loop thread does every kernel write of the hot path, in batches: settle the outcomes
that finished since its last turn (one transaction), claim up to the free capacity (one
transaction, which also authorizes what it claims), and hand the runnable ones to
``concurrency`` long-lived handler threads. A turn woken for new work claims before it
settles, so that the new work does not wait for the settle. A heartbeat thread renews the leases of
everything held (each before a third of it has passed) until it is settled. Handlers for
kinds this process has not registered are never claimed (with a DurableBackend that takes
any queue name, the queues of the stored task jobs are registered at the start and each sweep).

The parts, each with its own module: the claim and what it holds (:mod:`.claims`), the runs
held (:mod:`.runs`), the handler threads with their deadlines and timeouts (:mod:`.pool`),
the lease renewal (:mod:`.heartbeat`), the settle and what is logged, measured and
signalled about each outcome (:mod:`.outcomes`),
and how much to claim and how long to wait (:mod:`.pacing`). This module is the loop.

Between turns the loop sleeps until the next due slot, a finished handler, a wake-up or the
poll interval. A wake-up (NOTIFY, or a datagram on SQLite: see :mod:`..db.wakeup`) is latched
until the next claim starts, so one that comes in while the loop is busy (settling,
claiming, materializing, or with no free slot) is acted on by the next turn that can claim.

A run that passes its timeout is failed and settled like any failure; when every handler
thread is stuck in a handler so, the worker stops and ``run()`` returns EXIT_STUCK for its
supervisor to restart it (see :mod:`.pool`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from django.db import DatabaseError, connections

from .. import conf, kernel
from ..db import dialect, wakeup
from ..db.dialect import alias_for, lock_waited
from ..db.wakeup import first_line
from ..handlers import registry
from ..housekeeping.retention.thread import RetentionThread
from ..models import Occurrence
from ..tasks.handlers import any_queue, stored_queue_kinds
from ..telemetry import metrics
from .claims import Claimer
from .heartbeat import Heartbeat
from .outcomes import OutcomeReporter
from .pacing import ClaimPacer, claim_ahead
from .pool import EXIT_STUCK, HandlerPool, tidy_connections
from .recent import seed_pacer
from .runs import Held, log_fields

__all__ = ["EXIT_STUCK", "Waker", "Worker", "claim_ahead", "default_worker_id", "log_fields"]

logger = logging.getLogger("django_durable_scheduler")

# How long a finished outcome may wait for others before the loop settles it (seconds).
GATHER = 0.01


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _listen(
    using: str | None, announce: Callable[[], None], poll_interval: float, stays: bool
) -> tuple[wakeup.Listener | wakeup.SocketListener, threading.Thread] | None:
    """Start the ``dsch-listen`` thread that calls ``announce`` on each wake-up, where the
    database has wake-ups, the settings want them and the worker ``stays`` (not --once or
    --burst); returns it with its listener."""
    listener = wakeup.listener(alias_for(using), announce, logger)
    if not conf.settings.LISTEN and listener.supported:
        logger.info("wake-ups off (DURABLE_SCHEDULER_LISTEN = False): polling every %.2f s", poll_interval)
    elif listener.supported and stays and listener.open():
        thread = threading.Thread(target=listener.run, name="dsch-listen", daemon=True)
        thread.start()
        return listener, thread
    return None


def _log_preparation(alias: str) -> None:
    """Say once whether psycopg prepares the loop's statements, which decides what a claim
    costs on PostgreSQL (docs/scaling.md, "Prepared statements")."""
    threshold = dialect.prepare_threshold(alias)
    if threshold is not None:
        logger.info("database '%s': psycopg prepares statements run %d times", alias, threshold)
    elif connections[alias].vendor == "postgresql":
        logger.info(
            "database '%s': statements go as text (see `manage.py check --deploy --tag durable_scheduler`)",
            alias,
        )


def _after_database_error(exc: DatabaseError, failures: int, stopping: threading.Event) -> None:
    """What the loop does after its ``failures``-th database error in a row: the first is most
    often a connection the server or a pooler ended (a restart, ``pg_terminate_backend``), which
    a new one replaces at once, so one line and no wait; from the second, a back-off."""
    connections.close_all()
    if failures == 1:
        logger.warning("database error in the scheduler loop (%s); retrying at once", first_line(exc))
        return
    delay = min(30.0, 0.5 * 2 ** min(failures - 1, 6))
    logger.exception("database error in the scheduler loop; retrying in %.1f s", delay)
    stopping.wait(delay)


def _stop_listening(
    listener: tuple[wakeup.Listener | wakeup.SocketListener, threading.Thread] | None,
) -> None:
    """Stop the wake-up listener and wait for its thread."""
    if listener is None:
        return
    listening, thread = listener
    listening.stop()
    thread.join(timeout=5)


class Waker:
    """What ends the loop's sleep: ``event`` (set by ``ring()``: a finished handler, stop(), a
    deadline) and the wake-up ``announce()`` latches until a claim starts (``claiming()``)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._announced = threading.Event()

    def ring(self) -> None:
        """The loop has something to do: end its sleep."""
        self.event.set()

    def announce(self) -> None:
        """The listener's callback: new work was committed. Latched until the next claim
        starts, so it is not lost if it comes while the loop is busy or has no free slot."""
        self._announced.set()
        self.event.set()

    @property
    def announced(self) -> bool:
        return self._announced.is_set()

    def claiming(self) -> None:
        """A claim starts reading: what was announced so far, it sees."""
        self._announced.clear()

    def sleep(
        self,
        timeout: float,
        *,
        busy: Callable[[], bool],
        can_claim: Callable[[], bool],
        limit: Callable[[float], float] = lambda timeout: timeout,
    ) -> None:
        """Sleep up to ``limit(timeout)`` seconds, unless or until the next turn has something
        to do: ``busy()``, or a wake-up that ``can_claim()``. The event is cleared before the
        state is read: whatever sets it afterwards ends the sleep, and whatever came before
        is seen in the state."""
        self.event.clear()
        if not (busy() or (self.announced and can_claim())):
            self.event.wait(limit(timeout))

    def gather(self, held: Held, capacity: int, stopping: threading.Event) -> None:
        """Once a handler has finished, wait up to GATHER seconds for others still running,
        until half of ``capacity`` has finished: then one settle (and the claim after it)
        serves them all, instead of one loop turn per finished handler. A wake-up ends the
        wait: new work is not kept waiting for a settle."""
        deadline = time.monotonic() + GATHER
        while True:
            self.event.clear()
            holding, finished = held.counts()
            executing = holding - finished
            if not finished or executing <= 0 or 2 * finished >= capacity:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stopping.is_set() or self.announced:
                return
            self.event.wait(remaining)


class StopOnSignal:
    """SIGTERM and SIGINT for a worker: the first one calls ``stop`` (running handlers get
    the grace period), a second one exits the process at once, unless ``second_exits`` is
    False (a supervised worker: its supervisor stops it hard with SIGKILL)."""

    def __init__(self, stop: Callable[[], None], grace: float) -> None:
        self._stop = stop
        self._grace = grace
        self._received = 0
        self.second_exits = True
        self._pipe: tuple[int, int] | None = None  # (read, write), see _on_signal

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._pipe is None:
            read, write = os.pipe()
            os.set_blocking(write, False)
            self._pipe = (read, write)
            threading.Thread(target=self._handle, name="dsch-signals", daemon=True).start()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM/SIGINT handler. Python runs it in the main thread between two of that
        thread's steps, which may be inside ``Event.wait`` or ``Event.clear`` holding the
        event's lock: stopping from here (which sets the loop's wake-up event) would wait
        forever on a lock its own thread holds. So it takes no lock: it writes the signal to
        a pipe, and the ``dsch-signals`` thread logs it and stops the worker."""
        if self._pipe is not None:
            with contextlib.suppress(OSError):  # a full pipe: the thread has signals to read
                os.write(self._pipe[1], bytes([signum]))

    def _handle(self) -> None:
        """The ``dsch-signals`` thread: the first signal stops the worker (running handlers
        get the grace period), a second one exits at once."""
        assert self._pipe is not None
        while True:
            for signum in os.read(self._pipe[0], 64):
                self._received += 1
                if self._received > 1 and not self.second_exits:
                    logger.info("signal %s: already stopping", signal.Signals(signum).name)
                    continue
                if self._received > 1:
                    logger.warning("second signal: exiting at once; unfinished leases will expire")
                    os._exit(1)
                logger.info("signal %s: stopping (grace %.1f s)", signal.Signals(signum).name, self._grace)
                self._stop()


@dataclass
class Turn:
    """What one turn of the loop did."""

    asked: int = 0  # how many its claim asked for (0: it did not claim)
    claimed: int = 0  # how many the claim returned (runnable or refused)
    held: int = 0  # how many the worker held at its end
    drained: bool = False  # it claimed none, held none, and nothing is due

    @property
    def empty(self) -> bool:
        """It claimed and got nothing, while holding nothing."""
        return bool(self.asked) and not self.claimed and not self.held

    @property
    def held_elsewhere(self) -> bool:
        """Its claim came back empty while work is due: other claimers hold it."""
        return self.empty and not self.drained


class Worker:
    """One scheduler process. ``run()`` returns the process exit code."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int = 8,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        kinds: list[str] | None = None,
        once: bool = False,
        burst: bool = False,
        max_occurrences: int | None = None,
        grace: float = 30.0,
        using: str | None = None,
        retention: bool = True,
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.lease = lease
        self.poll_interval = poll_interval
        self.requested_kinds = kinds
        self.once = once
        self.burst = burst
        self.max_occurrences = max_occurrences
        self.grace = grace
        self.using = using
        self.instruments = metrics.get()  # None without the [otel] extra: nothing is measured
        self.waker = Waker()
        self.held = Held(self.waker.ring)
        self.pacer = ClaimPacer(
            concurrency=concurrency,
            lease=lease,
            poll_interval=poll_interval,
            once=once,
            max_occurrences=max_occurrences,
        )
        self.pool = HandlerPool(
            concurrency=concurrency,
            held=self.held,
            wake=self.waker.ring,
            learn=self.pacer.learn,
            sender=Worker,
            worker_id=self.worker_id,
            instruments=self.instruments,
        )
        self.reporter = OutcomeReporter(
            held=self.held, worker_id=self.worker_id, sender=Worker, using=using, instruments=self.instruments
        )
        self.claimer = Claimer(
            worker_id=self.worker_id,
            lease=lease,
            using=using,
            held=self.held,
            pool=self.pool,
            reporter=self.reporter,
        )
        self.heartbeat = Heartbeat(
            worker_id=self.worker_id, held=self.held, lease=lease, concurrency=concurrency, using=using
        )
        # Retention (DURABLE_SCHEDULER_RETENTION) on a thread of its own, in workers that stay
        # (--once and --burst exit before a run would be due); False leaves it to others.
        self.retention = RetentionThread(self.worker_id, using) if retention else None
        self._stopping = threading.Event()
        self._signals = StopOnSignal(self.stop, grace)
        self.claimed_kinds: list[str] = []
        self._any_queue = any_queue()  # a DurableBackend takes any queue: look for new ones
        self._listener: tuple[wakeup.Listener | wakeup.SocketListener, threading.Thread] | None = None
        self._exit_code = 0

    @property
    def processed(self) -> int:
        """How many occurrences this worker settled, refused or gave back."""
        return self.held.processed

    @property
    def stopping(self) -> bool:
        """True once stop() was called (or a signal or stuck threads stopped the worker)."""
        return self._stopping.is_set()

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop claiming; running handlers get ``grace`` seconds to finish."""
        self._stopping.set()
        self.waker.ring()

    def install_signal_handlers(self, *, second_exits: bool = True) -> None:
        """SIGTERM/SIGINT: the first one stops the worker (running handlers get the grace
        period), a second one exits at once (with ``second_exits``). Only from the main thread."""
        self._signals.second_exits = second_exits
        self._signals.install()

    def kinds(self) -> list[str]:
        return claimable_kinds(self.requested_kinds, self.using, stored_queues=self._any_queue)

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        self.start()
        failures = 0
        while not self._stopping.is_set():
            try:
                turn = self.turn()
                failures = 0
            except DatabaseError as exc:
                failures += 1
                _after_database_error(exc, failures, self._stopping)
                continue
            finally:  # its row and thread once the first turn is done: that claim waits for neither
                if not self.heartbeat.started:
                    self.heartbeat.start(self.claimed_kinds)
            if turn is None or self._last(turn):
                break
            if turn.claimed and turn.claimed >= turn.asked and len(self.held) < self._capacity():
                # A full batch: there may be more due work, claim again at once. A short one
                # means nothing else was claimable just now; claiming again at once would
                # only keep the GIL from the handler threads starting what was claimed.
                continue
            idle = self.pacer.idle_wait(time.monotonic(), lambda: kernel.next_due_at(using=self.using))
            if self.claimer.throttled_until is not None:  # work over a rate starts at its turn
                idle = min(idle, self.claimer.throttle_wait(conf.now()) or 0.0)
            self._sleep(self.pacer.wait(idle, held_elsewhere=turn.held_elsewhere))
            self.waker.gather(self.held, self._capacity(), self._stopping)
        self.shutdown()
        return self._exit_code

    def start(self) -> None:
        """What :meth:`run` does before its first turn: the kinds settled and logged, the
        claim pace seeded (unless a supervisor seeded it), the wake-up listener, the handler
        threads and the retention thread started. The worker row comes after the first turn."""
        kinds = self.claimed_kinds = self.kinds()
        logger.info(
            "worker %s: concurrency %d, lease %.1f s, kinds %s",
            self.worker_id,
            self.concurrency,
            self.lease,
            kinds,
        )
        _log_preparation(alias_for(self.using))
        if not self.pacer.seeded:  # a supervisor may have read it for all its workers
            seed_pacer(self.pacer, kinds, self.concurrency, self.using)
        # Listening before the first heartbeat: a worker that shows as started already hears
        # the wake-ups of enqueues made from then on.
        stays = not (self.once or self.burst)
        self._listener = _listen(self.using, self.waker.announce, self.poll_interval, stays)
        self.pool.start()
        if stays and self.retention is not None:
            self.retention.start()

    def turn(self) -> Turn | None:
        """One turn of :meth:`run`'s loop over ``claimed_kinds``: settle and claim (claim first
        when woken for new work); None when every handler thread is stuck (the worker gives up)."""
        turn = Turn()
        started = time.monotonic()
        lock_waited()  # from now on: what this turn waits for SQLite's write lock
        tidy_connections()
        self.pool.expire()
        if self.pool.all_stuck():
            self._give_up()
            return None
        free = self._free()
        # Woken for new work with a slot free: claim it first, then settle what finished and
        # look after the schedules. Their leases are held meanwhile; the new work would
        # otherwise wait for the settle's transaction before its own claim.
        woken = self.waker.announced and free > 0
        if not woken:
            self.reporter.flush()
            free = self._free()
            self._maintain()
        if free > 0 and self.claimed_kinds:
            turn.asked = self.pacer.batch(free)
            # Cleared before the claim reads: a wake-up from now on gets another turn.
            self.waker.claiming()
            turn.claimed = len(self.claim(turn.asked, self.claimed_kinds))
            if turn.claimed:
                self.pacer.turn_took(time.monotonic() - started, turn.claimed, lock_waited())
            turn.held = len(self.held)
            if turn.empty:
                # Empty may mean "locked by another claimer", not "nothing due".
                turn.drained = not kernel.has_due(kinds=self.claimed_kinds, using=self.using)
        if woken:
            self.reporter.flush()
            self._maintain()
        turn.held = len(self.held)
        return turn

    def _last(self, turn: Turn) -> bool:
        """Whether the worker stops after ``turn``: --once, --max-occurrences reached (both
        finish what they hold first), or --burst with nothing left to do."""
        if self.once or self.pacer.done(held=len(self.held), processed=self.processed):
            drain(self, None)
            return True
        return self.burst and turn.empty and turn.drained

    def _give_up(self) -> None:
        """Every handler thread is stuck: settle what finished (the timeouts among it), give
        the other leases back, and stop with EXIT_STUCK so a supervisor restarts the process."""
        self._exit_code = self.pool.give_up()
        self._stopping.set()

    def _maintain(self) -> None:
        """Materialize the jobs' due slots; dead-letter expired leases and complete the batches
        whose completion a crash left unlooked-for, each on its own period."""
        materialize, sweep = self.pacer.upkeep(time.monotonic())
        if materialize:
            kernel.materialize_due(using=self.using)
        if sweep:
            kernel.dead_letter_expired(using=self.using)
            kernel.complete_due_batches(using=self.using)
        if sweep and self._any_queue:
            self.claimed_kinds = self.kinds()

    def _capacity(self) -> int:
        return self.pacer.capacity(self.pool.stuck)

    def _free(self) -> int:
        return self.pacer.free(held=len(self.held), processed=self.processed, stuck=self.pool.stuck)

    def _sleep(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, or until the first run's deadline, unless or until
        there are outcomes to settle, the worker stops, or a wake-up comes with a free slot."""
        self.waker.sleep(
            timeout,
            busy=lambda: bool(self.held.finished) or self._stopping.is_set(),
            can_claim=lambda: bool(self.claimed_kinds) and self._free() > 0,
            limit=self.pool.sleep_limit,
        )
        self.pool.awake()

    def shutdown(self) -> None:
        """After the last turn: finish or give back what is held, stop threads, record the stop."""
        # Stuck: no thread is left to finish anything; settle what has finished, no more.
        drain(self, 0 if self._exit_code == EXIT_STUCK else self.grace)
        self.pool.drop_queued()
        self.reporter.give_back(self.held.runs(), "after the grace period")
        self.pool.stop()
        _stop_listening(self._listener)
        if self.retention is not None:
            self.retention.stop()
        self.heartbeat.stop()
        connections.close_all()

    # ------------------------------------------------------------------ claiming

    def claim(self, limit: int, kinds: list[str]) -> list[Occurrence]:
        """Claim and authorize up to ``limit`` occurrences of ``kinds`` and hand the runnable
        ones to the handler threads (:meth:`.claims.Claimer.claim`)."""
        return self.claimer.claim(limit, kinds)


def claimable_kinds(requested: list[str] | None, using: str | None, *, stored_queues: bool) -> list[str]:
    """The kinds registered in this process, those of ``requested`` only (None: all); with
    ``stored_queues`` (a DurableBackend takes any queue name), the queues of the task jobs
    stored are registered first, so a queue first used after the start is run too."""
    if stored_queues:
        stored_queue_kinds(using)
    local = registry.registered_kinds()
    if requested is None:
        return local
    return [kind for kind in local if kind in set(requested)]


def drain(worker: Worker, timeout: float | None) -> None:
    """Settle what ``worker`` has pending until it holds nothing (or ``timeout``): how it
    finishes, for --once, --max-occurrences and a stop's grace period."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        worker.waker.event.clear()  # before the state is read, as in Waker.sleep
        worker.pool.expire()
        if worker.pool.all_stuck() and worker._exit_code != EXIT_STUCK:
            worker._give_up()  # what is left to run never will: settle, give up the rest
            deadline = time.monotonic()
        try:
            worker.reporter.flush()
        except DatabaseError:
            logger.exception("database error while finishing the running occurrences; retrying")
            connections.close_all()
            time.sleep(0.5)
        if not worker.held:
            return
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        wait = 0.5 if remaining is None else min(0.5, remaining)
        due = worker.pool.next_deadline()
        if due is not None:
            wait = max(0.0, min(wait, due - time.monotonic()))
        worker.waker.event.wait(wait)
