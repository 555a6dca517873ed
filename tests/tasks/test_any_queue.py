"""``TASKS[...]["QUEUES"] = []``: as Django's settings reference says, no queue name is
refused; a name that cannot be a handler kind is refused by name. ``runscheduler`` runs the
tasks of every queue, also of one first used after it started."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
from typing import Any

import pytest
from django.core.management import CommandError, call_command

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip(
        "no task framework: Django 6 or the django-tasks backport (pip install '.[tasks]')",
        allow_module_level=True,
    )

from django_durable_scheduler import checks
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.tasks import DurableBackend
from django_durable_scheduler.tasks.framework import InvalidTask, TaskResultStatus, task_backends
from django_durable_scheduler.tasks.handlers import any_queue, durable_queues
from tests.testapp import djtasks

from ..procs.runner import Worker, Workers, wait_for

BACKEND = "django_durable_scheduler.tasks.DurableBackend"


@pytest.fixture
def any_queue_backend(settings: Any) -> None:
    """The test backend, taking any queue name (the worker processes: DSCH_ANY_QUEUE)."""
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def burst(workers: Workers, *args: str) -> None:
    worker = workers.start("--burst", "--concurrency", "2", *args, DSCH_ANY_QUEUE="1")
    try:
        assert worker.wait(60) == 0, worker.output()
    except subprocess.TimeoutExpired:
        pytest.fail(f"runscheduler --burst did not exit:\n{worker.output()}")


@pytest.mark.django_db
def test_an_empty_queues_list_takes_any_queue_name(any_queue_backend):
    backend = task_backends["default"]
    assert isinstance(backend, DurableBackend)
    assert durable_queues() == {"default": []} and any_queue()
    result = djtasks.add.using(queue_name="reports-2026").enqueue(1, 2)
    occurrence = Occurrence.objects.select_related("job").get(pk=result.id)
    assert occurrence.job.kind == "django.tasks:reports-2026"
    assert result.task.queue_name == "reports-2026"
    with pytest.raises(InvalidTask, match="queue_name"):
        djtasks.add.using(queue_name="x" * 200).enqueue(1, 2)
    # Such jobs are no warning (W002): every worker runs the tasks of any queue.
    assert not [
        m for m in checks.check_jobs_have_handlers(databases=["default"]) if m.obj.startswith("django")
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_runscheduler_runs_the_tasks_of_any_queue(any_queue_backend, workers):
    results: list[Any] = [
        djtasks.add.enqueue(1, 1),
        djtasks.add.using(queue_name="reports").enqueue(2, 2),
        djtasks.shout.using(queue_name="reports-late").enqueue("hi"),
    ]
    burst(workers, "--queues", "reports")  # a queue no setting lists: its tasks only
    for result in results:
        result.refresh()
    assert [result.status for result in results] == [
        TaskResultStatus.READY,
        TaskResultStatus.SUCCESSFUL,
        TaskResultStatus.READY,
    ]
    burst(workers)
    for result in results:
        result.refresh()
    assert [result.return_value for result in results] == [2, 4, "HI"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_running_worker_takes_a_queue_first_used_after_it_started(any_queue_backend, workers):
    worker: Worker = workers.start("--worker-id", "w-any", "--grace", "1", DSCH_ANY_QUEUE="1")
    assert wait_for(worker.in_loop), worker.output()
    result = djtasks.add.using(queue_name="reports-new").enqueue(3, 4)
    ran = wait_for(lambda: Occurrence.objects.filter(pk=result.id, settled_at__isnull=False).exists(), 60)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert ran, worker.output()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 7)


def test_runscheduler_refuses_a_queue_name_that_cannot_be_a_kind(any_queue_backend):
    with pytest.raises(CommandError, match="--queues"):
        call_command("runscheduler", "--queues", "x" * 200, "--once")
