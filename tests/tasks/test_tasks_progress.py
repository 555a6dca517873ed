"""A ``django.tasks`` task with ``takes_context=True`` reports its progress as any handler does:
its context is Django's ``TaskContext`` with the scheduler's ``report_progress``."""

from __future__ import annotations

import importlib.util

import pytest

from django_durable_scheduler import testing

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip("no task framework: Django 6 or the django-tasks backport", allow_module_level=True)

from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.tasks.context import DurableTaskContext
from django_durable_scheduler.tasks.framework import TaskContext, TaskResultStatus
from tests.testapp import djtasks


def test_a_task_reports_progress_through_its_context(db):
    result = djtasks.count_rows.enqueue(50)
    (ran,) = testing.drain()
    assert ran.status == "succeeded"
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 50
    progress = Occurrence.objects.get(pk=result.id).progress
    assert (progress["done"], progress["total"], progress["note"]) == (50, 50, "rows")


def test_the_context_is_djangos_with_report_progress():
    seen = []

    class Execution:
        def report_progress(self, done, total=None, note=None):
            if done < 0:
                raise InvalidArgument("done", "must be >= 0")
            seen.append((done, total, note))

    context = DurableTaskContext(task_result=None, execution=Execution())
    assert isinstance(context, TaskContext)
    context.report_progress(3, 4, "n")
    with pytest.raises(InvalidArgument):
        context.report_progress(-1)
    assert seen == [(3, 4, "n")]
