"""The benchmark's handlers, one no-op and one start-time stamp per system.

Autodiscovered as this app's ``tasks`` module by this package and by procrastinate; django-tasks
and django-q2 find them by import path. The stamp handlers append ``<token> <time.time()>`` to the
file named by BENCH_STAMP_FILE (one short O_APPEND write: no database work in the handler).
"""

from __future__ import annotations

import os
import time

from django.conf import settings
from django_tasks import task

import django_durable_scheduler as scheduler


def _stamp(token: object) -> None:
    started = time.time()
    line = f"{token} {started:.6f}\n".encode()
    fd = os.open(os.environ["BENCH_STAMP_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


# --- django-durable-scheduler (this package)


@scheduler.handler("bench.noop")
def ours_noop(ctx):
    return None


@scheduler.handler("bench.sleep")
def ours_sleep(ctx):
    time.sleep(0.02)  # the scale workload's "real" handler: 20 ms of waiting on something else


@scheduler.handler("bench.stamp")
def ours_stamp(ctx):
    _stamp(ctx.payload["token"])


# --- django-tasks + django-tasks-db


@task()
def dt_noop():
    return None


@task()
def dt_stamp(token):
    _stamp(token)


# --- this package's django.tasks backend (TASKS["durable"])


@task(backend="durable")
def ours_task_noop():
    return None


@task(backend="durable")
def ours_task_stamp(token):
    _stamp(token)


# --- django-q2 (async_task("bench.benchapp.tasks.q_noop"))


def q_noop():
    return None


def q_stamp(token):
    _stamp(token)


# --- procrastinate (PostgreSQL only)

if "procrastinate.contrib.django" in settings.INSTALLED_APPS:
    from procrastinate.contrib.django import app as procrastinate_app

    @procrastinate_app.task(name="bench.p_noop")
    def p_noop():
        return None

    @procrastinate_app.task(name="bench.p_stamp")
    def p_stamp(token):
        _stamp(token)
