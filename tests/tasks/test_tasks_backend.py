"""The django.tasks backend (``django_durable_scheduler.tasks.DurableBackend``): what Django's
documentation says a backend does, on django.tasks (Django 6) or the django-tasks backport
(Django 5.2), and real ``runscheduler`` processes running tasks."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import signal
import threading
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.contrib.admin.utils import quote
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import override_settings
from django.urls import reverse
from django.utils.html import escape

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip(
        "no task framework: Django 6 or the django-tasks backport (pip install '.[tasks]')",
        allow_module_level=True,
    )

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.handlers import declared, registry
from django_durable_scheduler.models import Event, Job, Occurrence, OccurrenceStatus
from django_durable_scheduler.rules.triggers.descriptions import describe_trigger
from django_durable_scheduler.rules.validation import to_ms
from django_durable_scheduler.tasks import DurableBackend, durable, framework, schedule
from django_durable_scheduler.tasks.framework import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_durable_scheduler.tasks.handlers import durable_queues, run_task
from django_durable_scheduler.worker.context import ExecutionContext
from tests.testapp import djtasks

from ..procs.runner import Workers, wait_for

DEFAULT_KIND = "django.tasks:default"
HIGH_KIND = "django.tasks:high"


def claim(owner: str = "w1", kinds=(DEFAULT_KIND,)) -> Occurrence:
    occurrence = kernel.claim(owner=owner, lease=30, kinds=list(kinds))
    assert occurrence is not None
    return occurrence


def context_of(occurrence: Occurrence, owner: str = "w1") -> ExecutionContext:
    return ExecutionContext(
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
        enqueued_at=occurrence.created_at,
        claimed_at=occurrence.updated_at,
        priority=occurrence.priority,
    )


# --------------------------------------------------------------------------- enqueue


def test_the_backend_says_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, DurableBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
    assert framework.FRAMEWORK in ("django.tasks", "django_tasks")


def test_enqueue_writes_one_ready_occurrence_and_returns_its_result(db):
    sent = []
    task_enqueued.connect(receiver := lambda sender, task_result, **kw: sent.append(task_result))
    try:
        result = djtasks.add.enqueue(1, b=2)
    finally:
        task_enqueued.disconnect(receiver)
    assert result.status == TaskResultStatus.READY
    assert result.args == [1] and result.kwargs == {"b": 2}
    assert result.backend == "default" and result.task.module_path == "tests.testapp.djtasks.add"
    assert result.enqueued_at is not None and result.started_at is None and result.finished_at is None
    assert result.worker_ids == [] and result.errors == []
    assert [r.id for r in sent] == [result.id]
    occurrence = Occurrence.objects.select_related("job").get(pk=result.id)
    assert occurrence.status == OccurrenceStatus.QUEUED
    assert occurrence.payload == {
        "task": "tests.testapp.djtasks.add",
        "args": [1],
        "kwargs": {"b": 2},
        "backend": "default",
    }
    assert occurrence.job.kind == DEFAULT_KIND
    assert occurrence.job.job_id == "task:default:default:tests.testapp.djtasks.add"
    # Default principal, granted the queue's kind: the worker may run it.
    assert occurrence.authority["principal"] == {"type": "app", "id": "durable_scheduler"}
    assert scheduler.get_policy("app", "durable_scheduler").capabilities == [DEFAULT_KIND]
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    again = djtasks.add.enqueue(1, b=2)
    assert again.id != result.id and Occurrence.objects.filter(job=occurrence.job).count() == 2


def test_enqueue_joins_the_callers_transaction(db):
    with transaction.atomic():
        kept = djtasks.add.enqueue(1, 1)
    try:
        with transaction.atomic():
            dropped = djtasks.add.enqueue(2, 2)
            assert Occurrence.objects.filter(pk=dropped.id).exists()
            raise RuntimeError("the caller rolls back")
    except RuntimeError:
        pass
    assert Occurrence.objects.filter(pk=kept.id).exists()
    assert not Occurrence.objects.filter(pk=dropped.id).exists()


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((object(),), {}, TypeError),
        ((), {"when": {1, 2}}, TypeError),
        ((float("nan"),), {}, ValueError),
        ((b"\xff",), {}, ValueError),
        (("nul\x00",), {}, ValueError),
    ],
)
def test_arguments_that_do_not_round_trip_as_json_are_refused_and_nothing_is_written(db, args, kwargs, error):
    with pytest.raises(error):
        djtasks.add.enqueue(*args, **kwargs)
    assert not Occurrence.objects.exists()


def test_tuples_and_bytes_are_stored_as_django_normalizes_them(db):
    result = djtasks.add.enqueue((1, 2), b"text")
    assert result.args == [[1, 2], "text"]
    assert Occurrence.objects.get(pk=result.id).payload["args"] == [[1, 2], "text"]


def test_run_after_defers_the_task(db):
    later = djtasks.add.using(run_after=djtasks_now() + timedelta(hours=1))
    result = later.enqueue(1, 2)
    occurrence = Occurrence.objects.get(pk=result.id)
    assert to_ms(occurrence.available_at, "x") == to_ms(later.run_after, "x")
    assert kernel.claim(owner="w", lease=30, kinds=[DEFAULT_KIND]) is None
    assert djtasks.add.get_result(result.id).task.run_after == occurrence.available_at


def djtasks_now():
    from django.utils import timezone

    return timezone.now()


def test_a_queue_the_backend_does_not_list_is_refused(db):
    with pytest.raises(InvalidTask):
        djtasks.add.using(queue_name="nowhere")
    result = djtasks.shout.enqueue("hi")
    assert Occurrence.objects.get(pk=result.id).job.kind == HIGH_KIND
    assert result.task.queue_name == "high"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"QUEUES": "default"}, "QUEUES'] must list"),
        ({"QUEUES": ["ok", " padded "]}, "QUEUES'][1]"),
        ({"QUEUES": ["x" * 200]}, "QUEUES'][0]"),
        ({"OPTIONS": {"max_attempts": 0}}, "OPTIONS'].max_attempts"),
        ({"OPTIONS": {"retries": 2}}, "OPTIONS'].retries"),
        ({"OPTIONS": {"principal": {"type": "team"}}}, "OPTIONS'].principal"),
        ({"OPTIONS": {"retry_base_delay": 10, "retry_max_delay": 1}}, "retry_max_delay"),
    ],
)
def test_bad_backend_settings_are_refused_naming_the_setting(params, message):
    with pytest.raises(ImproperlyConfigured, match=message.replace("[", r"\[").replace("]", r"\]")):
        DurableBackend("broken", params)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_attempts": 0}, "durable.max_attempts"),
        ({"max_attempts": 33}, "durable.max_attempts"),
        ({"retry_base_delay": -1}, "durable.retry_base_delay"),
        ({"retry_base_delay": 5, "retry_max_delay": 1}, "durable.retry_max_delay"),
        ({"principal": {"type": "team", "id": "x", "extra": 1}}, "durable.principal"),
        ({"timeout": 0}, "durable.timeout"),
        ({"timeout": "soon"}, "durable.timeout"),
    ],
)
def test_bad_task_options_are_refused_where_they_are_written(options, field):
    with pytest.raises(scheduler.InvalidArgument) as caught:
        durable(**options)
    assert caught.value.details["field"].startswith(field)


def test_the_worker_registers_one_handler_per_configured_queue():
    assert registry.get_handler(DEFAULT_KIND).func is run_task
    assert registry.get_handler(HIGH_KIND).func is run_task
    tasks = {
        "durable": {"BACKEND": "django_durable_scheduler.tasks.DurableBackend", "QUEUES": ["a", "b"]},
        "immediate": {"BACKEND": f"{framework.FRAMEWORK}.backends.immediate.ImmediateBackend"},
        "missing": {"BACKEND": "nowhere.Backend"},
    }
    with override_settings(TASKS=tasks):
        assert durable_queues() == {"durable": ["a", "b"]}
    bad = {"durable": {"BACKEND": "django_durable_scheduler.tasks.DurableBackend", "QUEUES": ["a", ""]}}
    with override_settings(TASKS=bad), pytest.raises(ImproperlyConfigured, match=r"QUEUES'\]\[1\]"):
        durable_queues()


def test_a_task_of_an_unknown_backend_fails_for_good(db):
    result = djtasks.add.enqueue(1, 1)
    occurrence = claim()
    ctx = context_of(occurrence)
    ctx.payload = {**ctx.payload, "backend": "gone"}
    with pytest.raises(scheduler.PermanentFailure, match="'gone' is not configured"):
        run_task(ctx)
    assert result.id == occurrence.pk


def test_a_disabled_task_job_pauses_the_task(db):
    first = djtasks.add.enqueue(1, 1)
    job = Occurrence.objects.get(pk=first.id).job
    scheduler.update_job(job.job_id, expected_revision=job.revision, enabled=False)
    with pytest.raises(scheduler.JobDisabled):
        djtasks.add.enqueue(2, 2)
    assert kernel.claim(owner="w", lease=30, kinds=[DEFAULT_KIND]) is None  # it waits
    assert djtasks.add.get_result(first.id).status == TaskResultStatus.READY


def test_get_result_of_an_unknown_or_foreign_id_does_not_exist(db, job):
    other, _ = scheduler.enqueue("job-a", scheduled_for=1_700_000_000_000, trigger_key="t")
    for result_id in ("nope", "occ_" + "0" * 64, other.pk, 42):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(result_id)


# --------------------------------------------------------------------------- results


def test_the_result_follows_the_occurrence(db):
    result = djtasks.add.enqueue(2, 3)
    occurrence = claim("w1")
    assert occurrence.pk == result.id
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == ["w1"] and result.attempts == 1
    assert result.started_at == result.last_attempted_at is not None
    kernel.settle(result.id, owner="w1", fence=occurrence.fence, outcome="failed", error="boom", retry_at=0)
    result.refresh()
    assert result.status == TaskResultStatus.READY  # retry_wait
    occurrence = claim("w2")
    kernel.settle(result.id, owner="w2", fence=occurrence.fence, outcome="succeeded", result=5)
    fresh = djtasks.add.get_result(result.id)
    assert fresh.status == TaskResultStatus.SUCCESSFUL and fresh.return_value == 5
    assert fresh.worker_ids == ["w1", "w2"] and fresh.finished_at is not None
    assert fresh.last_attempted_at >= fresh.started_at


def test_cancelled_and_dead_lettered_tasks_are_failed_with_an_error(db):
    cancelled = djtasks.add.enqueue(1, 1)
    scheduler.cancel(cancelled.id, reason="not wanted")
    cancelled.refresh()
    assert cancelled.status == TaskResultStatus.FAILED and cancelled.is_finished
    [error] = cancelled.errors
    assert error.exception_class_path == "django_durable_scheduler.exceptions.SchedulerError"
    assert "not wanted" in error.traceback and issubclass(error.exception_class, Exception)
    with pytest.raises(ValueError, match="failed"):
        cancelled.return_value  # noqa: B018


def test_an_async_task_asked_to_stop_is_cancelled_at_its_next_await(db):
    djtasks.async_wait.enqueue(60)
    occurrence = claim("w1")
    ctx = context_of(occurrence, "w1")
    threading.Timer(0.2, ctx.mark_cancel_requested).start()  # as the heartbeat does
    with pytest.raises(scheduler.OccurrenceCancelled):
        task_backends["default"].run(ctx)
    assert djtasks.async_wait.enqueue(0) is not None  # the next one runs normally
    assert task_backends["default"].run(context_of(claim("w2"), "w2")) == "waited"


def test_running_a_task_sends_djangos_signals_and_keeps_each_attempts_error(db, tmp_path):
    seen = []

    def record(signal, sender, task_result, **kwargs):
        seen.append((signal, task_result.status, len(task_result.errors)))

    receivers = [
        (s, lambda sender, task_result, s=s, **kw: record(s, sender, task_result))
        for s in (task_started, task_finished)
    ]
    for sig, receiver in receivers:
        sig.connect(receiver)
    try:
        result = djtasks.flaky.enqueue(str(tmp_path))
        backend = task_backends["default"]
        for attempt, owner in ((1, "w1"), (2, "w2")):
            occurrence = claim(owner)
            with pytest.raises(RuntimeError, match=f"flaky run {attempt - 1}"):
                backend.run(context_of(occurrence, owner))
            kernel.settle(
                result.id, owner=owner, fence=occurrence.fence, outcome="failed", error="x", retry_at=0
            )
        occurrence = claim("w3")
        assert backend.run(context_of(occurrence, "w3")) == 2
        kernel.settle(result.id, owner="w3", fence=occurrence.fence, outcome="succeeded", result=2)
    finally:
        for sig, receiver in receivers:
            sig.disconnect(receiver)
    assert seen == [
        (task_started, TaskResultStatus.RUNNING, 0),
        (task_finished, TaskResultStatus.READY, 1),
        (task_started, TaskResultStatus.RUNNING, 1),
        (task_finished, TaskResultStatus.READY, 2),
        (task_started, TaskResultStatus.RUNNING, 2),
        (task_finished, TaskResultStatus.SUCCESSFUL, 2),
    ]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "flaky run 0" in result.errors[0].traceback and result.errors[0].exception_class is RuntimeError
    assert result.worker_ids == ["w1", "w2", "w3"]


def test_a_running_task_sees_what_get_result_says(db, tmp_path):
    """The worker builds the running result from its context on a first claim and in one
    query on a later one: either must match get_result's two."""
    seen = []

    def record(sender, task_result, **kwargs):
        # A copy: the backend updates its result after a failure.
        seen.append((copy.copy(task_result), task_backends["default"].get_result(task_result.id)))

    task_started.connect(record)
    try:
        result = djtasks.flaky.using(priority=7).enqueue(str(tmp_path))
        backend = task_backends["default"]
        for owner in ("w1", "w2"):
            occurrence = claim(owner)
            with pytest.raises(RuntimeError):
                backend.run(context_of(occurrence, owner))
            kernel.settle(
                result.id, owner=owner, fence=occurrence.fence, outcome="failed", error="x", retry_at=0
            )
    finally:
        task_started.disconnect(record)
    assert len(seen) == 2
    for running, read in seen:
        assert running.status == read.status == TaskResultStatus.RUNNING
        for name in ("enqueued_at", "started_at", "last_attempted_at", "worker_ids", "args", "kwargs"):
            assert getattr(running, name) == getattr(read, name), name
        assert running.errors == read.errors
        assert running.task.priority == read.task.priority == 7
        assert running.task.queue_name == read.task.queue_name
    assert seen[1][0].worker_ids == ["w1", "w2"] and len(seen[1][0].errors) == 1


