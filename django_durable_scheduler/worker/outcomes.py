"""The outcome reporter: settles the outcomes of finished handlers in batches, and tells the
world about each claim, outcome and refusal (the log line, the metrics, the signals).

Logging (the ``django_durable_scheduler`` logger): a success at INFO, a retry at WARNING (a
``Retry`` the handler raised at INFO), a dead letter at ERROR, the failures with the
exception (``exc_info``) and every one with ``scheduler_*`` fields in ``extra``
(:func:`~.runs.log_fields`); a denial at WARNING, a budget deferral at INFO. Signals:
:mod:`..signals`, sent with the Worker class as ``sender``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from django.db import DatabaseError, connections

from .. import conf, kernel, signals
from ..db.dialect import alias_for
from ..exceptions import InvalidArgument, LeaseLost, SchedulerError
from ..models import Occurrence, OccurrenceStatus
from ..rules.authority import Principal
from ..rules.outcomes import FAILED, SUCCEEDED, Outcome
from ..rules.progress import Progress
from ..rules.validation import to_ms
from ..telemetry import metrics
from .context import ExecutionContext
from .holds import BudgetHolds
from .runs import Held, Run, log_fields

logger = logging.getLogger("django_durable_scheduler")


def one_line(error: BaseException | None) -> str:
    """An error as one log line (database errors often span several)."""
    try:
        text = " ".join(str(error).split()) if error is not None else ""
    except Exception:
        text = ""
    return f"{type(error).__name__}: {text[:500]}" if text else type(error).__name__


def database_answers(using: str | None) -> bool:
    """Whether the database answers at all: tells an outage (everything waits for it to
    come back) from an error that only some statement's values cause."""
    conn = connections[alias_for(using)]
    try:
        conn.close_if_unusable_or_obsolete()
        conn.ensure_connection()
        return bool(conn.is_usable())
    except DatabaseError:
        return False


def settle_item(run: Run) -> Outcome:
    """The handler's outcome as settle stores it: a result the database could not store is
    the occurrence's failure, dead-lettered at once (the handler would return the same
    again), and error text is repaired and cut to its limits."""
    outcome = run.outcome
    assert outcome is not None  # only finished runs are settled
    if outcome.status == SUCCEEDED:
        try:
            return replace(outcome, result=kernel.storable_result(outcome.result))
        except SchedulerError as exc:
            reason = f"the handler's result could not be stored: {exc}"
            return _failure(outcome, "InvalidResult", reason)
    if outcome.retry_at is not None:
        try:
            to_ms(outcome.retry_at, "Retry.at")
        except SchedulerError as exc:
            return _failure(outcome, "InvalidRetry", f"the handler's Retry could not be scheduled: {exc}")
    return replace(
        outcome, error=kernel.storable_error(outcome.error), retryable=outcome.retryable is not False
    )


def _failure(outcome: Outcome, kind: str, reason: str) -> Outcome:
    """``outcome``'s occurrence failed for good with ``reason``, whatever it held."""
    error = kernel.storable_error({"type": kind, "message": reason})
    return Outcome(outcome.occurrence_id, outcome.fence, FAILED, error=error, retryable=False)


def _log_outcome(run: Run, status: str) -> None:
    """One line per settled run: success at INFO, a retry at WARNING (INFO when the
    handler asked for it with ``Retry``), a dead letter at ERROR; failures carry the
    exception and traceback (``exc_info``) where there is one."""
    error = run.error
    if status in (OccurrenceStatus.SUCCEEDED, OccurrenceStatus.CANCELLED):
        level = logging.INFO  # a cancelled run stopped because someone asked it to
    elif status == OccurrenceStatus.RETRY_WAIT:
        level = logging.INFO if error is not None and error.get("type") == "Retry" else logging.WARNING
    else:
        level = logging.ERROR
    if not logger.isEnabledFor(level):
        return
    ctx = run.context
    seconds = time.monotonic() - run.started
    args: tuple[Any, ...] = (
        ctx.occurrence_id,
        status,
        ctx.job_id,
        ctx.kind,
        ctx.attempt,
        ctx.max_attempts,
        seconds * 1000,
    )
    fields = log_fields(run.occurrence, ctx.kind, status=status, duration_ms=round(seconds * 1000))
    if error is None:
        logger.log(level, "%s %s job=%s kind=%s attempt=%d/%d in %.0f ms", *args, extra=fields)
        return
    kind = error.get("type") or "Error"
    fields["scheduler_error_type"] = kind
    exception = run.outcome.exception if run.outcome is not None else None
    logger.log(
        level,
        "%s %s job=%s kind=%s attempt=%d/%d in %.0f ms: %s: %s",
        *args,
        kind,
        error.get("message", ""),
        exc_info=exception if isinstance(exception, BaseException) and level > logging.INFO else None,
        extra=fields,
    )


