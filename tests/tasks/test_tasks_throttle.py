"""A ``django.tasks`` task with a throttle (``@durable(throttle=...)`` or the backend's
``OPTIONS``): calls over the rate are not dropped; they wait in the queue (``READY``, no
attempt used) and run at their turn, per key (docs/design.md, "Throttles")."""

from __future__ import annotations

import importlib.util
from datetime import timedelta

import pytest
from django.test import override_settings

import django_durable_scheduler as scheduler
from django_durable_scheduler import testing

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip("no task framework: Django 6 or the django-tasks backport", allow_module_level=True)

from django_durable_scheduler.models import Event, Job, Occurrence
from django_durable_scheduler.tasks.framework import TaskResultStatus
from tests.testapp import djtasks

pytestmark = pytest.mark.django_db
JOB = "task:default:default:tests.testapp.djtasks.call_api"


def statuses(results) -> list[str]:
    for result in results:
        result.refresh()
    return [result.status for result in results]


def test_calls_over_the_rate_queue_and_run_at_their_turn(clock):
    calls = [djtasks.call_api.enqueue(account="a", path=f"/{n}") for n in range(4)]
    other = djtasks.call_api.enqueue(account="b")
    job = Job.objects.get(pk=JOB)
    assert job.throttle == {"limit": 1, "period_ms": 60_000, "burst": 1, "key": "{throttleKey}"}
    assert Occurrence.objects.get(pk=calls[0].id).payload["throttleKey"] == "a"

    ran = testing.drain()
    # Account a: 1 + burst now; account b is not held up by a's backlog.
    assert sorted(str(run.result)[0] for run in ran) == ["a", "a", "b"]
    assert statuses([other]) == [TaskResultStatus.SUCCESSFUL]
    assert sorted(statuses(calls)) == sorted([TaskResultStatus.SUCCESSFUL] * 2 + [TaskResultStatus.READY] * 2)
    waiting = Occurrence.objects.filter(pk__in=[c.id for c in calls], status="queued").order_by(
        "available_at"
    )
    assert [row.attempt for row in waiting] == [0, 0]  # no attempt used
    assert [row.available_at - clock.current for row in waiting] == [
        timedelta(seconds=60),
        timedelta(seconds=120),
    ]
    assert not Event.objects.filter(occurrence__in=waiting).exclude(event_type="occurrence_enqueued")

    clock.advance(59)
    assert testing.drain() == []  # not before its turn
    clock.advance(1)
    assert [run.occurrence_id for run in testing.drain()] == [waiting[0].pk]
    clock.advance(60)
    assert [run.occurrence_id for run in testing.drain()] == [waiting[1].pk]
    assert statuses(calls) == [TaskResultStatus.SUCCESSFUL] * 4
    assert sorted(call.return_value for call in calls) == ["a/0", "a/1", "a/2", "a/3"]


def test_a_call_without_the_key_argument_is_refused_and_writes_nothing(clock):
    before = (Job.objects.count(), Occurrence.objects.count(), Event.objects.count())
    with pytest.raises(scheduler.InvalidArgument) as caught:
        djtasks.call_api.enqueue(path="/x")  # no account
    assert caught.value.details["field"] == "throttle.key"
    assert (Job.objects.count(), Occurrence.objects.count(), Event.objects.count()) == before


def test_the_backend_options_throttle_every_task_and_durable_wins(clock):
    tasks = {
        "default": {
            "BACKEND": "django_durable_scheduler.tasks.DurableBackend",
            "QUEUES": ["default", "high"],
            "OPTIONS": {"throttle": {"limit": 2, "period": 10, "key": "{b}"}},
        }
    }
    with override_settings(TASKS=tasks):
        added = [djtasks.add.enqueue(a=n, b=1) for n in range(3)]
        djtasks.call_api.enqueue(account="a")
    job = Job.objects.get(job_id="task:default:default:tests.testapp.djtasks.add")
    assert job.throttle == {"limit": 2, "period_ms": 10_000, "burst": 0, "key": "{throttleKey}"}
    assert Job.objects.get(pk=JOB).throttle["limit"] == 1  # @durable's, not OPTIONS'
    assert len(testing.drain()) == 2  # one add (its key is b), one call_api
    assert statuses(added).count(TaskResultStatus.READY) == 2
    clock.advance(5)  # 10 s / 2: the next add's turn
    assert len(testing.drain()) == 1
    assert statuses(added).count(TaskResultStatus.READY) == 1