def test_the_admin_shows_a_task_in_djangos_words(admin_client, tmp_path):
    result = djtasks.flaky.enqueue(str(tmp_path), note="<b>x</b>")
    occurrence = claim("w1")
    with pytest.raises(RuntimeError):
        task_backends["default"].run(context_of(occurrence))
    kernel.settle(result.id, owner="w1", fence=occurrence.fence, outcome="failed", error="x", retry_at=0)
    plain, _ = scheduler.enqueue(
        scheduler.create_job("plain", "reports.send").job_id, scheduled_for=1_700_000_000_000, trigger_key="t"
    )
    listing = admin_client.get(reverse("admin:durable_scheduler_occurrence_changelist")).content.decode()
    assert "tests.testapp.djtasks.flaky (READY)" in listing
    page = admin_client.get(reverse("admin:durable_scheduler_occurrence_change", args=[quote(result.id)]))
    html = page.content.decode()
    assert "tests.testapp.djtasks.flaky" in html and "READY" in html
    assert escape('{"note":"<b>x</b>"}') in html and escape(f'["{tmp_path}"]') in html
    assert "builtins.RuntimeError" in html and "flaky run 0" in html and "<b>x</b>" not in html
    other = admin_client.get(reverse("admin:durable_scheduler_occurrence_change", args=[quote(plain.pk)]))
    assert other.status_code == 200 and "task status" not in other.content.decode()


