"""One trace from an enqueue to every run of its occurrence (the ``[otel]`` extra), read back
through the SDK's in-memory exporter: the W3C trace context stored at enqueue, each attempt's
``scheduler.run <kind>`` span a child of the enqueuer's span, the admin's trace id. Without
the API at all (a subprocess that cannot import it), nothing is stored or imported."""

from __future__ import annotations

import importlib.util
import logging
import re
import textwrap
from datetime import timedelta

import pytest

pytest.importorskip("opentelemetry.sdk")

import opentelemetry.trace as trace_api
from django.contrib.admin.utils import quote
from django.urls import reverse
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.telemetry import tracing
from django_durable_scheduler.worker import Worker

from ..conftest import AUTHORITY, run_python
from ..otel import otel_providers  # noqa: F401 (the fixture "otel")

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = 1_700_000_000_000
tracer = trace_api.get_tracer("tests.tracing")


def traceparent(span_context: SpanContext) -> str:
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags):02x}"


def run_spans(exporter, kind: str) -> list:
    """The finished run spans of ``kind``, by attempt."""
    spans = [span for span in exporter.get_finished_spans() if span.name == f"scheduler.run {kind}"]
    return sorted(spans, key=lambda span: span.attributes["scheduler.attempt"])


def work() -> None:
    assert Worker(worker_id="w-trace", burst=True, concurrency=2, poll_interval=0.05).run() == 0


@pytest.fixture
def jobs():
    """Jobs with ids no other test uses: the kernel remembers job rows by id
    (``enqueuing._REMEMBERED``) across the databases other tests flushed."""
    registry.autodiscover()
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job(
        "trace-flaky",
        "test.flaky",
        authority=AUTHORITY,
        max_attempts=2,
        retry_base_delay=0.001,
        retry_max_delay=0.001,
    )
    scheduler.create_job("trace-ok", "test.ok", authority=AUTHORITY)
    scheduler.create_job("trace-permanent", "test.permanent", authority=AUTHORITY)


def test_every_attempt_continues_the_enqueuers_trace(otel, jobs):
    _, exporter = otel
    with tracer.start_as_current_span("request") as request:
        occurrence, _ = scheduler.enqueue("trace-flaky", scheduled_for=SLOT, trigger_key="t")
    parent = request.get_span_context()
    stored = {"traceparent": traceparent(parent)}
    assert occurrence.trace_context == stored
    assert Occurrence.objects.get(pk=occurrence.pk).trace_context == stored
    work()

    first, second = run_spans(exporter, "test.flaky")
    assert [first.attributes["scheduler.attempt"], second.attributes["scheduler.attempt"]] == [1, 2]
    for span in (first, second):
        assert span.context.trace_id == parent.trace_id
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.parent.is_remote  # read back from the row, not the worker's own span
    assert first.status.status_code == trace_api.StatusCode.ERROR
    assert Occurrence.objects.get(pk=occurrence.pk).status == "succeeded"
    # The retry kept the row's trace context: retries never write it.
    assert Occurrence.objects.get(pk=occurrence.pk).trace_context == stored


def test_an_enqueue_without_a_span_stores_none_and_its_run_starts_a_trace(otel, jobs):
    _, exporter = otel
    assert not trace_api.get_current_span().get_span_context().is_valid
    occurrence, _ = scheduler.enqueue("trace-ok", scheduled_for=SLOT, trigger_key="none")
    assert Occurrence.objects.get(pk=occurrence.pk).trace_context is None
    work()
    (span,) = run_spans(exporter, "test.ok")
    assert span.parent is None


def test_tracestate_and_the_sampling_decision_are_carried(otel, jobs):
    """A span that is valid but not recording (another service's, or not sampled) is carried
    too: the run follows its sampling decision, and its tracestate."""
    _, exporter = otel
    state = TraceState([("vendor", "opaque")])
    sampled = SpanContext(0xA1 << 64, 0xB1, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)
    dropped = SpanContext(0xA2 << 64, 0xB2, is_remote=True, trace_flags=TraceFlags(0))
    with trace_api.use_span(NonRecordingSpan(sampled)):
        kept, _ = scheduler.enqueue("trace-ok", scheduled_for=SLOT, trigger_key="sampled")
    with trace_api.use_span(NonRecordingSpan(dropped)):
        unsampled, _ = scheduler.enqueue("trace-ok", scheduled_for=SLOT, trigger_key="dropped")
    assert Occurrence.objects.get(pk=kept.pk).trace_context == {
        "traceparent": traceparent(sampled),
        "tracestate": "vendor=opaque",
    }
    assert Occurrence.objects.get(pk=unsampled.pk).trace_context == {"traceparent": traceparent(dropped)}
    work()
    (span,) = run_spans(exporter, "test.ok")  # the unsampled trace's run is not recorded
    assert span.attributes["scheduler.occurrence_id"] == kept.pk
    assert span.context.trace_id == sampled.trace_id and span.parent.span_id == sampled.span_id
    assert span.context.trace_state == state
    assert Occurrence.objects.get(pk=unsampled.pk).status == "succeeded"


