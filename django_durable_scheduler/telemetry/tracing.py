"""One trace from an enqueue to the runs of its occurrence, with the ``[otel]`` extra.

An enqueue made while a span is current stores that span's W3C trace context
(``traceparent``, and ``tracestate`` if any) in ``Occurrence.trace_context``, and every
attempt's ``scheduler.run <kind>`` span (``metrics.Instruments.run``) is a child of it: the
run is in the enqueuer's trace, whichever worker takes it and however much later. Only the
W3C fields are stored, through OpenTelemetry's own ``TraceContextTextMapPropagator``, never
the application's other propagators (baggage may hold user data; a row is no place for it).

Without ``opentelemetry-api`` nothing here imports it (``metrics.get()`` is None): an enqueue
stores null and a run starts its own trace, as before.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from . import metrics

logger = logging.getLogger("django_durable_scheduler")

# version-traceid-spanid-flags: what the admin reads the trace id from, without the extra.
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


class _Api:
    """The propagator and the trace API, loaded once with the extra."""

    def __init__(self) -> None:
        import opentelemetry.trace as trace_api
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace_api
        self.propagator = TraceContextTextMapPropagator()


_api: _Api | None = None


def _loaded() -> _Api | None:
    global _api
    if metrics.get() is None:
        return None
    if _api is None:
        _api = _Api()
    return _api


def capture() -> dict[str, str] | None:
    """The W3C trace context of the current span, or None: no extra, or no valid span current
    (a span that is valid but not sampled is carried too, so that its run is not sampled
    either under a parent-based sampler)."""
    api = _loaded()
    if api is None:
        return None
    carrier: dict[str, str] = {}
    api.propagator.inject(carrier)
    return carrier or None


def parent_of(stored: Any, occurrence_id: str) -> Any:
    """The OpenTelemetry context whose span is the enqueuer's, for a run of an occurrence that
    stored ``stored``; None (the run starts a trace of its own) when it stored none, or when
    what it stored is not a trace context: that is logged at DEBUG and never fails the run."""
    if stored is None:
        return None
    api = _loaded()
    if api is None:
        return None
    try:
        if not isinstance(stored, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in stored.items()
        ):
            raise ValueError("not an object of strings")
        context = api.propagator.extract(stored)
        if not api.trace.get_current_span(context).get_span_context().is_valid:
            raise ValueError("no valid traceparent")
    except Exception as exc:  # stored data is not ours to trust: the run goes on without it
        logger.debug("%s: its stored trace context is ignored (%s): %r", occurrence_id, exc, stored)
        return None
    return context


def trace_id(stored: Any) -> str:
    """The trace id (32 hex digits) of a stored trace context, or "" (for the admin: a plain
    reading of ``traceparent``, which needs no extra)."""
    traceparent = stored.get("traceparent") if isinstance(stored, dict) else None
    match = _TRACEPARENT.match(traceparent) if isinstance(traceparent, str) else None
    if match is None or match.group(1) == "0" * 32:
        return ""
    return match.group(1)
