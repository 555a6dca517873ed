"""OpenTelemetry metrics and spans, with the optional ``[otel]`` extra (the OpenTelemetry API).

Without ``opentelemetry-api`` installed nothing here imports it: :func:`get` returns None
and the worker and the kernel skip every measurement. With it, the instruments go to
whatever meter and tracer providers the application sets up (the API's defaults do
nothing), so exporting is the application's choice: see docs/operations.md.

Instruments (meter and tracer ``django_durable_scheduler``), each labelled with
``scheduler.kind`` and ``scheduler.principal`` (``type:id``):

- counters ``scheduler.occurrences.enqueued`` (by the kernel: enqueue, bulk enqueue and
  materialized slots, counted at insert, so a caller's transaction that rolls back was
  counted too), ``.claimed``, ``.succeeded``, ``.failed`` (to be retried),
  ``.dead_lettered``, ``scheduler.authority.denied`` and ``.deferred`` (by the worker);
- histograms ``scheduler.run.duration`` (seconds a handler ran; a timed-out run counts
  its timeout) and ``scheduler.due.lag`` (seconds from an occurrence's due time to its claim);
- counters ``scheduler.budget.runs`` and ``scheduler.budget.units``: what claims charged to
  the principals' budgets (a retry that reuses its reservation charges nothing);
- counter ``scheduler.progress.done`` (by the worker): the units of work handlers report
  done (``ctx.report_progress``), as what ``done`` grew between a run's written reports,
  the first counting from 0 (so a retry that resumes where its last attempt stopped
  counts the resumed part again);
- counters ``scheduler.batches.completed`` (labelled with the callback job's kind and
  principal) and ``scheduler.follow_ups.enqueued`` (with the follow-up's), by the kernel
  once the transaction that completed the batch or enqueued the follow-up commits;
- a span ``scheduler.run <kind>`` per handler run (in the handler thread, so the handler's
  own spans are its children), with the occurrence's id, job, attempt and fence as
  attributes, and the exception and an error status when the run failed; a child of the span
  that was current at enqueue, if there was one (``tracing.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import __version__
from ..rules.authority import Principal
from ..rules.outcomes import SUCCEEDED, Outcome

NAME = "django_durable_scheduler"
# Histogram buckets (seconds) from a fast handler to an hour: the SDK's default buckets are
# for milliseconds.
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Instruments:
    """The instruments, made once from the OpenTelemetry API modules."""

    def __init__(self, metrics_api: Any, trace_api: Any) -> None:
        meter = metrics_api.get_meter(NAME, __version__)
        self.tracer = trace_api.get_tracer(NAME, __version__)
        self._status = trace_api.Status
        self._error = trace_api.StatusCode.ERROR
        self._consumer = trace_api.SpanKind.CONSUMER

        def counter(name: str, description: str, unit: str = "{occurrence}") -> Any:
            return meter.create_counter(name, unit=unit, description=description)

        self.enqueued = counter("scheduler.occurrences.enqueued", "Occurrences inserted")
        self.claimed = counter("scheduler.occurrences.claimed", "Occurrences claimed and authorized to run")
        self.succeeded = counter("scheduler.occurrences.succeeded", "Runs that succeeded")
        self.failed = counter("scheduler.occurrences.failed", "Runs that failed and will be retried")
        self.dead_lettered = counter("scheduler.occurrences.dead_lettered", "Occurrences dead-lettered")
        self.denied = counter("scheduler.authority.denied", "Occurrences their authority denied")
        self.deferred = counter("scheduler.authority.deferred", "Occurrences deferred: budget spent")
        self.budget_runs = counter("scheduler.budget.runs", "Runs charged to budgets", "{run}")
        self.budget_units = counter("scheduler.budget.units", "Units charged to budgets", "{unit}")
        self.batches_completed = counter("scheduler.batches.completed", "Batches completed", "{batch}")
        self.follow_ups_enqueued = counter("scheduler.follow_ups.enqueued", "Follow-ups enqueued")
        self.progress_done = counter(
            "scheduler.progress.done", "Units of work handlers reported done", "{unit}"
        )
        self.run_duration = meter.create_histogram(
            "scheduler.run.duration",
            unit="s",
            description="How long handlers ran",
            explicit_bucket_boundaries_advisory=SECONDS,
        )
        self.due_lag = meter.create_histogram(
            "scheduler.due.lag",
            unit="s",
            description="From an occurrence's due time to its claim",
            explicit_bucket_boundaries_advisory=SECONDS,
        )

    def run(
        self,
        attributes: dict[str, Any],
        name: str,
        call: Callable[[], Outcome],
        parent: Any = None,
    ) -> Outcome:
        """``call()`` (a handler run returning its outcome) inside its span: a
        child of ``parent`` (the enqueuer's context, ``tracing.parent_of``) if given."""
        with self.tracer.start_as_current_span(
            name,
            context=parent,
            kind=self._consumer,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            outcome = call()
            if outcome.status != SUCCEEDED:
                exception = outcome.exception
                if isinstance(exception, BaseException):
                    span.record_exception(exception)
                error = outcome.error
                message = error.get("message") if isinstance(error, dict) else str(error)
                span.set_status(self._status(self._error, str(message or "")[:500]))
            return outcome


_instruments: Instruments | None = None
_loaded = False


def get() -> Instruments | None:
    """The instruments, or None without the OpenTelemetry API (imported on first call)."""
    global _instruments, _loaded
    if not _loaded:
        try:
            import opentelemetry.metrics as metrics_api
            import opentelemetry.trace as trace_api
        except ImportError:
            _instruments = None
        else:
            _instruments = Instruments(metrics_api, trace_api)
        _loaded = True
    return _instruments


def labels(kind: str, authority: Any) -> dict[str, str]:
    return {"scheduler.kind": kind, "scheduler.principal": Principal.label_of(authority)}


def count_enqueued(kind: str, authority: Any, count: int = 1) -> None:
    """Count ``count`` occurrences inserted for a job of ``kind`` (the kernel's hook)."""
    instruments = get()
    if instruments is not None and count:
        instruments.enqueued.add(count, labels(kind, authority))
