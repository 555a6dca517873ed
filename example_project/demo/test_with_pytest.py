"""The same kind of tests in pytest's style, with pytest-django and this app's pytest plugin
(its fixtures ``scheduler_testing``, ``scheduler_drain`` and ``scheduler_clock``)."""

from __future__ import annotations

import django_durable_scheduler as scheduler


def test_the_view_enqueues_a_task_that_greets(client, scheduler_testing):
    response = client.get("/greet/", {"name": "Grace"})
    assert response.status_code == 202
    scheduler_testing.assert_enqueued(payload_contains={"args": ["Grace"]}, count=1)
    (run,) = scheduler_testing.drain()
    assert run.result == {"greeted": "Grace"}


def test_the_retry_runs_once_its_backoff_has_passed(scheduler_drain, scheduler_clock):
    scheduler.create_job("flaky", "demo.flaky", retry_base_delay=60)
    scheduler.enqueue("flaky", scheduled_for=scheduler_clock.now, trigger_key="once")
    assert [run.status for run in scheduler_drain()] == ["retry_wait"]
    scheduler_clock.advance(minutes=2)
    assert [(run.attempt, run.status) for run in scheduler_drain()] == [(2, "succeeded")]
