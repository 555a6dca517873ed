"""``drain()``: run what is due, in the test's own thread, with the worker's own parts.

A ``runscheduler --burst`` in a test's process, minus the threads: the worker's
:class:`~..worker.claims.Claimer` claims and authorizes a batch (one kernel transaction), its
:class:`~..worker.pool.HandlerPool` runs the handlers (``run_queued``: in this thread, not
its threads), its :class:`~..worker.outcomes.OutcomeReporter` settles them (retries, dead
letters, follow-ups) and sends the worker's signals; before each claim the worker's upkeep
runs (due schedule slots materialized, expired leases swept, finished batches completed).
Everything goes through the test's own database connection, so a ``TestCase``, whose
transaction never commits, sees what ran and the drain sees what the test wrote.

No heartbeat runs: each handler starts right after its claim and is settled right after it
returns, in the same thread, so no lease needs renewing in between; for the same reason a
handler's ``timeout`` is not enforced (nothing could interrupt the thread).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import conf, kernel
from ..db.dialect import alias_for
from ..exceptions import InvalidArgument
from ..handlers import registry
from ..models import Occurrence
from ..rules.validation import normalize_identifier, normalize_int
from ..telemetry import metrics
from ..worker.claims import Claimer
from ..worker.loop import Worker
from ..worker.outcomes import OutcomeReporter
from ..worker.pool import HandlerPool
from ..worker.runs import Held, Run

# The most a claim takes at once: enough that a batch of work drains in a few turns, few
# enough that ``max_runs`` stops close to where it is asked to.
CLAIM_BATCH = 50
# A drain that has run this many occurrences and still finds work due is a loop (a handler
# that enqueues itself for now, again and again): it stops and says so.
RUNAWAY = 10_000
# Rounds of the upkeep per turn: materialize_due takes 50 jobs at a time.
UPKEEP_ROUNDS = 100


@dataclass(frozen=True)
class DrainedRun:
    """One occurrence a drain claimed: run by its handler, or refused by its authority."""

    occurrence_id: str
    job_id: str
    kind: str
    attempt: int
    scheduled_for: datetime  # the slot or time it was enqueued for
    status: str  # the occurrence's status once settled: succeeded, retry_wait, dead_letter, ...
    result: Any = None  # what the handler returned (as stored), on success
    error: dict[str, Any] | None = None  # what was stored about the failure, else None
    denial: dict[str, Any] | None = None  # the authority's refusal: verdict, reason, message...

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def denied(self) -> bool:
        """Refused by its principal's policy (dead-lettered without running)."""
        return self.denial is not None and self.denial.get("verdict") == kernel.DENIED

    @property
    def deferred(self) -> bool:
        """Over its principal's budget: it waits, unrun, for the next window."""
        return self.denial is not None and self.denial.get("verdict") == kernel.DEFERRED


