"""``runscheduler --processes N``: N worker processes under one supervisor.

The supervisor has set Django up, synced the declared jobs and closed its connections; each
worker is a fork of it, so a replacement starts claiming within milliseconds of its
predecessor's death instead of after a fresh interpreter's start-up and ``django.setup()``.
The supervisor runs no thread and holds no connection when it forks (both would be copied
half-way into the child), and reaps its children as SIGCHLD announces their deaths.

- A child that dies (a signal such as SIGKILL, a non-zero exit such as EXIT_STUCK) is replaced
  at once, with one WARNING line; one that keeps dying within QUICK_DEATH of its start is
  replaced after a back-off that doubles up to MAX_BACKOFF, so a broken start-up does not spin.
- The leases a dead child held end at once (``kernel.abandon``): the supervisor knows it can
  write no more, so its occurrences go to the other workers now, not when their leases expire.
  A replacement due at once is forked first and the write made while it starts; one that waits
  out a back-off, after the write.
- What the kinds' recent runs took (worker/recent.py), which sizes a new worker's first
  claims, is read by the supervisor (at its start, then after a death when it found none
  or is RECENT_EVERY old) and handed to each child in the fork, so a child starts claiming without
  a read of its own.
- The first SIGTERM/SIGINT is passed on to every child as SIGTERM (each finishes within its
  grace period); the supervisor exits 0 once they all have, and SIGKILLs those still running
  GRACE_MARGIN after their grace. A second signal SIGKILLs them all at once (exit 1).
- Each child stops gracefully when the supervisor dies: Linux tells it (PR_SET_PDEATHSIG),
  elsewhere it notices its parent changed within a second.
- Each child's worker id is fresh: ``host:pid`` (``--worker-id NAME``: ``NAME:pid``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import DatabaseError, connections

from .. import kernel
from ..db.dialect import is_deadlock
from .loop import Worker
from .recent import RecentReading

logger = logging.getLogger("django_durable_scheduler")

# A child that dies this soon after its start died of its start-up, not of its work: after two
# such deaths in a row its slot waits BACKOFF, doubling up to MAX_BACKOFF, before the next.
QUICK_DEATH = 1.0
BACKOFF = 0.25
MAX_BACKOFF = 10.0
# How long after the children's grace period a stop waits before it SIGKILLs them.
GRACE_MARGIN = 30.0
# How old the supervisor's reading of the recent run times may get before a death has it read
# them again: they change slowly, and deaths may come every second.
RECENT_EVERY = 10.0
# How many times ending a dead child's leases is tried when the database breaks a deadlock.
DEADLOCK_TRIES = 3
STOPS = (signal.SIGTERM, signal.SIGINT)
WATCHED = (*STOPS, signal.SIGCHLD)


@dataclass
class Slot:
    """One of the N places a child runs in, and what its children did."""

    index: int
    pid: int | None = None
    worker_id: str = ""
    started: float = 0.0
    quick_deaths: int = 0  # in a row
    start_at: float | None = None  # when to start the next child (None: not to)
    done: bool = False  # its child finished its --once/--burst/--max-occurrences work
    replacing: list[str] = field(default_factory=list)  # how the last child died, to log
    orphaned: str | None = None  # a dead child's id whose leases end once its replacement is forked


def describe(status: int) -> str:
    """How a child ended, from its wait status: ``killed by SIGKILL`` or ``exited with code 3``."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            return f"killed by signal {signum}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def child_worker_id(base: str | None) -> str:
    """The worker id of a child, fresh for each process: ``host:pid`` or ``base:pid``."""
    return f"{base or socket.gethostname()}:{os.getpid()}"


def die_with_parent(parent: int, stop: Callable[[], None]) -> None:
    """Have ``stop`` called when the process ``parent`` ends: SIGTERM from the kernel on Linux,
    and everywhere a thread that looks every second whether the parent changed."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        logger.warning("supervisor (pid %d) is gone: stopping", parent)
        stop()

    threading.Thread(target=watch, name="dsch-parent", daemon=True).start()


def _abandon(worker_id: str, using: str | None) -> int:
    """``kernel.abandon``, tried again when the database breaks a deadlock: its locks can meet
    a claim's (MariaDB's gap locks), and the loser's transaction is undone whole."""
    for _ in range(DEADLOCK_TRIES - 1):
        try:
            return kernel.abandon(worker_id, using=using)
        except DatabaseError as exc:
            if not is_deadlock(exc):
                raise
    return kernel.abandon(worker_id, using=using)