def _measure_outcome(instruments: metrics.Instruments, run: Run, status: str) -> None:
    labels = run.labels or metrics.labels(run.context.kind, run.occurrence.authority)
    if status == OccurrenceStatus.SUCCEEDED:
        instruments.succeeded.add(1, labels)
    elif status == OccurrenceStatus.RETRY_WAIT:
        instruments.failed.add(1, labels)
    elif status == OccurrenceStatus.DEAD_LETTER:
        instruments.dead_lettered.add(1, labels)
    if run.ran:
        instruments.run_duration.record(run.ran, labels)


class OutcomeReporter:
    """Settles the finished runs of ``held`` as ``worker_id`` and reports what happened.

    Signals are sent with ``sender`` (the Worker class); ``instruments`` is None without the
    ``[otel]`` extra (nothing is measured).
    """

    def __init__(
        self,
        *,
        held: Held,
        worker_id: str,
        sender: type,
        using: str | None = None,
        instruments: metrics.Instruments | None = None,
    ) -> None:
        self.held = held
        self.worker_id = worker_id
        self.sender = sender
        self.using = using
        self.instruments = instruments
        self.holds = BudgetHolds()

    def flush(self) -> None:
        """Settle every finished outcome in one transaction. When the database refuses the
        batch, each outcome is settled on its own, so that one the database cannot store
        fails alone rather than stall the rest; while the database does not answer at all
        they stay pending (their leases are still renewed), this raises the DatabaseError,
        and the next turn tries again."""
        finished = self.held.take_finished()
        if not finished:
            return
        items = [settle_item(run) for run in finished]
        for run, item in zip(finished, items, strict=True):
            run.error = item.error
        results: list[Occurrence | LeaseLost | None] = []
        try:
            results.extend(kernel.settle_many(items, owner=self.worker_id, using=self.using))
        except (InvalidArgument, DatabaseError) as exc:
            try:
                if isinstance(exc, DatabaseError) and not database_answers(self.using):
                    raise
                logger.warning(
                    "could not settle %d outcomes together (%s); settling them one by one",
                    len(finished),
                    one_line(exc),
                )
                for run, item in zip(finished, items, strict=True):
                    results.append(self._settle_alone(run, item))
            except DatabaseError:
                self.held.put_back(finished[len(results) :])
                self._report(finished[: len(results)], results)
                raise
        self._report(finished, results)

    def _settle_alone(self, run: Run, item: Outcome) -> Occurrence | LeaseLost | None:
        """Settle one outcome on its own, after its batch failed. One the kernel refuses, or
        that the database refuses twice while it answers otherwise, is recorded as the
        occurrence's failure instead (dead-lettered: it would be refused again). If even
        that is refused, the occurrence is given up with one log line: it is no longer
        renewed, and its lease expires as a crashed worker's would. A DatabaseError means
        the database stopped answering: the caller keeps what is left for the next turn."""
        problem: Exception | None = None
        for _ in range(2):  # twice: a deadlock or a lost connection rarely repeats
            try:
                return self._settle_one(item)
            except InvalidArgument as exc:
                problem = exc
                break
            except DatabaseError as exc:
                if not database_answers(self.using):
                    raise
                problem = exc
        reason = f"the handler's outcome could not be stored: {one_line(problem)}"
        failure = _failure(item, "UnstorableOutcome", reason)
        try:
            return self._settle_one(failure)
        except (SchedulerError, DatabaseError) as exc:
            if isinstance(exc, DatabaseError) and not database_answers(self.using):
                raise
            logger.error(
                "%s: could not record its outcome (%s) nor that failure (%s); "
                "no longer renewing its lease, which will expire",
                run.occurrence.pk,
                one_line(problem),
                one_line(exc),
            )
            return None

    def _settle_one(self, item: Outcome) -> Occurrence | LeaseLost:
        """Settle ``item`` alone: the occurrence, or the ``LeaseLost`` refusing it."""
        (settled,) = kernel.settle_many([item], owner=self.worker_id, using=self.using)
        return settled

    def give_back(self, runs: list[Run], why: str) -> None:
        """Release the leases of ``runs`` unsettled (another worker may run them now), and
        forget them; their handlers, if running, see ``ctx.lease_lost``."""
        for run in runs:
            occurrence = run.occurrence
            try:
                kernel.release(occurrence.pk, owner=self.worker_id, fence=occurrence.fence, using=self.using)
                logger.warning("gave up the lease on %s %s", occurrence.pk, why)
            except (SchedulerError, DatabaseError) as exc:
                logger.warning("could not give up the lease on %s: %s", occurrence.pk, exc)
            run.context.mark_lease_lost()
            self.held.forget(run)

    def _report(self, finished: list[Run], results: list[Occurrence | LeaseLost | None]) -> None:
        for run, settled in zip(finished, results, strict=True):
            ctx = run.context
            if isinstance(settled, LeaseLost):
                ctx.mark_lease_lost()
                logger.warning("%s: result not recorded: %s", ctx.occurrence_id, settled)
            elif settled is not None:
                _log_outcome(run, settled.status)
                self._signal_outcome(run, settled.status)
                if self.instruments is not None:
                    _measure_outcome(self.instruments, run, settled.status)
            self.held.forget(run)

    def _signal_outcome(self, run: Run, status: str) -> None:
        finished = signals.occurrence_finished.has_listeners(self.sender)
        dead = status == OccurrenceStatus.DEAD_LETTER
        dead = dead and signals.occurrence_dead_lettered.has_listeners(self.sender)
        if not (finished or dead):
            return
        occurrence, kind = run.occurrence, run.context.kind
        outcome = run.outcome
        exception = outcome.exception if outcome is not None else None
        succeeded = outcome is not None and status == OccurrenceStatus.SUCCEEDED
        if finished:
            self._send(
                signals.occurrence_finished,
                occurrence,
                kind,
                outcome=str(status),
                result=outcome.result if succeeded and outcome is not None else None,
                error=run.error,
                exception=exception,
                duration=time.monotonic() - run.started,
            )
        if dead:
            error = run.error
            self._send(signals.occurrence_dead_lettered, occurrence, kind, error=error, exception=exception)

    def claimed(self, runnable: list[Run]) -> None:
        """Measure and signal the runs a claim is about to hand to the handler threads."""
        if self.instruments is not None:
            now = conf.now()
            for run in runnable:
                occurrence = run.occurrence
                labels = run.labels = metrics.labels(run.context.kind, occurrence.authority)
                self.instruments.claimed.add(1, labels)
                lag = max(0.0, (now - occurrence.available_at).total_seconds())
                self.instruments.due_lag.record(lag, labels)
                if occurrence.charged_units:
                    self.instruments.budget_runs.add(1, labels)
                    self.instruments.budget_units.add(occurrence.charged_units, labels)
        if signals.occurrence_claimed.has_listeners(self.sender):
            for run in runnable:
                self._send(signals.occurrence_claimed, run.occurrence, run.context.kind)

    def progressed(self, ctx: ExecutionContext, stored: Progress, before: Progress | None) -> None:
        """Measure and signal a progress report just written (from the handler's thread): the
        ``scheduler.progress.done`` counter grows by what ``done`` grew since the run's
        previous report written (the first from 0)."""
        run = self.held.get(ctx.occurrence_id, ctx.fence)
        if run is None:  # settled or given up meanwhile
            return
        if self.instruments is not None:
            grown = stored.done - (before.done if before is not None else 0)
            if grown > 0:
                labels = run.labels or metrics.labels(ctx.kind, run.occurrence.authority)
                self.instruments.progress_done.add(grown, labels)
        if signals.occurrence_progressed.has_listeners(self.sender):
            progress = {"done": stored.done, "total": stored.total, "note": stored.note}
            self._send(signals.occurrence_progressed, run.occurrence, ctx.kind, **progress)

    def refused(self, occurrence: Occurrence, result: kernel.Authorization) -> None:
        """Log (and signal) an occurrence its authority refused: a denial, dead-lettered,
        at WARNING; a budget deferral, which only waits, at INFO, and its principal's spent
        window once at WARNING (``holds``)."""
        kind = occurrence.claimed_kind or ""
        if result.verdict == kernel.LEASE_LOST:
            logger.warning(
                "%s: lease lost before authorization", occurrence.pk, extra=log_fields(occurrence, kind)
            )
            return
        error = result.error or {}
        reason = error.get("reason") or result.verdict
        denied = result.verdict == kernel.DENIED
        if result.verdict == kernel.DEFERRED:
            self.holds.deferred(Principal.label_of(occurrence.authority), error.get("details") or {})
        # The stored message names the reason and what was refused (the missing
        # capabilities, the principal), so the log line alone tells the operator.
        logger.log(
            logging.WARNING if denied else logging.INFO,
            "%s %s job=%s kind=%s principal=%s: %s: %s",
            occurrence.pk,
            result.verdict,
            occurrence.job_id,
            kind,
            Principal.label_of(occurrence.authority),
            reason,
            error.get("message", "by authority"),
            extra=log_fields(occurrence, kind, status=result.verdict, reason=reason),
        )
        if self.instruments is not None:
            counter = self.instruments.denied if denied else self.instruments.deferred
            counter.add(1, metrics.labels(kind, occurrence.authority))
            if denied:
                self.instruments.dead_lettered.add(1, metrics.labels(kind, occurrence.authority))
        if denied:
            if signals.authority_denied.has_listeners(self.sender):
                self._send(signals.authority_denied, occurrence, kind, reason=reason, error=error)
            if signals.occurrence_dead_lettered.has_listeners(self.sender):
                self._send(signals.occurrence_dead_lettered, occurrence, kind, error=error, exception=None)
        elif signals.budget_deferred.has_listeners(self.sender):
            self._send(signals.budget_deferred, occurrence, kind, reason=reason)

    def _send(self, signal: Any, occurrence: Occurrence, kind: str, **kwargs: Any) -> None:
        """Send one of :mod:`..signals` (the caller checked that it has receivers)."""
        sender, worker_id = self.sender, self.worker_id
        signals.send(signal, sender, worker_id=worker_id, occurrence=occurrence, kind=kind, **kwargs)
