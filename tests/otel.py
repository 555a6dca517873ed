"""The in-memory OpenTelemetry reader and exporter the ``[otel]`` tests read back: installed as
the global providers once per process (OpenTelemetry allows one set), so every test module
that reads metrics or spans shares them. Import it only after ``importorskip("opentelemetry.sdk")``."""

from __future__ import annotations

import opentelemetry.metrics as metrics_api
import opentelemetry.trace as trace_api
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_PROVIDERS: tuple[InMemoryMetricReader, InMemorySpanExporter] | None = None


@pytest.fixture(name="otel")
def otel_providers() -> tuple[InMemoryMetricReader, InMemorySpanExporter]:
    """The in-memory reader and exporter, the exporter emptied."""
    global _PROVIDERS
    if _PROVIDERS is None:
        reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
        metrics_api.set_meter_provider(MeterProvider(metric_readers=[reader]))
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace_api.set_tracer_provider(tracer_provider)
        _PROVIDERS = (reader, exporter)
    reader, exporter = _PROVIDERS
    exporter.clear()
    return reader, exporter