# --------------------------------------------------------------------------- options


def test_attempts_backoff_and_principal_come_from_the_task_or_the_backend(db):
    djtasks.flaky.enqueue("unused")
    job = Job.objects.get(job_id="task:default:default:tests.testapp.djtasks.flaky")
    assert (job.max_attempts, job.retry_base_delay_ms, job.retry_max_delay_ms) == (3, 50, 50)
    tasks = {
        "default": {
            "BACKEND": "django_durable_scheduler.tasks.DurableBackend",
            "QUEUES": ["default", "high"],
            "OPTIONS": {"max_attempts": 5, "timeout": 90, "principal": {"type": "team", "id": "ops"}},
        }
    }
    with override_settings(TASKS=tasks):
        djtasks.add.enqueue(1, 1)
        djtasks.flaky.enqueue("unused")
    add_job = Job.objects.get(job_id="task:default:default:tests.testapp.djtasks.add")
    assert add_job.max_attempts == 5 and add_job.timeout_ms == 90_000
    assert add_job.authority["principal"] == {"type": "team", "id": "ops"}
    assert add_job.authority["requestedCapabilities"] == [DEFAULT_KIND]
    job.refresh_from_db()
    assert job.max_attempts == 3  # @durable wins over OPTIONS
    # Back to the settings: the job follows again (a new revision).
    djtasks.add.enqueue(1, 1)
    add_job.refresh_from_db()
    assert add_job.max_attempts == 3 and add_job.authority["principal"]["type"] == "app"
    assert add_job.timeout_ms is None


