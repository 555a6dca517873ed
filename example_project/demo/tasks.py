"""Handlers for the demo jobs that the example project schedules."""

from __future__ import annotations

import logging

import django_durable_scheduler as scheduler
from django_durable_scheduler.tasks import schedule

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2: the django-tasks backport

logger = logging.getLogger(__name__)


# Django tasks, run by runscheduler like the handlers below (TASKS in settings.py).
@task
def greet(name):
    """Enqueued by the /greet/ view."""
    logger.info("greetings, %s (a Django task)", name)
    return {"greeted": name}


@task
def tidy_up():
    """Scheduled below: a task with a cron schedule, on Berlin wall-clock time."""
    return {"tidied": True}


schedule(tidy_up, cron="*/5 * * * *", timezone="Europe/Berlin")


@scheduler.handler("demo.hello")
def hello(ctx):
    logger.info("hello from %s (attempt %d, payload %s)", ctx.occurrence_id[:12], ctx.attempt, ctx.payload)
    return {"greeted": (ctx.payload or {}).get("name", "world")}


@scheduler.handler("demo.flaky")
def flaky(ctx):
    """Fails on its first attempt; the retry (after the job's backoff) succeeds."""
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt always fails; the retry will work")
    return {"recovered_on_attempt": ctx.attempt}


@scheduler.handler("demo.fanout")
def fanout(ctx):
    """Enqueues follow-up work for demo.hello, once per parent occurrence (idempotent)."""
    children = []
    for n in range(3):
        occurrence, _ = scheduler.enqueue(
            "demo-hello",
            scheduled_for=ctx.scheduled_for,
            trigger_key=f"fanout:{ctx.occurrence_id}:{n}",
            payload={"name": f"child {n}"},
        )
        children.append(occurrence.occurrence_id)
    return {"children": children}


@scheduler.handler(
    "demo.morning-report",
    job={"job_id": "demo-morning-report", "trigger": {"cron": "0 9 * * *", "timezone": "Europe/Berlin"}},
)
def morning_report(ctx):
    """Declared with its job: at 09:00 in Berlin every day, in winter and in summer time."""
    return {"report_for": ctx.scheduled_for.isoformat()}


@scheduler.handler("demo.summary")
def summary(ctx):
    """Follows other work: the next step of a chain (``ctx.predecessor``) or the callback
    of a batch (``ctx.batch``)."""
    if ctx.batch is not None:
        return {"batch": ctx.batch["counts"]}
    return {"after": ctx.predecessor["result"]}
