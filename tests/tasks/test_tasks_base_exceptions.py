"""A task that raises what is no ``Exception`` (``exit()``, KeyboardInterrupt, its own
BaseException) ends as Django's backends end it: a failed attempt recorded with the
exception's class, FAILED once no attempt is left. Real ``runscheduler`` processes."""

from __future__ import annotations

import importlib.util
import signal
import subprocess

import pytest

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip(
        "no task framework: Django 6 or the django-tasks backport (pip install '.[tasks]')",
        allow_module_level=True,
    )

from django_durable_scheduler import kernel
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.tasks import DurableBackend
from django_durable_scheduler.tasks.framework import TaskResultStatus, task_backends, task_finished
from tests.testapp import djtasks

from ..procs.runner import Workers, wait_for
from .test_tasks_backend import context_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


def test_a_task_that_exits_ends_failed_with_system_exit(workers):
    result = djtasks.exits.enqueue()
    after = djtasks.add.enqueue(1, 2)
    worker = workers.start("--burst", "--concurrency", "1", "--queues", "default")
    try:
        assert worker.wait(60) == 0, worker.output()
    except subprocess.TimeoutExpired:
        pytest.fail(f"runscheduler --burst did not exit:\n{worker.output()}")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    assert [error.exception_class_path for error in result.errors] == ["builtins.SystemExit"]
    assert result.errors[0].exception_class is SystemExit
    assert "sys.exit(1)" in result.errors[0].traceback
    assert Occurrence.objects.get(pk=result.id).attempt == 1
    after.refresh()
    assert (after.status, after.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


def test_a_task_interrupted_by_its_own_raise_is_retried_then_failed(workers, tmp_path):
    result = djtasks.interrupted.enqueue(str(tmp_path))
    worker = workers.start("--queues", "default", "--grace", "1")
    settled = wait_for(lambda: Occurrence.objects.filter(pk=result.id, settled_at__isnull=False).exists(), 60)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert settled, worker.output()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    paths = [error.exception_class_path for error in result.errors]
    assert paths == ["builtins.KeyboardInterrupt", "tests.testapp.djtasks.Halt"]
    assert result.errors[1].exception_class is djtasks.Halt
    assert Occurrence.objects.get(pk=result.id).attempt == 2


def test_the_task_framework_is_told_of_the_failure(db):
    """``task_finished`` is sent for such a failure (Django's logging receiver logs it)."""
    seen = []
    task_finished.connect(receiver := lambda sender, task_result, **kw: seen.append(task_result.status))
    try:
        result = djtasks.exits.enqueue()
        occurrence = kernel.claim(owner="w1", lease=30, kinds=["django.tasks:default"])
        assert occurrence is not None and occurrence.pk == result.id
        with pytest.raises(SystemExit):
            backend = task_backends["default"]
            assert isinstance(backend, DurableBackend)
            backend.run(context_of(occurrence))
    finally:
        task_finished.disconnect(receiver)
    assert seen == [TaskResultStatus.FAILED]