def test_priority_runs_higher_first_within_a_principal_and_principals_take_turns(db):
    scheduler.set_policy(
        "team", "other", capabilities=[DEFAULT_KIND], window=3600, max_runs=1000, max_units=1000
    )
    low = djtasks.add.using(priority=-5).enqueue(0, 0)
    plain = djtasks.add.enqueue(0, 1)
    high = djtasks.add.using(priority=50).enqueue(0, 2)
    higher = djtasks.add.using(priority=100).enqueue(0, 3)
    others = djtasks.as_other.enqueue()
    claimed = [o.pk for o in kernel.claim_batch(owner="w", lease=30, limit=5, kinds=[DEFAULT_KIND])]
    # Rank 1 of each principal first (the default principal's highest, the other's only one),
    # then the default principal's others by priority.
    assert set(claimed[:2]) == {higher.id, others.id}
    assert claimed[2:] == [high.id, plain.id, low.id]
    assert Occurrence.objects.get(pk=high.id).priority == 50


@pytest.fixture
def scheduled():
    """Schedules a test declares, forgotten after it (declarations are process-wide)."""
    made = []
    yield made
    for declaration in made:
        declared.undeclare(declaration.job_id)


def test_a_scheduled_task_runs_once_per_slot_as_a_task(db, clock, scheduled):
    # clock: 2026-01-05 12:00 UTC, 13:00 in Berlin.
    scheduled.append(
        schedule(djtasks.add, cron="30 13 * * *", timezone="Europe/Berlin", args=(1,), kwargs={"b": 2})
    )
    scheduled.append(schedule(djtasks.shout, every=60, args=["hey"], name="shouting", misfire="skip"))
    assert declared.sync_declared_jobs()["created"] == [
        "task-schedule:default:shouting",
        "task-schedule:default:tests.testapp.djtasks.add",
    ]
    job = Job.objects.get(job_id="task-schedule:default:tests.testapp.djtasks.add")
    assert job.kind == DEFAULT_KIND and scheduled[0].module == __name__  # the declaring module
    assert (job.trigger["cron"], job.trigger["timezone"]) == ("30 13 * * *", "Europe/Berlin")
    clock.advance(minutes=31)
    assert kernel.materialize_due() >= 1
    assert kernel.materialize_due() == 0  # a slot fires once
    occurrence = claim("w1")
    assert occurrence.job_id == job.job_id and occurrence.trigger_key.startswith("schedule:2026-01-05T12:30")
    assert task_backends["default"].run(context_of(occurrence)) == 3
    kernel.settle(occurrence.pk, owner="w1", fence=occurrence.fence, outcome="succeeded", result=3)
    result = djtasks.add.get_result(occurrence.pk)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    assert result.args == [1] and result.kwargs == {"b": 2}
    shouted = claim("w1", kinds=[HIGH_KIND])
    assert task_backends["default"].run(context_of(shouted)) == "HEY"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, scheduler.InvalidArgument, "exactly one of cron, every and at"),
        ({"cron": "* * *", "every": 5}, scheduler.InvalidArgument, "exactly one"),
        ({"cron": "61 * * * *"}, scheduler.InvalidArgument, "trigger.cron"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, scheduler.InvalidArgument, "trigger.timezone"),
        ({"every": 5, "overlap": "sometimes"}, scheduler.InvalidArgument, "trigger.overlap"),
        ({"every": 5, "args": [object()]}, TypeError, "Unsupported type"),
        ({"every": 5, "name": ""}, scheduler.InvalidArgument, "name"),
    ],
)
def test_a_bad_schedule_is_refused_where_it_is_written(kwargs, error, message):
    with pytest.raises(error, match=message):
        schedule(djtasks.add, **kwargs)
    assert not [d for d in declared.declared_jobs() if d.job_id.startswith("task-schedule:")]


