"""What a worker holds: each attempt it claimed, from its claim until it is settled.

The handler pool runs them, the heartbeat renews their leases and the outcome reporter
settles them; :class:`Held` is the one record all three share. An attempt is an occurrence at
a fence: a worker that stalled past its lease may reclaim its own row and hold two attempts
of one occurrence at once (docs/design.md, "Stranded work and second runs").
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ..handlers import registry
from ..models import Occurrence
from ..rules.authority import Principal
from ..rules.outcomes import Outcome
from .context import ExecutionContext, ProgressSink


def log_fields(occurrence: Occurrence, kind: str, **more: Any) -> dict[str, Any]:
    """The ``extra`` of this worker's log records about ``occurrence``: ``scheduler_*``
    attributes on the LogRecord (a prefix no LogRecord attribute has), for logging
    integrations that index them."""
    return {
        "scheduler_occurrence_id": occurrence.pk,
        "scheduler_job_id": occurrence.job_id,
        "scheduler_kind": kind,
        "scheduler_attempt": occurrence.attempt,
        "scheduler_max_attempts": occurrence.max_attempts,
        "scheduler_principal": Principal.label_of(occurrence.authority),
        **{f"scheduler_{key}": value for key, value in more.items()},
    }


def timeout_of(occurrence: Occurrence, default: float | None) -> float | None:
    """The run's timeout in seconds: the job's, else its handler's, else ``default``."""
    ms = occurrence.claimed_timeout_ms
    if ms is None:
        handler = registry.get_handler(occurrence.claimed_kind or "")
        ms = handler.timeout_ms if handler is not None else None
    return default if ms is None else ms / 1000


class Run:
    """A claimed occurrence, from its claim until it is settled (or given up)."""

    def __init__(
        self,
        occurrence: Occurrence,
        context: ExecutionContext,
        timeout: float | None,
        lease_until: float = math.inf,
    ) -> None:
        self.occurrence = occurrence
        self.context = context
        self.started = time.monotonic()
        # When the lease ends (monotonic), as far as this worker knows: the claim's expiry,
        # moved on by each renewal. Past it, the handler must not start.
        self.lease_until = lease_until
        self.outcome: Outcome | None = None  # set once, by Held.finish
        self.error: dict[str, Any] | None = None  # the error settled, for the log
        self.forgotten = False  # settled or given up: no longer held (a flag: nobody waits on it)
        self.timeout = timeout
        self.thread_id: int | None = None  # of the handler thread, while it runs with a timeout
        # Both under the pool's lock: the handler's outcome or the timeout, whichever is first.
        self.returned = False
        self.timed_out = False
        self.ran = 0.0  # seconds the handler ran (its timeout, if it timed out)
        self.labels: dict[str, str] = {}  # metric attributes, with the [otel] extra

    @classmethod
    def of(
        cls,
        occurrence: Occurrence,
        *,
        owner: str,
        using: str | None,
        default_timeout: float | None,
        lease_until: float = math.inf,
        progress_sink: ProgressSink | None = None,
    ) -> Run:
        """The run of an occurrence ``owner`` just claimed, with the context its handler gets
        (``lease_until``: when its lease ends, on ``time.monotonic``'s clock;
        ``progress_sink``: told of each progress report written)."""
        context = ExecutionContext(
            occurrence_id=occurrence.pk,
            job_id=occurrence.job_id,
            kind=occurrence.claimed_kind or "",
            attempt=occurrence.attempt,
            max_attempts=occurrence.max_attempts,
            fence=occurrence.fence,
            scheduled_for=occurrence.scheduled_for,
            payload=occurrence.payload,
            authority=occurrence.authority,
            owner=owner,
            using=using,
            enqueued_at=occurrence.created_at,
            claimed_at=occurrence.updated_at,  # set by the claim
            priority=occurrence.priority,
            cause=occurrence.cause,
            progress_sink=progress_sink,
        )
        return cls(occurrence, context, timeout_of(occurrence, default_timeout), lease_until)


class Held:
    """The runs a worker holds (their leases are renewed until they are forgotten) and,
    among them, the finished ones whose outcomes wait for the loop to settle them. Each is
    held by its attempt, (occurrence id, fence): forgetting one never touches another
    attempt of the same occurrence.

    ``wake`` is called whenever an outcome is added: the loop has something to settle.
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, int], Run] = {}
        self._finished: list[Run] = []  # handlers done, outcomes not yet settled
        self._processed = 0

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def processed(self) -> int:
        """How many occurrences were settled, refused or given back since the start."""
        return self._processed

    @property
    def finished(self) -> int:
        """How many outcomes wait to be settled."""
        return len(self._finished)

    def counts(self) -> tuple[int, int]:
        """(held, finished), read together."""
        with self._lock:
            return len(self._runs), len(self._finished)

    def runs(self) -> list[Run]:
        with self._lock:
            return list(self._runs.values())

    def holds(self, occurrence_id: str, fence: int) -> bool:
        """Whether the attempt of the occurrence at ``fence`` is held (not settled since)."""
        return (occurrence_id, fence) in self._runs

    def get(self, occurrence_id: str, fence: int) -> Run | None:
        """The held run of the occurrence's attempt at ``fence``, if it is held."""
        return self._runs.get((occurrence_id, fence))

    def add(self, runs: list[Run]) -> None:
        with self._lock:
            for run in runs:
                self._runs[run.occurrence.pk, run.occurrence.fence] = run

    def forget(self, run: Run, *, processed: bool = True) -> None:
        """The run is settled or given up: no longer held, one more ``processed`` (not so for
        a run dropped unstarted: its occurrence comes back to be claimed again)."""
        with self._lock:
            self._runs.pop((run.occurrence.pk, run.occurrence.fence), None)
            self._processed += processed
        run.forgotten = True

    def count_refused(self, n: int) -> None:
        """``n`` claimed occurrences their authority refused: processed without a run."""
        with self._lock:
            self._processed += n

    def finish(self, run: Run, outcome: Outcome) -> None:
        """Hand an outcome to the loop thread, which settles it with the others."""
        run.outcome = outcome
        with self._lock:
            self._finished.append(run)
        self._wake()

    def take_finished(self) -> list[Run]:
        """Every outcome waiting to be settled, in the order they finished: one attempt per
        occurrence (a settle takes each occurrence once), a later one waits for the next."""
        with self._lock:
            finished, self._finished = self._finished, []
            if len({run.occurrence.pk for run in finished}) < len(finished):
                finished, self._finished = _one_attempt_each(finished)
        return finished

    def put_back(self, runs: list[Run]) -> None:
        """Outcomes that could not be settled now: first in line for the next settle."""
        with self._lock:
            self._finished = runs + self._finished


def _one_attempt_each(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """``runs`` split into the first of each occurrence's attempts and the others."""
    first: list[Run] = []
    others: list[Run] = []
    seen: set[str] = set()
    for run in runs:
        (others if run.occurrence.pk in seen else first).append(run)
        seen.add(run.occurrence.pk)
    return first, others