def test_every_enqueue_path_stores_the_callers_trace(otel, jobs):
    _, exporter = otel
    with tracer.start_as_current_span("bulk") as bulk:
        many = scheduler.enqueue_many(
            "trace-ok", [{"scheduled_for": SLOT + i, "trigger_key": f"m{i}"} for i in range(3)]
        )
        once, _ = scheduler.enqueue_once_per_trigger("trace-ok", scheduled_for=SLOT, trigger_key="once")
    parent = bulk.get_span_context()
    ids = [occurrence.pk for occurrence, _ in many] + [once.pk]
    stored = dict(Occurrence.objects.filter(pk__in=ids).values_list("pk", "trace_context"))
    assert stored == {pk: {"traceparent": traceparent(parent)} for pk in ids}
    work()
    spans = {span.attributes["scheduler.occurrence_id"]: span for span in run_spans(exporter, "test.ok")}
    assert sorted(spans) == sorted(ids)
    for span in spans.values():
        assert span.context.trace_id == parent.trace_id and span.parent.span_id == parent.span_id


@pytest.fixture
def chained():
    """A kind whose handler enqueues one ``trace-ok`` follow-up, from inside its run span."""

    def run(ctx):
        scheduler.enqueue("trace-ok", scheduled_for=SLOT, trigger_key=f"after:{ctx.occurrence_id}")
        return None

    registry.handler("test.trace-chain")(run)
    yield
    registry.unregister("test.trace-chain")


def test_work_a_handler_enqueues_joins_its_runs_trace(otel, jobs, chained):
    _, exporter = otel
    scheduler.create_job("trace-chain", "test.trace-chain", authority=AUTHORITY)
    with tracer.start_as_current_span("request") as request:
        scheduler.enqueue("trace-chain", scheduled_for=SLOT, trigger_key="t")
    work()
    (first,) = run_spans(exporter, "test.trace-chain")
    (follow_up,) = run_spans(exporter, "test.ok")
    assert first.context.trace_id == follow_up.context.trace_id == request.get_span_context().trace_id
    assert follow_up.parent.span_id == first.context.span_id


def test_a_schedules_slots_have_no_caller_and_store_none(otel, jobs, clock):
    """A worker materializes slots: whatever span is current there is not the slot's cause."""
    scheduler.create_job(
        "trace-slot",
        "test.ok",
        authority=AUTHORITY,
        trigger={"at": (clock() + timedelta(minutes=1)).isoformat()},
    )
    clock.advance(minutes=2)
    with tracer.start_as_current_span("maintenance"):
        assert kernel.materialize_due() == 1
    assert Occurrence.objects.get(job_id="trace-slot").trace_context is None


def test_a_dead_letters_retry_continues_its_trace_unless_a_span_is_current(otel, jobs):
    with tracer.start_as_current_span("request") as request:
        first, _ = scheduler.enqueue("trace-permanent", scheduled_for=SLOT, trigger_key="a")
        second, _ = scheduler.enqueue("trace-permanent", scheduled_for=SLOT, trigger_key="b")
    work()
    assert {row.status for row in Occurrence.objects.filter(pk__in=[first.pk, second.pk])} == {"dead_letter"}
    retried, _ = kernel.retry_dead_letter(first.pk)
    assert Occurrence.objects.get(pk=retried.pk).trace_context == {
        "traceparent": traceparent(request.get_span_context())
    }
    with tracer.start_as_current_span("admin action") as action:
        again, _ = kernel.retry_dead_letter(second.pk)
    assert Occurrence.objects.get(pk=again.pk).trace_context == {
        "traceparent": traceparent(action.get_span_context())
    }