def test_runscheduler_refuses_a_queue_no_backend_lists():
    with pytest.raises(CommandError, match="nowhere is not a queue"):
        call_command("runscheduler", "--queues", "default,nowhere", "--once")


# --------------------------------------------------------------------------- schedules in the admin

SCHEDULES = "admin:durable_scheduler_taskschedule"


def schedule_form(**fields):
    """The admin's add form for a task schedule, filled in; ``fields`` override."""
    data = {
        "name": "",
        "task": "tests.testapp.djtasks.add",
        "trigger": '{"cron": "30 13 * * *", "timezone": "Europe/Berlin"}',
        "args": "[1]",
        "kwargs": '{"b": 2}',
        "enabled": "on",
        "loaded_revision": "0",
    }
    data.update(fields)
    return {key: value for key, value in data.items() if value is not None}


def test_a_schedule_made_in_the_admin_runs_the_task_once_per_slot(admin_client, clock):
    response = admin_client.post(reverse(f"{SCHEDULES}_add"), schedule_form(name="berlin-lunch"))
    assert response.status_code == 302, response.content.decode()
    job = Job.objects.get()
    assert job.job_id == "task-schedule:default:berlin-lunch" and job.kind == DEFAULT_KIND
    assert job.payload == {
        "task": "tests.testapp.djtasks.add",
        "args": [1],
        "kwargs": {"b": 2},
        "backend": "default",
    }
    assert job.declared_in is None and job.trigger["timezone"] == "Europe/Berlin"
    # What schedule() would declare for the task: its options, principal and queue.
    assert job.max_attempts == 3 and job.authority["principal"] == {"type": "app", "id": "durable_scheduler"}
    clock.advance(minutes=31)  # 12:30 UTC is 13:30 in Berlin
    assert kernel.materialize_due() == 1 and kernel.materialize_due() == 0
    occurrence = claim("w1")
    assert task_backends["default"].run(context_of(occurrence)) == 3
    listing = admin_client.get(reverse(f"{SCHEDULES}_changelist")).content.decode()
    assert "berlin-lunch" in listing and "tests.testapp.djtasks.add" in listing
    assert escape(describe_trigger(job.trigger)) in listing
    found = admin_client.get(reverse(f"{SCHEDULES}_changelist"), {"q": "djtasks.add"})
    assert [j.pk for j in found.context["cl"].result_list] == [job.pk]  # by the task's path
    found = admin_client.get(reverse(f"{SCHEDULES}_changelist"), {"q": "shout"})
    assert list(found.context["cl"].result_list) == []


