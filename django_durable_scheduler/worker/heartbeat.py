"""The heartbeat: renews the lease of every occurrence a worker holds (every lease/3) until it
is settled, and keeps the worker's row in the workers table fresh (what the status command
lists), on a thread of its own so that a slow turn of the loop never lets a lease expire."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from django.db import DatabaseError, close_old_connections, connections

from .. import conf, kernel
from ..models import WorkerHeartbeat
from .runs import Held

logger = logging.getLogger("django_durable_scheduler")


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

    def start(self, kinds: list[str]) -> None:
        """Record the worker as started (claiming ``kinds``), then beat and renew on the
        ``dsch-heartbeat`` thread."""
        self.kinds = kinds
        self.beat(started=True)
        self._thread = threading.Thread(target=self._run, name="dsch-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread (after its current renewal), then record the worker as stopped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.beat(stopped=True)

    def beat(self, *, started: bool = False, stopped: bool = False) -> None:
        """Upsert this process's row in the workers table (what the status command lists)."""
        now = conf.now()
        values: dict[str, Any] = {"last_seen_at": now}
        if stopped or started:
            values["stopped_at"] = now if stopped else None
        if started:
            values.update(
                hostname=socket.gethostname(),
                pid=os.getpid(),
                concurrency=self.concurrency,
                kinds=self.kinds,
                started_at=now,
            )
        try:
            if started:
                WorkerHeartbeat.objects.using(self.using).update_or_create(
                    worker_id=self.worker_id, defaults=values
                )
            else:
                WorkerHeartbeat.objects.using(self.using).filter(worker_id=self.worker_id).update(**values)
        except DatabaseError:
            logger.warning("could not record the worker heartbeat of %s", self.worker_id)

    def renew_all(self) -> None:
        """Renew the lease of everything held, all in one kernel call; a lease found lost is
        marked on its context (unless the run was merely settled in the meantime), and so is
        a cancel requested for the attempt (the renewal reads it back: no query of its own).
        A database error leaves every lease to the next renewal, a third of a lease later."""
        runs = self.held.runs()
        if not runs:
            return
        # Of two attempts of one occurrence (its worker reclaimed it), only the newer can hold.
        fences: dict[str, int] = {}
        for run in runs:
            fences[run.occurrence.pk] = max(run.occurrence.fence, fences.get(run.occurrence.pk, 0))
        began = time.monotonic()  # the renewed leases end no sooner than a lease after this
        try:
            renewals = kernel.renew_many(
                list(fences.items()), owner=self.worker_id, lease=self.lease, using=self.using
            )
        except DatabaseError:
            logger.warning("heartbeat could not renew %d leases; will retry", len(runs))
            close_old_connections()
            return
        for run in runs:
            pk, fence = run.occurrence.pk, run.occurrence.fence
            if pk in renewals.renewed and fences[pk] == fence:
                run.lease_until = max(run.lease_until, began + self.lease)
                if pk in renewals.cancel_requested:
                    run.context.mark_cancel_requested()
            elif self.held.holds(pk, fence):  # not merely settled in the meantime
                run.context.mark_lease_lost()

    def _run(self) -> None:
        """Renew running leases every lease/3, and beat the worker row at least every 10 s."""
        lease_every = max(0.05, self.lease / 3)
        tick = min(lease_every, 10.0)
        last_renew = time.monotonic()
        while not self._stop.wait(tick):
            try:
                # Leases first: the worker row can wait behind other writers, a lease cannot.
                if time.monotonic() - last_renew >= lease_every - tick / 2:
                    last_renew = time.monotonic()
                    self.renew_all()
                self.beat()
            except Exception:
                # The heartbeat must outlive anything one renewal throws, or every lease expires.
                logger.exception("heartbeat error; continuing")
                close_old_connections()
        connections.close_all()