@pytest.mark.parametrize(
    "stored",
    [
        {"traceparent": "not a traceparent"},
        {"traceparent": "00-" + "0" * 32 + "-00000000000000b1-01"},
        {"traceparent": 5},
        ["00-000000000000000000000000000000a1-00000000000000b1-01"],
        "00-000000000000000000000000000000a1-00000000000000b1-01",
    ],
)
def test_a_malformed_stored_context_never_breaks_a_run(otel, jobs, caplog, stored):
    _, exporter = otel
    occurrence, _ = scheduler.enqueue("trace-ok", scheduled_for=SLOT, trigger_key="bad")
    Occurrence.objects.filter(pk=occurrence.pk).update(trace_context=stored)  # as a bad hand edit would
    with caplog.at_level(logging.DEBUG, logger="django_durable_scheduler"):
        work()
    assert Occurrence.objects.get(pk=occurrence.pk).status == "succeeded"
    (span,) = run_spans(exporter, "test.ok")
    assert span.parent is None
    assert any("stored trace context is ignored" in record.getMessage() for record in caplog.records)
    assert tracing.trace_id(stored) == ""


def test_a_django_task_continues_the_enqueuers_trace(otel, jobs):
    if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
        pytest.skip("no task framework: Django 6 or the django-tasks backport")
    from tests.testapp import djtasks

    _, exporter = otel
    with tracer.start_as_current_span("view") as view:
        result = djtasks.add.enqueue(1, 2)
    parent = view.get_span_context()
    assert Occurrence.objects.get(pk=result.id).trace_context == {"traceparent": traceparent(parent)}
    work()
    assert djtasks.add.get_result(result.id).return_value == 3
    (span,) = run_spans(exporter, "django.tasks:default")
    assert span.context.trace_id == parent.trace_id and span.parent.span_id == parent.span_id


def test_the_admin_shows_the_trace_id(otel, jobs, admin_client):
    with tracer.start_as_current_span("request") as request:
        traced, _ = scheduler.enqueue("trace-ok", scheduled_for=SLOT, trigger_key="traced")
    untraced, _ = scheduler.enqueue("trace-ok", scheduled_for=SLOT, trigger_key="untraced")
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert tracing.trace_id(traced.trace_context) == trace_id

    def page(occurrence: Occurrence) -> str:
        url = reverse("admin:durable_scheduler_occurrence_change", args=[quote(occurrence.pk)])
        response = admin_client.get(url)
        assert response.status_code == 200
        return response.content.decode()

    def shown(html: str) -> str:
        """What the page shows as the trace id (the readonly field after its label)."""
        found = re.search(r'field-trace_id">.*?<div class="readonly">(.*?)</div>', html, re.DOTALL)
        assert found is not None, "no trace id field"
        return found.group(1)

    assert shown(page(traced)) == trace_id
    assert shown(page(untraced)) == ""


NO_OTEL = textwrap.dedent(
    """
    import sys

    tried = []

    class NoOpenTelemetry:
        # As if the [otel] extra were not installed: every opentelemetry import fails.
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                tried.append(name)
                raise ImportError(name)
            return None

    sys.meta_path.insert(0, NoOpenTelemetry())
    import django

    django.setup()
    import django_durable_scheduler as scheduler
    from django_durable_scheduler.handlers import registry
    from django_durable_scheduler.models import Occurrence
    from django_durable_scheduler.worker import Worker

    registry.autodiscover()
    authority = {"principal": {"type": "user", "id": "alice"}, "requestedCapabilities": ["test.ok"]}
    scheduler.ensure_policy(authority)
    scheduler.create_job("trace-no-otel", "test.ok", authority=authority)
    occurrence, _ = scheduler.enqueue("trace-no-otel", scheduled_for=1_700_000_000_000, trigger_key="t")
    assert Worker(worker_id="w-no-otel", burst=True, poll_interval=0.05).run() == 0
    row = Occurrence.objects.get(pk=occurrence.pk)
    assert (row.status, row.trace_context) == ("succeeded", None), (row.status, row.trace_context)
    # One probe, metrics.get()'s, remembered: no enqueue or run tries again.
    assert tried == ["opentelemetry"], tried
    print("ok")
    """
)


def test_without_the_extra_nothing_is_stored_or_imported():
    process = run_python(NO_OTEL)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert out.strip().endswith("ok")