def test_editing_a_schedule_in_the_admin_makes_a_revision(admin_client, clock):
    admin_client.post(reverse(f"{SCHEDULES}_add"), schedule_form())
    job = Job.objects.get()
    assert job.job_id == "task-schedule:default:tests.testapp.djtasks.add"  # no name: the task's path
    url = reverse(f"{SCHEDULES}_change", args=[quote(job.pk)])
    page = admin_client.get(url).content.decode()
    assert "tests.testapp.djtasks.add" in page and "Recent occurrences" in page
    edited = schedule_form(
        name=None, task="tests.testapp.djtasks.shout", trigger='{"every": 60}', args='["hi"]', kwargs="{}"
    )
    edited["loaded_revision"] = str(job.revision)
    assert admin_client.post(url, edited).status_code == 302
    job.refresh_from_db()
    assert job.revision == 2 and job.kind == HIGH_KIND and job.trigger["every"] == 60
    assert job.payload["task"] == "tests.testapp.djtasks.shout" and job.payload["args"] == ["hi"]
    # Someone else's change in between: refused, nothing written.
    stale = admin_client.post(url, {**edited, "kwargs": '{"x": 1}'})
    assert "changed by someone else" in stale.content.decode()
    job.refresh_from_db()
    assert job.revision == 2


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"task": "tests.testapp.djtasks.nothing_here"}, "task", "nothing to import"),
        ({"task": "no_such_module.task"}, "task", "nothing to import"),
        ({"task": "tests.testapp.djtasks.Path"}, "task", "must be a task"),
        ({"task": "tests.testapp.broken_tasks.anything"}, "task", "RuntimeError: this module is broken"),
        ({"trigger": '{"cron": "61 * * * *"}'}, "trigger", "trigger.cron"),
        ({"trigger": '{"cron": "0 9 * * *", "timezone": "Mars/Olympus"}'}, "trigger", "trigger.timezone"),
        ({"trigger": "{not json"}, "trigger", "Enter a valid JSON"),
        ({"args": '{"a": 1}'}, "args", "must be a list"),
        ({"kwargs": "[1]"}, "kwargs", "must be a dict"),
        ({"kwargs": "[]"}, "kwargs", "must be a dict"),
        ({"args": "{}"}, "args", "must be a list"),
        ({"kwargs": '{"x": NaN}'}, "kwargs", "Unsupported value in task kwargs"),
        ({"args": "[NaN]"}, "args", "Unsupported value in task args"),
        ({"task": ""}, "task", "required"),
        ({"name": "x" * 300}, "name", "at most 200"),
    ],
)
def test_a_bad_schedule_in_the_admin_names_the_field_and_writes_nothing(admin_client, fields, field, message):
    response = admin_client.post(reverse(f"{SCHEDULES}_add"), schedule_form(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors and message in " ".join(errors[field]), errors
    assert not Job.objects.exists()


def test_a_task_on_another_backend_cannot_be_scheduled_in_the_admin(admin_client, settings, monkeypatch):
    settings.TASKS = {
        **settings.TASKS,
        "immediate": {"BACKEND": f"{framework.FRAMEWORK}.backends.immediate.ImmediateBackend"},
    }
    elsewhere = framework.task(backend="immediate")(djtasks.elsewhere)
    monkeypatch.setattr(djtasks, "elsewhere_task", elsewhere, raising=False)
    response = admin_client.post(
        reverse(f"{SCHEDULES}_add"), schedule_form(task="tests.testapp.djtasks.elsewhere_task")
    )
    errors = response.context["adminform"].form.errors
    assert "which is not a DurableBackend" in " ".join(errors["task"]), errors
    assert not Job.objects.exists()


def test_a_schedule_declared_in_code_is_shown_not_edited(admin_client, scheduled):
    scheduled.append(djtasks.declare_a_schedule())
    declared.sync_declared_jobs()
    assert Job.objects.get().declared_in == "testapp"
    scheduler.create_job("plain", "reports.send")  # not a task schedule: listed with the jobs only
    listing = admin_client.get(reverse(f"{SCHEDULES}_changelist"))
    assert [job.pk for job in listing.context["cl"].result_list] == [
        "task-schedule:default:tests.testapp.djtasks.add"
    ]
    page = admin_client.get(
        reverse(f"{SCHEDULES}_change", args=[quote("task-schedule:default:tests.testapp.djtasks.add")])
    )
    html = page.content.decode()
    assert page.status_code == 200 and 'name="_save"' not in html and "tests.testapp.djtasks.add" in html


# --------------------------------------------------------------------------- real workers


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def run_async(awaitable):
    """Run ``awaitable`` as an async view would; then close the database connection that
    the framework's ``sync_to_async`` thread opened (it would outlive the test database)."""

    async def run():
        try:
            return await awaitable
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    return asyncio.run(run())


def _finished(*results) -> bool:
    """Whether every result's occurrence has settled (one query); then refreshed."""
    ids = [result.id for result in results]
    if Occurrence.objects.filter(pk__in=ids, settled_at__isnull=False).count() < len(ids):
        return False
    for result in results:
        result.refresh()
    return True


@pytest.mark.django_db(transaction=True)
def test_racing_runschedulers_run_the_tasks_of_their_queues_once_each(workers, tmp_path):
    (marks := tmp_path / "flaky").mkdir()
    (runs := tmp_path / "runs").mkdir()
    added = djtasks.add.enqueue(2, b=3)
    async_added = run_async(djtasks.async_add.aenqueue(4, 5))
    with_context = djtasks.attempts_seen.enqueue("m")
    flaky = djtasks.flaky.enqueue(str(marks))
    doomed = djtasks.doomed.enqueue()
    not_json = djtasks.not_json.enqueue()
    retried = djtasks.retry_once.enqueue(str(tmp_path))
    elsewhere = djtasks.shout.enqueue("hi")  # queue "high": not these workers'
    with transaction.atomic():
        marked = [djtasks.mark.enqueue(str(runs)) for _ in range(24)]
    racers = [
        workers.start("--queues", "default", "--worker-id", f"tw{n}", "--concurrency", "4") for n in (1, 2)
    ]
    results = (added, async_added, with_context, flaky, doomed, not_json, retried, *marked)
    assert wait_for(lambda: _finished(*results), timeout=30, interval=0.1), "".join(
        racer.output() for racer in racers
    )
    assert added.return_value == 5
    assert async_added.return_value == 9
    assert run_async(djtasks.async_add.aget_result(async_added.id)).return_value == 9
    assert with_context.return_value == {"attempt": 1, "id": with_context.id, "marker": "m"}
    assert flaky.status == TaskResultStatus.SUCCESSFUL and flaky.return_value == 2
    assert len(flaky.worker_ids) == 3 and set(flaky.worker_ids) <= {"tw1", "tw2"}
    assert [e.exception_class_path for e in flaky.errors] == ["builtins.RuntimeError"] * 2
    assert doomed.status == TaskResultStatus.FAILED and doomed.attempts == 1
    assert [e.exception_class_path for e in doomed.errors] == [
        "django_durable_scheduler.exceptions.PermanentFailure"
    ]
    assert not_json.status == TaskResultStatus.FAILED and not_json.attempts == 1
    assert [e.exception_class_path for e in not_json.errors] == ["builtins.TypeError"]
    assert retried.return_value == "retried" and retried.attempts == 2
    assert [e.exception_class_path for e in retried.errors] == ["django_durable_scheduler.exceptions.Retry"]
    # Exactly once: each task ran one time, by the worker that claimed it.
    for result in marked:
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert (runs / result.id).read_text().splitlines() == result.worker_ids
    elsewhere.refresh()
    assert elsewhere.status == TaskResultStatus.READY and elsewhere.worker_ids == []
    for racer in racers:
        racer.proc.send_signal(signal.SIGTERM)
        assert racer.wait(30) == 0, racer.output()


@pytest.mark.django_db(transaction=True)
def test_a_task_whose_worker_crashed_is_reclaimed_by_another(workers, tmp_path):
    result = djtasks.die_once.enqueue(str(tmp_path))
    # Both at once: whichever takes the task first dies of it, the other reclaims it.
    started = {
        name: workers.start("--worker-id", name, "--lease", "1", "--queues", "default")
        for name in ("w-a", "w-b")
    }
    assert wait_for(lambda: _finished(result), timeout=30), "".join(w.output() for w in started.values())
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "survived"
    dead, rescuer = result.worker_ids
    assert dead != rescuer
    assert started[dead].wait(30) != 0  # the task killed it mid-run
    started[rescuer].proc.send_signal(signal.SIGTERM)
    assert started[rescuer].wait(30) == 0, started[rescuer].output()


@pytest.mark.django_db(transaction=True)
def test_a_backlog_of_high_priority_tasks_does_not_starve_another_principals(workers):
    # The default principal's backlog, all at the top priority, ahead in due time; then
    # another principal's tasks at the bottom priority. Priority orders within a principal:
    # a real worker still takes the principals in turn.
    scheduler.set_policy(
        "team", "other", capabilities=[DEFAULT_KIND], window=3600, max_runs=1000, max_units=1000
    )
    with transaction.atomic():
        backlog = [djtasks.add.using(priority=100).enqueue(n, 0) for n in range(200)]
    with transaction.atomic():
        late = {djtasks.as_other.using(priority=-100).enqueue().id for _ in range(10)}
    proc = workers.start(
        "--worker-id", "fair", "--concurrency", "2", "--max-occurrences", "60", "--queues", "default"
    )
    assert proc.wait(120) == 0, proc.output()
    claimed = list(
        Event.objects.filter(event_type="occurrence_claimed")
        .order_by("event_id")
        .values_list("occurrence_id", flat=True)
    )
    positions = [i for i, pk in enumerate(claimed) if pk in late]
    assert len(claimed) == 60 and len(positions) == 10, positions
    assert max(positions) < 30, positions
    assert Occurrence.objects.filter(pk__in=late, status="succeeded").count() == 10
    assert {r.id for r in backlog} & set(claimed)  # and the backlog ran beside them


# --------------------------------------------------------------------------- unique and debounce


def test_a_unique_task_returns_the_waiting_result_for_the_same_arguments(db):
    sent = []
    task_enqueued.connect(receiver := lambda sender, task_result, **kw: sent.append(task_result.id))
    try:
        first = djtasks.refresh.enqueue(42)
        again = djtasks.refresh.enqueue(42)
        other = djtasks.refresh.enqueue(43)
    finally:
        task_enqueued.disconnect(receiver)
    assert again.id == first.id and other.id != first.id
    assert again.args == [42] and again.status == TaskResultStatus.READY
    assert sent == [first.id, other.id]  # the second call enqueued nothing
    occurrence = claim()
    assert occurrence.pk == first.id
    # Running: the key is free again ("pending"), so the same arguments are a new task.
    assert djtasks.refresh.enqueue(42).id not in (first.id, other.id)


def test_an_active_unique_task_returns_the_running_one(db):
    first = djtasks.rebuild.enqueue()
    claim()
    again = djtasks.rebuild.enqueue()
    assert again.id == first.id and again.status == TaskResultStatus.RUNNING


def test_a_debounced_task_takes_the_newest_arguments_and_starts_later(db):
    first = djtasks.summarize.enqueue(7, note="a")
    start = Occurrence.objects.get(pk=first.id).available_at
    second = djtasks.summarize.enqueue(7, note="b")
    assert second.id == first.id and second.kwargs == {"note": "b"}
    stored = Occurrence.objects.get(pk=first.id)
    assert stored.payload["kwargs"] == {"note": "b"} and stored.available_at >= start
    assert Event.objects.filter(occurrence=stored, event_type="occurrence_debounced").count() == 1
    assert djtasks.summarize.enqueue(8).id != first.id  # another customer, another key
    later = djtasks_now() + timedelta(hours=2)
    djtasks.summarize.using(run_after=later).enqueue(7, note="c")
    stored.refresh_from_db()
    assert stored.payload["kwargs"] == {"note": "c"}
    assert abs((stored.available_at - later).total_seconds()) < 1  # run_after is the debounced start
    assert kernel.claim(owner="w", lease=30, kinds=[DEFAULT_KIND]) is None


def test_a_debounced_task_with_a_cap_runs_by_it_however_many_calls_come(db, clock):
    first = djtasks.digest.enqueue(7)
    start = clock()
    for _ in range(8):
        clock.advance(10)
        assert djtasks.digest.enqueue(7).id == first.id
    stored = Occurrence.objects.get(pk=first.id)
    assert stored.available_at == start + timedelta(seconds=60)
    # A run_after past the cap is held to it too.
    other = djtasks.digest.using(run_after=clock() + timedelta(hours=1)).enqueue(8)
    assert Occurrence.objects.get(pk=other.id).available_at == clock() + timedelta(seconds=60)
    assert claim().pk == first.id  # due since first call + 60 s
    assert kernel.claim(owner="w", lease=30, kinds=[DEFAULT_KIND]) is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"debounce_max_wait": 60}, "durable.debounce_max_wait"),
        ({"debounce": 30, "debounce_max_wait": 10}, "durable.debounce_max_wait"),
        ({"debounce": 30, "debounce_max_wait": "1m"}, "durable.debounce_max_wait"),
        ({"unique_key": 5}, "durable.unique_key"),
        ({"unique_key": ""}, "durable.unique_key"),
        ({"unique_key": "a\x00b"}, "durable.unique_key"),
        ({"unique_key": True, "unique_while": "always"}, "durable.unique_while"),
        ({"debounce": -1}, "durable.debounce"),
        ({"debounce": "soon"}, "durable.debounce"),
        ({"debounce": 5, "unique_while": "pending"}, "durable.unique_while"),
    ],
)
def test_bad_unique_options_are_refused_where_they_are_written(options, field):
    with pytest.raises(scheduler.InvalidArgument) as caught:
        durable(**options)
    assert caught.value.details["field"] == field


