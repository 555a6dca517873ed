"""Settling beside the claim: where the database takes a second writer without either waiting
for the other (:func:`..db.dialect.settles_beside_claims`), the loop hands the finished
outcomes to a thread of its own, with its own connection, and claims while they are settled.
A turn's two round trips and the server's work on them then overlap instead of adding up.

The loop waits for the settle before the turn ends (:meth:`Settler.end`), so everything
after the claim (the sleep, the stop, ``--once``, the grace period) sees what it saw before:
only the claim runs beside a settle. Elsewhere the loop settles, then claims, as it did.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from django.db import connections

from ..db.dialect import alias_for, settles_beside_claims
from .outcomes import OutcomeReporter
from .pool import tidy_connections
from .runs import Run


class Settler:
    """Settles ``reporter``'s finished outcomes, beside the claim where the database allows."""

    def __init__(self, reporter: OutcomeReporter, using: str | None) -> None:
        self.reporter = reporter
        self.using = using
        self._beside: bool | None = None  # known at the first turn, once settings are read
        self._thread: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self.settling = 0  # how many outcomes the settle under way has taken

    @contextmanager
    def beside_the_claim(self) -> Iterator[None]:
        """Settle what has finished while the block (the claim) runs, and wait for it after."""
        self.begin()
        try:
            yield
        finally:
            self.end()

    def begin(self) -> None:
        """Settle every finished outcome: on the settle thread, where the claim may run in the
        meantime, or here and now."""
        if self._beside is None:
            self._beside = settles_beside_claims(alias_for(self.using))
        if not self._beside:
            self.reporter.flush()
            return
        finished = self.reporter.held.take_finished()
        if not finished:
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsch-settle")
        self.settling = len(finished)
        self._pending = self._thread.submit(self._settle, finished)

    def end(self) -> None:
        """Wait for the settle under way; its database error is raised here, in the loop, which
        retries as after any of its own (the outcomes it could not store are pending again)."""
        pending, self._pending = self._pending, None
        self.settling = 0
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """End the settle thread and close its connection."""
        if self._thread is not None:
            self._thread.submit(connections.close_all).result()
            self._thread.shutdown(wait=True)
            self._thread = None

    def _settle(self, finished: list[Run]) -> None:
        tidy_connections()  # a connection that broke in the last settle is opened again
        self.reporter.flush(finished)
