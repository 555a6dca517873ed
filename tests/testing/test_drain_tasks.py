"""Django tasks enqueued through ``DurableBackend`` run in ``drain()``, and their results are
read through the task framework's own API, inside a test's transaction too."""

from __future__ import annotations

import importlib.util

import pytest

from django_durable_scheduler import testing

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip("no task framework: Django 6 or the django-tasks backport", allow_module_level=True)

from django_durable_scheduler.tasks.framework import TaskResultStatus
from tests.testapp import djtasks

DEFAULT_KIND = "django.tasks:default"


@pytest.mark.parametrize("database", ["db", "transactional_db"])
def test_a_task_runs_in_the_drain_and_its_result_is_read_back(request, database, frozen):
    request.getfixturevalue(database)
    added = djtasks.add.enqueue(2, b=3)
    shouted = djtasks.shout.enqueue("hi")  # its own queue, "high"
    testing.assert_enqueued(kind=DEFAULT_KIND, payload_contains={"args": [2], "kwargs": {"b": 3}}, count=1)
    ran = testing.drain()
    assert {run.occurrence_id: run.result for run in ran} == {added.id: 5, shouted.id: "HI"}
    result = djtasks.add.get_result(added.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    added.refresh()
    assert added.status == TaskResultStatus.SUCCESSFUL and added.worker_ids[0].startswith("testing-drain:")


def test_a_failing_task_retries_as_the_clock_moves(db, frozen, tmp_path):
    result = djtasks.flaky.enqueue(str(tmp_path))
    for _ in range(3):
        testing.drain()
        frozen.advance(seconds=1)  # past the task's 0.05 s backoff
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 3
    assert len(result.errors) == 2