def test_a_key_callable_returning_a_bad_key_is_refused_and_nothing_written(db):
    with pytest.raises(scheduler.InvalidArgument) as caught:
        djtasks.badly_keyed.enqueue(5)
    assert caught.value.details["field"] == "unique_key"
    assert not Occurrence.objects.exists() and not Job.objects.exists()


def test_a_tasks_concurrency_limit_and_key_come_from_durable_and_options(db):
    customer = djtasks.per_customer.enqueue(customer="c1")
    job = Job.objects.get(job_id="task:default:default:tests.testapp.djtasks.per_customer")
    assert (job.concurrency, job.concurrency_key) == (1, "{concurrencyKey}")
    assert Occurrence.objects.get(pk=customer.id).concurrency_key == "c1"
    account = djtasks.per_account.enqueue(7, since="monday")
    assert Occurrence.objects.get(pk=account.id).concurrency_key == "account-7"
    djtasks.per_customer.enqueue(customer="c1")
    djtasks.per_customer.enqueue(customer="c2")
    # One run per customer at once: c1's second waits while c1's first runs.
    claimed = scheduler.claim_batch(owner="w", lease=60, limit=10, kinds=[DEFAULT_KIND])
    by_key = sorted(row.concurrency_key for row in claimed if row.job_id == job.job_id)
    assert by_key == ["c1", "c2"]
    # @durable's limit and key win over the backend's OPTIONS.
    tasks = {
        "default": {
            "BACKEND": "django_durable_scheduler.tasks.DurableBackend",
            "QUEUES": ["default", "high"],
            "OPTIONS": {"concurrency": 3, "concurrency_key": "{word}"},
        }
    }
    with override_settings(TASKS=tasks):
        result = djtasks.per_customer.enqueue(customer="c3")
    job.refresh_from_db()
    assert job.concurrency == 1 and Occurrence.objects.get(pk=result.id).concurrency_key == "c3"


