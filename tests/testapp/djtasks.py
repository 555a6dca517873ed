"""Tasks for tests/tasks/test_tasks_backend.py (module level, so a worker process imports them)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from django_durable_scheduler import PermanentFailure, Retry
from django_durable_scheduler.tasks import durable
from django_durable_scheduler.tasks.framework import task


@task
def add(a, b):
    return a + b


@task(queue_name="high", priority=5)
def shout(word):
    return word.upper()


@task
async def async_add(a, b):
    return a + b


@task
async def async_wait(seconds):
    """Awaits ``seconds``: a cancel request stops it there (tests/tasks/test_tasks_backend.py)."""
    await asyncio.sleep(seconds)
    return "waited"


@task(takes_context=True)
def attempts_seen(context, marker):
    return {"attempt": context.attempt, "id": context.task_result.id, "marker": marker}


@task
@durable(max_attempts=3, retry_base_delay=0.05, retry_max_delay=0.05)
def flaky(marker_dir, note=None):
    """Fails until it has run twice (the attempts are counted in files)."""
    marks = Path(marker_dir)
    runs = len(list(marks.glob("run-*")))
    (marks / f"run-{runs}").touch()
    if runs < 2:
        raise RuntimeError(f"flaky run {runs}")
    return runs


@task
@durable(max_attempts=2)
def doomed():
    raise PermanentFailure("no use trying again", code="E_DOOMED")


@task
def not_json():
    return object()


@task
@durable(max_attempts=2, retry_base_delay=0.05, retry_max_delay=0.05)
def die_once(marker_dir):
    """Kills its worker on the first attempt (a crash), returns on the second."""
    marks = Path(marker_dir)
    if not (marks / "died").exists():
        (marks / "died").touch()
        os._exit(9)
    return "survived"


@task
def sleep_for(seconds):
    time.sleep(seconds)
    return seconds


@task
@durable(principal={"type": "team", "id": "other"})
def as_other():
    return "other"


@task
def retry_once(marker_dir):
    """Asks for a retry (scheduler.Retry) on its first run."""
    marks = Path(marker_dir)
    if not (marks / "retried").exists():
        (marks / "retried").touch()
        raise Retry("not yet", delay=0.05)
    return "retried"


@task(takes_context=True)
def mark(context, marker_dir):
    """Appends a line to a file named after its result id: one line per run."""
    with (Path(marker_dir) / context.task_result.id).open("a") as f:
        f.write(f"{context.task_result.worker_ids[-1]}\n")


def elsewhere():
    """Made a task of another backend by a test that adds that backend."""


def declare_a_schedule():
    """A schedule declared by this app's code (the declaring module's app owns it)."""
    from django_durable_scheduler.tasks import schedule

    return schedule(add, every=60, args=(1, 2))


@task
@durable(unique_key=True)
def refresh(customer_id):
    """One waiting per arguments (``unique_key=True``)."""
    return customer_id


@task
@durable(unique_key=lambda customer_id, note=None: f"customer-{customer_id}", debounce=30)
def summarize(customer_id, note=None):
    """Debounced per customer: the newest note wins."""
    return note


@task
@durable(unique_key=lambda customer_id: f"customer-{customer_id}", debounce=30, debounce_max_wait=60)
def digest(customer_id):
    """Debounced per customer, but run at most a minute after the first call."""
    return customer_id


@task
@durable(unique_key="all", unique_while="active")
def rebuild():
    """One at a time, waiting or running."""
    return "rebuilt"


@task
@durable(unique_key=lambda n: n)
def badly_keyed(n):
    """Its key callable returns the argument as it is: an int is no key."""
    return n


@task
@durable(concurrency=1, concurrency_key="{customer}")
def per_customer(*, customer):
    return customer


@task
@durable(concurrency=2, concurrency_key=lambda account, since=None: f"account-{account}")
def per_account(account, since=None):
    return account


class Halt(BaseException):
    """A BaseException of the task's own (tests/tasks/test_tasks_base_exceptions.py)."""


@task
@durable(max_attempts=1)
def exits():
    """Ends as Django's own backend tests' task does: ``exit()`` (SystemExit)."""
    sys.exit(1)


@task
@durable(max_attempts=2, retry_base_delay=0.05, retry_max_delay=0.05)
def interrupted(marker_dir):
    """KeyboardInterrupt on its first attempt, Halt (its own BaseException) on its second."""
    marks = Path(marker_dir)
    if not (marks / "interrupted").exists():
        (marks / "interrupted").touch()
        raise KeyboardInterrupt("the task's own interrupt")
    raise Halt("the task halts")


@task(takes_context=True)
def count_rows(context, rows):
    """Reports its progress through the scheduler's TaskContext (tests/tasks/test_tasks_progress.py)."""
    for n in range(1, rows + 1):
        context.report_progress(n, rows, "rows")
    return rows


@task
@durable(throttle={"limit": 1, "period": 60, "burst": 1, "key": "{account}"})
def call_api(*, account, path="/"):
    """Two calls at once, then one a minute, per account (tests/tasks/test_tasks_throttle.py)."""
    return f"{account}{path}"