class _RecordingReporter(OutcomeReporter):
    """The worker's reporter, which also keeps what the authority refused for the drain's
    result (a refusal is logged and signalled, never settled: nothing else records it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.refusals: list[tuple[Occurrence, kernel.Authorization]] = []

    def refused(self, occurrence: Occurrence, result: kernel.Authorization) -> None:
        self.refusals.append((occurrence, result))
        super().refused(occurrence, result)


def _kinds(kinds: Any) -> list[str]:
    """The kinds to claim: every registered one, or those of ``kinds`` (each registered)."""
    local = registry.registered_kinds()
    if kinds is None:
        return local
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise InvalidArgument("kinds", "must be a list of kinds or None")
    wanted = [normalize_identifier(kind, f"kinds[{i}]", max_length=128) for i, kind in enumerate(kinds)]
    if not wanted:
        raise InvalidArgument("kinds", "name at least one kind, or pass None for every registered one")
    missing = sorted(set(wanted) - set(local))
    if missing:
        raise InvalidArgument(
            "kinds", f"no handler is registered for {', '.join(missing)} (registered: {', '.join(local)})"
        )
    return [kind for kind in local if kind in set(wanted)]


class Drain:
    """The worker's claim, pool and reporter, wired as ``Worker.__init__`` wires them, and
    the turns of its loop driven by hand (see the module's docstring)."""

    def __init__(self, *, kinds: list[str], using: str | None, lease: float) -> None:
        self.kinds = kinds
        self.using = using
        self.worker_id = f"testing-drain:{os.getpid()}"
        self.held = Held(lambda: None)
        instruments = metrics.get()  # as the worker: None without the [otel] extra
        self.pool = HandlerPool(
            concurrency=CLAIM_BATCH,
            held=self.held,
            wake=lambda: None,
            learn=lambda seconds: None,
            sender=Worker,
            worker_id=self.worker_id,
            instruments=instruments,
        )
        self.reporter = _RecordingReporter(
            held=self.held, worker_id=self.worker_id, sender=Worker, using=using, instruments=instruments
        )
        self.claimer = Claimer(
            worker_id=self.worker_id,
            lease=lease,
            using=using,
            held=self.held,
            pool=self.pool,
            reporter=self.reporter,
        )

    def upkeep(self) -> None:
        """What ``Worker._maintain`` does, every turn: due slots made occurrences (the
        trigger's misfire and daylight-saving rules applied), expired leases swept, the
        batches whose last member ended completed (their callbacks enqueued)."""
        for _ in range(UPKEEP_ROUNDS):
            due = kernel.next_due_at(using=self.using)
            if due is None or due > conf.now():
                break
            kernel.materialize_due(using=self.using)
        kernel.dead_letter_expired(using=self.using)
        kernel.complete_due_batches(using=self.using)

    def turn(self, limit: int) -> list[DrainedRun]:
        """One claim of up to ``limit``, its handlers run and its outcomes settled; one
        record per occurrence claimed, in claim order."""
        self.reporter.refusals.clear()
        claimed = self.claimer.claim(limit, self.kinds)
        if not claimed:
            return []
        self.pool.run_queued()
        held = {run.occurrence.pk: run for run in self.held.runs()}  # ran, or failed unpriced
        self.reporter.flush()
        refused = {occurrence.pk: verdict for occurrence, verdict in self.reporter.refusals}
        rows = {
            row["pk"]: row
            for row in Occurrence.objects.using(alias_for(self.using))
            .filter(pk__in=[occurrence.pk for occurrence in claimed])
            .values("pk", "status", "result", "last_error")
        }
        return [self._record(occurrence, held, refused, rows[occurrence.pk]) for occurrence in claimed]

    @staticmethod
    def _record(
        occurrence: Occurrence,
        held: dict[str, Run],
        refused: dict[str, kernel.Authorization],
        row: Mapping[str, Any],
    ) -> DrainedRun:
        run = held.get(occurrence.pk)
        if run is not None:
            ctx = run.context
            return DrainedRun(
                occurrence_id=ctx.occurrence_id,
                job_id=ctx.job_id,
                kind=ctx.kind,
                attempt=ctx.attempt,
                scheduled_for=ctx.scheduled_for,
                status=row["status"],
                result=row["result"],
                error=run.error,
            )
        verdict = refused.get(occurrence.pk)
        denial = None if verdict is None else {"verdict": verdict.verdict, **(verdict.error or {})}
        return DrainedRun(
            occurrence_id=occurrence.pk,
            job_id=occurrence.job_id,
            kind=occurrence.claimed_kind or "",
            attempt=occurrence.attempt,
            scheduled_for=occurrence.scheduled_for,
            status=row["status"],
            error=row["last_error"],
            denial=denial,
        )


def drain(
    *,
    max_runs: int | None = None,
    kinds: Iterable[str] | None = None,
    lease: float = 300.0,
    using: str | None = None,
) -> list[DrainedRun]:
    """Run everything that is due now, in this thread, through the worker's own claim,
    authorization, settle, retry, follow-up and batch code, until nothing more is due (or
    ``max_runs`` occurrences were claimed). What a run enqueues for now (a follow-up, a
    batch's callback, a retry without backoff) runs too; a retry whose backoff has not
    passed waits for the clock (:func:`~.clocks.clock`) to move and the next drain.

    ``kinds``: only these (each must have a registered handler; default: all that have);
    ``lease``: seconds, as ``runscheduler --lease``. Returns one :class:`DrainedRun` per
    occurrence claimed, in the order they were claimed: run (``status``, ``result``,
    ``error``) or refused by authority (``denial``).
    """
    limit = None if max_runs is None else normalize_int(max_runs, "max_runs", minimum=1, maximum=RUNAWAY)
    wanted = _kinds(kinds)
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not 1 <= lease <= 86_400:
        raise InvalidArgument("lease", "must be a number of seconds from 1 to 86400")
    if using is not None and not isinstance(using, str):
        raise InvalidArgument("using", "must be a database alias or None")
    worker = Drain(kinds=wanted, using=using, lease=float(lease))
    done: list[DrainedRun] = []
    while limit is None or len(done) < limit:
        worker.upkeep()
        if not wanted:
            break
        left = CLAIM_BATCH if limit is None else min(CLAIM_BATCH, limit - len(done))
        records = worker.turn(left)
        if not records:
            break
        done.extend(records)
        if len(done) >= RUNAWAY:
            raise AssertionError(
                f"drain() ran {len(done)} occurrences and work is still due: a handler that "
                "enqueues work for now on every run? Pass max_runs= to stop earlier."
            )
    return done