def test_the_backend_options_give_every_task_a_limit(db):
    tasks = {
        "default": {
            "BACKEND": "django_durable_scheduler.tasks.DurableBackend",
            "QUEUES": ["default", "high"],
            "OPTIONS": {"concurrency": 3, "concurrency_key": "{b}"},
        }
    }
    with override_settings(TASKS=tasks):
        result = djtasks.add.enqueue(a=1, b=2)
    job = Job.objects.get(job_id="task:default:default:tests.testapp.djtasks.add")
    assert (job.concurrency, job.concurrency_key) == (3, "{concurrencyKey}")
    assert Occurrence.objects.get(pk=result.id).concurrency_key == "2"
    djtasks.add.enqueue(1, 2)  # back to no options: the job follows
    job.refresh_from_db()
    assert (job.concurrency, job.concurrency_key) == (None, None)


def test_a_task_key_that_cannot_be_computed_refuses_the_enqueue_and_writes_nothing(db):
    before = (Job.objects.count(), Occurrence.objects.count(), Event.objects.count())
    with pytest.raises(scheduler.InvalidArgument) as caught:
        djtasks.per_customer.enqueue(client="c1")
    assert caught.value.details["field"] == "concurrency_key"
    assert (Job.objects.count(), Occurrence.objects.count(), Event.objects.count()) == before


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"concurrency": 0}, "durable.concurrency"),
        ({"concurrency": 10_001}, "durable.concurrency"),
        ({"concurrency": "2"}, "durable.concurrency"),
        ({"concurrency_key": ""}, "durable.concurrency_key"),
        ({"concurrency_key": "{a.b}"}, "durable.concurrency_key"),
        ({"concurrency_key": 5}, "durable.concurrency_key"),
    ],
)
def test_bad_task_limits_are_refused_where_they_are_written(options, field):
    with pytest.raises(scheduler.InvalidArgument) as caught:
        durable(**options)
    assert caught.value.details["field"] == field
    with pytest.raises(ImproperlyConfigured, match=field.replace("durable.", r"OPTIONS'\]\.")):
        DurableBackend("broken", {"OPTIONS": options})
