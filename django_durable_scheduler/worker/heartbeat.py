"""The heartbeat: renews the lease of every occurrence a worker holds until it is settled (each
before a third of it has passed), and keeps the worker's row in the workers table fresh (what
the status command lists), on a thread of its own so that a slow turn of the loop never lets a
lease expire."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DatabaseError, OperationalError, close_old_connections, connections

from .. import conf, kernel
from ..db.dialect import alias_for
from .runs import Held, Run

logger = logging.getLogger("django_durable_scheduler")

T = TypeVar("T")

# The thread looks at what it holds every LOOK of the lease and renews each lease that would be
# a third of it old by the next look: however late in a tick a run was claimed, it is renewed
# before a third of its lease has passed, and one just claimed or renewed is left alone.
LOOK = 1 / 12
RENEW_AGE = 1 / 3 - LOOK
# The worker row is beaten this often (seconds, within the lease's third): often enough for the
# status command (a worker is stale after a minute), and not a write per look.
BEAT_EVERY = (1.0, 10.0)
# On SQLite the heartbeat's connection asks for the write lock in tries of this long (ms), again
# and again, rather than through SQLite's busy handler, whose waits between tries grow to 100 ms:
# against writers that ask again at once (three workers' loops draining a pool) it would wait
# for its turn for longer than a short lease lasts.
SQLITE_TRY_MS = 5


class Heartbeat:
    """Renews the leases of ``held`` for ``worker_id`` and beats its worker row."""

    def __init__(
        self,
        *,
        worker_id: str,
        held: Held,
        lease: float,
        concurrency: int,
        using: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.held = held
        self.lease = lease
        self.concurrency = concurrency
        self.kinds: list[str] = []  # what the worker claims, recorded on its row at the start
        self.using = using
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._expires: dict[tuple[str, int], datetime] = {}  # (id, fence): renewed until, at least
        self._tuned: Any = None  # the SQLite connection made to try for the lock (_try_for_the_lock)
        self._tries = False
        self._beaten = time.monotonic()  # when the worker row was last beaten
        self._beat_due = False  # the next renewal beats it too (see _renew)
        # Whether the worker row is written: until then every beat writes it whole (a first
        # write that failed, SQLite's lock under load, would leave later UPDATEs nothing to find).
        self._recorded = False
        self._started_at: datetime | None = None

    def start(self, kinds: list[str]) -> None:
        """Record the worker as started (claiming ``kinds``), then beat and renew on the
        ``dsch-heartbeat`` thread."""
        self.kinds = kinds
        self.beat(started=True)
        self._thread = threading.Thread(target=self._run, name="dsch-heartbeat", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        """End the thread (after its current renewal), then record the worker as stopped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.beat(stopped=True)

    def beat(self, *, started: bool = False, stopped: bool = False, until: float | None = None) -> None:
        """Write this process's row in the workers table (what the status command lists): whole
        at the start and until a write of it succeeded, else only when it was last seen (and
        stopped); on the thread, on SQLite, trying for the write lock until ``until`` (monotonic)."""
        now = conf.now()
        if started:
            self._started_at = now
        try:
            if started or not self._recorded:
                record = kernel.WorkerRecord(
                    worker_id=self.worker_id,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    concurrency=self.concurrency,
                    kinds=self.kinds,
                    started_at=self._started_at or now,
                )
                self._in_turn(
                    lambda: kernel.record_worker(record, at=now, stopped=stopped, using=self.using), until
                )
                self._recorded = True
            else:
                self._in_turn(
                    lambda: kernel.beat_worker(self.worker_id, at=now, stopped=stopped, using=self.using),
                    until,
                )
            self._beaten = time.monotonic()
        except DatabaseError:
            logger.warning("could not record the worker heartbeat of %s", self.worker_id)

    def renew_due(self) -> None:
        """Renew the held leases that are RENEW_AGE of the lease old or more (as far as this
        thread knows: since their claim or its last renewal of them), in one kernel call."""
        now = conf.now()
        renew_before = now + timedelta(seconds=self.lease * (1 - RENEW_AGE))
        known: dict[tuple[str, int], datetime] = {}
        due: list[Run] = []
        for run in self.held.runs():
            key = (run.occurrence.pk, run.occurrence.fence)
            expires = self._expires.get(key) or run.occurrence.lease_expires_at
            if expires is not None:
                known[key] = expires
            if expires is None or expires <= renew_before:
                due.append(run)
        self._expires = known  # what is no longer held is forgotten
        if due:
            first = min(known.get((run.occurrence.pk, run.occurrence.fence)) or now for run in due)
            self.renew_all(due, until=time.monotonic() + (first - now).total_seconds())

    def renew_all(self, runs: list[Run] | None = None, *, until: float | None = None) -> None:
        """Renew the leases of ``runs`` (everything held, by default), all in one kernel call;
        a lease found lost is marked on its context (unless the run was merely settled in the
        meantime), and so is a cancel requested for the attempt (the renewal reads it back:
        no query of its own). A database error leaves them to the next look; on SQLite, the
        thread tries for the write lock until ``until`` (monotonic: when the first would
        expire) first."""
        runs = self.held.runs() if runs is None else runs
        if not runs:
            return
        # Of two attempts of one occurrence (its worker reclaimed it), only the newer can hold.
        fences: dict[str, int] = {}
        for run in runs:
            fences[run.occurrence.pk] = max(run.occurrence.fence, fences.get(run.occurrence.pk, 0))
        asked, began = conf.now(), time.monotonic()  # renewed leases end a lease after these, at least
        try:
            renewals = self._in_turn(
                lambda: self._renew(list(fences.items())),
                until,
            )
        except DatabaseError:
            logger.warning("heartbeat could not renew %d leases; will retry", len(runs))
            close_old_connections()
            return
        expires = asked + timedelta(seconds=self.lease)  # at the least
        for run in runs:
            pk, fence = run.occurrence.pk, run.occurrence.fence
            if pk in renewals.renewed and fences[pk] == fence:
                self._expires[pk, fence] = expires
                run.lease_until = max(run.lease_until, began + self.lease)
                if pk in renewals.cancel_requested:
                    run.context.mark_cancel_requested()
            elif self.held.holds(pk, fence):  # not merely settled in the meantime
                run.context.mark_lease_lost()

    def _renew(self, leases: list[tuple[str, int]]) -> kernel.Renewals:
        """``kernel.renew_many``; when the worker row is due a beat, ``kernel.renew_and_beat``
        beats it in the same transaction: one commit, and no write of its own to wait for
        while leases are held."""
        if not self._beat_due:
            return kernel.renew_many(leases, owner=self.worker_id, lease=self.lease, using=self.using)
        renewals = kernel.renew_and_beat(leases, owner=self.worker_id, lease=self.lease, using=self.using)
        self._beaten = time.monotonic()
        return renewals

    def _in_turn(self, write: Callable[[], T], until: float | None) -> T:
        """``write``, tried again while SQLite's write lock is taken (a busy error, which the
        thread's connection gives after SQLITE_TRY_MS), until ``until`` (monotonic)."""
        while True:
            try:
                return write()
            except OperationalError as exc:
                if not self._tries or until is None or time.monotonic() >= until or "locked" not in str(exc):
                    raise
            time.sleep(SQLITE_TRY_MS / 1000)

    def _try_for_the_lock(self) -> None:
        """On SQLite, make this thread's connection try for the write lock in SQLITE_TRY_MS
        tries (once per connection it opens): ``_in_turn`` tries again."""
        connection = connections[alias_for(self.using)]
        if connection.vendor != "sqlite":
            return
        connection.ensure_connection()
        if connection.connection is not self._tuned:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {SQLITE_TRY_MS}")
                # Its commits never run the WAL's checkpoint (other connections' do), which
                # copies the log into the database file and may take seconds on a busy disk.
                cursor.execute("PRAGMA wal_autocheckpoint = 0")
            self._tuned = connection.connection
            self._tries = True

    def _run(self) -> None:
        """Look at the held leases every LOOK of the lease and renew those due; beat the
        worker row every third of the lease, within BEAT_EVERY: in a renewal's transaction
        while leases are held (alone if none came for a second period), else alone."""
        beat_every = min(max(BEAT_EVERY[0], self.lease / 3), BEAT_EVERY[1])
        look = min(max(0.01, self.lease * LOOK), beat_every)
        while not self._stop.wait(look):
            try:
                self._try_for_the_lock()
                # A row not yet written is written alone, whole (see beat), not in a renewal.
                self._beat_due = self._recorded and time.monotonic() - self._beaten >= beat_every
                self.renew_due()
                late = time.monotonic() - self._beaten - (beat_every if len(self.held) else 0.0)
                if late >= beat_every or not self._recorded:
                    self.beat(until=time.monotonic() + look)
            except Exception:
                # The heartbeat must outlive anything one renewal throws, or every lease expires.
                logger.exception("heartbeat error; continuing")
                close_old_connections()
        connections.close_all()
