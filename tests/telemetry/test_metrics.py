"""OpenTelemetry metrics and spans (the ``[otel]`` extra), read back through the SDK's
in-memory reader and exporter. Without the SDK installed (it is in the dev group), skipped;
the worker without the API at all is tested in test_observability."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("opentelemetry.sdk")

import opentelemetry.trace as trace_api

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.worker import Worker

from ..conftest import AUTHORITY, authority_for
from ..otel import otel_providers  # noqa: F401 (the fixture "otel")

pytestmark = pytest.mark.django_db(transaction=True)


def points(reader) -> dict[tuple[str, str, str], float]:
    """{(metric, kind, principal): value (a sum, or a histogram's count)}, cumulative."""
    found: dict[tuple[str, str, str], float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (
                        metric.name,
                        point.attributes.get("scheduler.kind"),
                        point.attributes.get("scheduler.principal"),
                    )
                    found[key] = getattr(point, "value", None) or getattr(point, "count", 0)
    return found


def test_a_run_is_counted_timed_and_traced(otel):
    reader, exporter = otel
    registry.autodiscover()
    before = points(reader)
    scheduler.ensure_policy(AUTHORITY, max_runs=100, max_units=100)  # a budget, so it is measured
    scheduler.create_job("ok", "test.ok", authority=AUTHORITY)
    scheduler.create_job(
        "flaky",
        "test.flaky",
        authority=AUTHORITY,
        max_attempts=2,
        retry_base_delay=0.001,
        retry_max_delay=0.001,
    )
    scheduler.create_job("permanent", "test.permanent", authority=AUTHORITY)
    # An id no other test uses: the kernel remembers job rows by id (enqueuing._REMEMBERED),
    # across the databases that other tests flushed, and would label it with their kind.
    scheduler.create_job("otel-denied", "test.echo", authority=authority_for("nobody", "x.run"))
    scheduler.enqueue_many(
        "ok", [{"scheduled_for": 1_700_000_000_000 + i, "trigger_key": f"t{i}"} for i in range(2)]
    )
    for job_id in ("flaky", "permanent", "otel-denied"):
        scheduler.enqueue(job_id, scheduled_for=1_700_000_000_000, trigger_key="t")
    assert Worker(worker_id="w-otel", burst=True, concurrency=2, poll_interval=0.05).run() == 0

    after = points(reader)
    delta = {key: value - before.get(key, 0) for key, value in after.items() if value != before.get(key, 0)}
    alice, nobody = "user:alice", "user:nobody"
    expected = {
        ("scheduler.occurrences.enqueued", "test.ok", alice): 2,
        ("scheduler.occurrences.enqueued", "test.flaky", alice): 1,
        ("scheduler.occurrences.enqueued", "test.permanent", alice): 1,
        ("scheduler.occurrences.enqueued", "test.echo", nobody): 1,
        ("scheduler.occurrences.claimed", "test.ok", alice): 2,
        ("scheduler.occurrences.claimed", "test.flaky", alice): 2,
        ("scheduler.occurrences.claimed", "test.permanent", alice): 1,
        ("scheduler.occurrences.succeeded", "test.ok", alice): 2,
        ("scheduler.occurrences.failed", "test.flaky", alice): 1,
        ("scheduler.occurrences.succeeded", "test.flaky", alice): 1,
        ("scheduler.occurrences.dead_lettered", "test.permanent", alice): 1,
        ("scheduler.authority.denied", "test.echo", nobody): 1,
        ("scheduler.occurrences.dead_lettered", "test.echo", nobody): 1,
        ("scheduler.run.duration", "test.ok", alice): 2,
        ("scheduler.run.duration", "test.flaky", alice): 2,
        ("scheduler.run.duration", "test.permanent", alice): 1,
        ("scheduler.due.lag", "test.ok", alice): 2,
        ("scheduler.due.lag", "test.flaky", alice): 2,
        ("scheduler.due.lag", "test.permanent", alice): 1,
        # The retry reuses the flaky run's reservation: one charge per occurrence.
        ("scheduler.budget.runs", "test.ok", alice): 2,
        ("scheduler.budget.runs", "test.flaky", alice): 1,
        ("scheduler.budget.runs", "test.permanent", alice): 1,
        ("scheduler.budget.units", "test.ok", alice): 2,
        ("scheduler.budget.units", "test.flaky", alice): 1,
        ("scheduler.budget.units", "test.permanent", alice): 1,
    }
    assert delta == expected

    spans = exporter.get_finished_spans()
    assert Counter(span.name for span in spans) == {
        "scheduler.run test.ok": 2,
        "scheduler.run test.flaky": 2,
        "scheduler.run test.permanent": 1,
    }
    flaky = sorted(
        (s for s in spans if s.name == "scheduler.run test.flaky"),
        key=lambda s: s.attributes["scheduler.attempt"],
    )
    assert flaky[0].status.status_code == trace_api.StatusCode.ERROR
    assert flaky[0].status.description == "first attempt fails"
    assert [event.name for event in flaky[0].events] == ["exception"]
    assert flaky[0].events[0].attributes["exception.type"] == "RuntimeError"
    assert flaky[1].status.status_code == trace_api.StatusCode.UNSET
    assert flaky[1].attributes["scheduler.principal"] == alice
    assert flaky[1].attributes["scheduler.job_id"] == "flaky"
    assert flaky[1].kind == trace_api.SpanKind.CONSUMER


def test_batches_completed_and_follow_ups_enqueued_are_counted_after_the_commit(otel):
    from django.db import transaction

    from django_durable_scheduler import kernel

    reader, _ = otel
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("otel-export", "test.export", authority=AUTHORITY)
    scheduler.create_job("otel-report", "test.report", authority=AUTHORITY)
    before = points(reader)
    kernel.enqueue("otel-export", scheduled_for=1_700_000_000_000, trigger_key="t", then=["otel-report"])
    kernel.enqueue_batch(
        "otel-export", [{"scheduled_for": 1_700_000_000_000, "trigger_key": "m"}], callback="otel-report"
    )
    with pytest.raises(RuntimeError), transaction.atomic():  # rolled back: not counted
        kernel.enqueue("otel-export", scheduled_for=1_700_000_000_000, trigger_key="r", then=["otel-report"])
        (row,) = [r for r in kernel.claim_batch(owner="w", lease=60, limit=5) if r.trigger_key == "r"]
        kernel.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
        raise RuntimeError
    for row in kernel.claim_batch(owner="w", lease=60, limit=5):
        kernel.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    after = points(reader)
    delta = {key: value - before.get(key, 0) for key, value in after.items() if value != before.get(key, 0)}
    alice = "user:alice"
    assert delta[("scheduler.follow_ups.enqueued", "test.report", alice)] == 1
    assert delta[("scheduler.batches.completed", "test.report", alice)] == 1


def test_progress_reported_is_counted_as_units_done(otel):
    """``scheduler.progress.done`` grows by what ``done`` grew between a run's written reports:
    the first report (10) at once, the last (40) when the handler returns."""
    from django_durable_scheduler import testing

    reader, _ = otel
    kind = "test.progress-otel"

    def count(ctx):
        for done in (10, 25, 40):
            ctx.report_progress(done, 100)

    registry.handler(kind)(count)
    try:
        scheduler.ensure_policy(AUTHORITY)
        scheduler.create_job("otel-progress", kind, authority=AUTHORITY)
        scheduler.enqueue("otel-progress", scheduled_for=1_700_000_000_000, trigger_key="t")
        before = points(reader).get(("scheduler.progress.done", kind, "user:alice"), 0)
        (ran,) = testing.drain(kinds=[kind])
    finally:
        registry.unregister(kind)
    assert ran.status == "succeeded"
    assert points(reader)[("scheduler.progress.done", kind, "user:alice")] - before == 40