class Supervisor:
    """Runs ``processes`` children, each ``make_worker(worker_id).run()``; ``run()`` returns
    the supervisor's exit code. ``stopped`` holds the stop signals received so far (the
    command's start-up records them there); ``finite``: a child that exits 0 is done
    (--once, --burst, --max-occurrences), not replaced."""

    def __init__(
        self,
        *,
        processes: int,
        make_worker: Callable[[str], Worker],
        worker_id: str | None,
        grace: float,
        finite: bool,
        stopped: list[int],
        using: str | None = None,
    ) -> None:
        self.slots = [Slot(index) for index in range(processes)]
        self.make_worker = make_worker
        self.base_id = worker_id
        self.grace = grace
        self.finite = finite
        self.stopped = stopped
        self.using = using
        self.signals_seen = 0
        self.stop_deadline: float | None = None
        self.killed = False
        self.recent = RecentReading(RECENT_EVERY)
        self._template: Worker | None = None
        self._pipe = os.pipe()
        for end in self._pipe:
            os.set_blocking(end, False)

    # ------------------------------------------------------------------ the supervisor

    def prepare(self) -> None:
        """Before the first fork: one worker built (its imports done once) and the run times read."""
        self._template = self.make_worker(f"{self.base_id or socket.gethostname()}:{os.getpid()}")
        self._read_recent(self.recent.read)

    def run(self) -> int:
        previous = {signum: signal.signal(signum, self._on_signal) for signum in WATCHED}
        try:
            self.prepare()
            now = time.monotonic()
            for slot in self.slots:
                slot.start_at = now
            self._take_signals(list(self.stopped))  # those that came before the handlers
            while True:
                self._start_due()
                self._end_orphaned()
                self._wait()
                self._reap()
                if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
                    self._kill_all("still running after the grace period")
                if not any(slot.pid or slot.start_at is not None for slot in self.slots):
                    break
            self._end_orphaned()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for end in self._pipe:
                os.close(end)
        return 1 if self.killed else 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        """Only written down: the loop reads the pipe (a handler may run while the loop holds
        a lock, so it takes none)."""
        with contextlib.suppress(OSError):
            os.write(self._pipe[1], bytes([signum]))

    def _wait(self) -> None:
        """Until a signal comes, or the next start or deadline is due."""
        due = [slot.start_at for slot in self.slots if slot.start_at is not None and slot.pid is None]
        if self.stop_deadline is not None:
            due.append(self.stop_deadline)
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        select.select([self._pipe[0]], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            self._take_signals([signum for signum in os.read(self._pipe[0], 256) if signum in STOPS])

    def _take_signals(self, signums: list[int]) -> None:
        for signum in signums:
            self.signals_seen += 1
            name = signal.Signals(signum).name
            if self.signals_seen == 1:
                logger.info("supervisor: signal %s: stopping the workers (grace %.1f s)", name, self.grace)
                self.stop_deadline = time.monotonic() + self.grace + GRACE_MARGIN
                for slot in self.slots:
                    slot.start_at = None
                self._signal_all(signal.SIGTERM)
            elif not self.killed:
                self._kill_all(f"second signal {name}")

    def _signal_all(self, signum: int) -> None:
        for slot in self.slots:
            if slot.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signum)

    def _kill_all(self, why: str) -> None:
        running = [slot.pid for slot in self.slots if slot.pid is not None]
        if running:
            logger.warning("supervisor: %s: killing workers %s; their leases expire", why, running)
        self.killed = True
        self.stop_deadline = None
        self._signal_all(signal.SIGKILL)

    def _reap(self) -> None:
        """Collect every child that ended, and say what comes of its slot."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            slot = next((slot for slot in self.slots if slot.pid == pid), None)
            if slot is not None:
                self._ended(slot, status)

    def _ended(self, slot: Slot, status: int) -> None:
        how = describe(status)
        pid, slot.pid = slot.pid, None
        if slot.orphaned is not None:  # its predecessor's leases, not ended yet
            self._end_orphaned()
        replace = not self.signals_seen and not (status == 0 and self.finite)
        if replace:
            slot.quick_deaths = slot.quick_deaths + 1 if time.monotonic() - slot.started < QUICK_DEATH else 0
        if status != 0 and replace and slot.quick_deaths < 2:  # forked first, then this write
            slot.orphaned = slot.worker_id
        elif status != 0:  # before the clock is read: a back-off starts after this write
            how += self.end_leases(slot.worker_id)
        now = time.monotonic()
        if self.signals_seen:
            level = logging.INFO if status == 0 else logging.WARNING
            logger.log(level, "supervisor: worker %s (pid %s) %s", slot.worker_id, pid, how)
            return
        if status == 0 and self.finite:
            slot.done = True
            logger.info("supervisor: worker %s (pid %s) finished", slot.worker_id, pid)
            return
        delay = 0.0 if slot.quick_deaths < 2 else min(MAX_BACKOFF, BACKOFF * 2 ** (slot.quick_deaths - 2))
        slot.start_at = now + delay
        slot.replacing = [f"worker {slot.worker_id} (pid {pid}) {how}"]
        if delay:
            logger.warning(
                "supervisor: %s, %d times in a row within %.0f s of its start; replacing it in %.2f s",
                slot.replacing[0],
                slot.quick_deaths,
                QUICK_DEATH,
                delay,
            )

    def end_leases(self, worker_id: str) -> str:
        """End a dead child's leases (one transaction, closed before a fork; the recent run
        times read again when RECENT_EVERY old); what to add to its death's log line."""
        try:
            ended = _abandon(worker_id, self.using)
        except DatabaseError as exc:
            connections.close_all()
            return f" (its leases expire on their own: {exc})"
        self._read_recent(self.recent.refresh)  # none yet: the dead child's runs may be the first
        return f", {ended} of its leases ended" if ended else ""

    def _end_orphaned(self) -> None:
        """End the leases of the dead children whose replacements were forked (or are not to
        be, after a stop), and log each death with its replacement."""
        for slot in self.slots:
            if slot.orphaned is None:
                continue
            dead, slot.orphaned = slot.orphaned, None
            how = (slot.replacing.pop() if slot.replacing else f"worker {dead}") + self.end_leases(dead)
            if slot.pid is None:
                logger.warning("supervisor: %s", how)
            else:
                logger.warning("supervisor: %s; replaced by pid %d", how, slot.pid)

    def _read_recent(self, how: Callable[[list[str], int, str | None], None]) -> None:
        """The children's recent run times (``how``: read or refresh), closed before a fork."""
        try:
            if (template := self._template) is not None:
                how(template.kinds(), template.concurrency, template.using)
        finally:
            connections.close_all()

    def _start_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.pid is None and slot.start_at is not None and slot.start_at <= now:
                slot.start_at = None
                self._fork(slot)

    def _fork(self, slot: Slot) -> None:
        """Start a child in ``slot``: no connection is open and no other thread runs in the
        supervisor, and the stop signals stay blocked until the child has its own handlers."""
        connections.close_all()
        others = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
        if others:
            logger.warning("supervisor: forking while threads run: %s", others)
        for handler in logging.getLogger().handlers + logger.handlers:
            handler.flush()
        parent = os.getpid()
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(parent)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)
        slot.pid, slot.started = pid, time.monotonic()
        slot.worker_id = f"{self.base_id or socket.gethostname()}:{pid}"
        if slot.orphaned is not None:
            return  # logged with its predecessor's leases ended (_end_orphaned)
        if slot.replacing:
            logger.warning("supervisor: %s; replaced by pid %d", slot.replacing.pop(), pid)
        else:
            logger.info("supervisor: started worker %s (pid %d)", slot.worker_id, pid)

    # ------------------------------------------------------------------ a child

    def _child(self, parent: int) -> None:
        """The body of a forked child: the supervisor's signal handling undone, its own
        recording stops until the worker's handlers take over; exits with the worker's code."""
        code = 1
        try:
            stops: list[int] = []
            for end in self._pipe:
                os.close(end)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for signum in STOPS:
                signal.signal(signum, lambda signum, _frame: stops.append(signum))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)
            worker = self.make_worker(child_worker_id(self.base_id))
            self.recent.hand_to(worker.pacer)
            worker.install_signal_handlers(second_exits=False)  # the supervisor stops it hard
            die_with_parent(parent, worker.stop)
            if stops or os.getppid() != parent:
                worker.stop()
            code = worker.run()
        except BaseException:
            logger.exception("worker process %d failed", os.getpid())
        finally:
            for handler in logging.getLogger().handlers + logger.handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
