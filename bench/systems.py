"""The systems under test behind one small interface (used by bench/suite.py, inside .venv-bench).

Each system: ``enqueue_noop(i)`` and ``enqueue_stamp(token)`` through its public enqueue API, one
call = one transaction (autocommit), ``done()`` counts what is recorded finished in the database,
``clear()`` empties its tables, and ``drain_workers`` / ``idle_worker`` give the worker command lines.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection

PY = sys.executable
MANAGE = [PY, "-m", "django"]

AUTHORITY = {"principal": {"type": "user", "id": "bench"}, "requestedCapabilities": ["bench.run"]}


@dataclass
class WorkerSpec:
    """Worker processes to start: each entry is (argv, extra environment)."""

    procs: list[tuple[list[str], dict[str, str]]]
    exits_when_empty: bool  # burst / batch / one-shot mode: the processes exit by themselves
    description: str = ""
    settings: dict[str, object] = field(default_factory=dict)


def _truncate(tables: list[str]) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
        else:
            for table in tables:
                cursor.execute(f"DELETE FROM {table}")


class Ours:
    name = "ours"
    # W2 runs it once more per level as one process with N handler threads ("matched concurrency").
    matched_run = True
    NOOP_JOB = "bench-noop"
    STAMP_JOB = "bench-stamp"
    SLEEP_JOB = "bench-sleep"

    def __init__(self) -> None:
        self.run = 0

    def setup(self) -> None:
        import django_durable_scheduler as scheduler
        from django_durable_scheduler import kernel
        from django_durable_scheduler.models import Job

        # The worker authorizes every run: give the bench principal a budget that never binds.
        # (The public name, not kernel.policies: earlier commits run as baselines had no such module.)
        scheduler.ensure_policy(AUTHORITY, window=31 * 86400, max_runs=1_000_000, max_units=1_000_000)
        jobs = (
            (self.NOOP_JOB, "bench.noop"),
            (self.STAMP_JOB, "bench.stamp"),
            (self.SLEEP_JOB, "bench.sleep"),
        )
        for job_id, kind in jobs:
            if not Job.objects.filter(pk=job_id).exists():
                kernel.create_job(job_id, kind, authority=AUTHORITY, max_attempts=3)

    def new_run(self) -> None:
        self.run += 1

    def enqueue_noop(self, i: int) -> None:
        from django_durable_scheduler import kernel

        kernel.enqueue(self.NOOP_JOB, scheduled_for=datetime.now(UTC), trigger_key=f"w:{self.run}:{i}")

    def enqueue_many(self, n: int) -> None:
        from django_durable_scheduler import kernel

        now = datetime.now(UTC)
        kernel.enqueue_many(
            self.NOOP_JOB, [{"scheduled_for": now, "trigger_key": f"b:{self.run}:{i}"} for i in range(n)]
        )

    def enqueue_stamp(self, token: int) -> None:
        from django_durable_scheduler import kernel

        kernel.enqueue(
            self.STAMP_JOB,
            scheduled_for=datetime.now(UTC),
            trigger_key=f"s:{self.run}:{token}",
            payload={"token": token},
        )

    def done(self) -> int:
        from django_durable_scheduler.models import Occurrence

        return Occurrence.objects.filter(status="succeeded").count()

    def exactly_once(self, n: int) -> bool:
        """Each of the n ran once: succeeded at attempt 1, one claim each, no reclaim."""
        from django_durable_scheduler.models import Event, Occurrence

        claims = Event.objects.filter(event_type="occurrence_claimed")
        return (
            Occurrence.objects.filter(status="succeeded", attempt=1, fence=1).count() == n
            and claims.count() == n
            and claims.values("occurrence_id").distinct().count() == n
            and not Event.objects.filter(event_type="occurrence_reclaimed").exists()
        )

    def failed(self) -> int:
        from django_durable_scheduler.models import Occurrence

        return Occurrence.objects.exclude(status__in=["succeeded", "queued", "running"]).count()

    def clear(self) -> None:
        _truncate(
            [
                "durable_scheduler_events",
                "durable_scheduler_authority_reservations",
                "durable_scheduler_authority_usage",
                "durable_scheduler_occurrences",
                "durable_scheduler_workers",
            ]
        )

    def drain_workers(self, level: int, concurrency: int | None = None) -> WorkerSpec:
        # Its natural settings: the default --concurrency (8 handler threads); --burst exits
        # once nothing is due. ``concurrency``: that many handler threads instead.
        cmd = [*MANAGE, "runscheduler", "--burst"]
        if concurrency is not None:
            cmd += ["--concurrency", str(concurrency)]
        threads = concurrency or 8
        return WorkerSpec(
            [(cmd, {})] * level, True, f"{level} x runscheduler --burst (concurrency {threads})"
        )

    def idle_worker(self, poll: float | None) -> WorkerSpec:
        cmd = [*MANAGE, "runscheduler"]
        if poll is not None:
            cmd += ["--poll-interval", str(poll)]
        return WorkerSpec([(cmd, {})], False, " ".join(cmd[3:]), {"poll": poll or 1.0})


class OursTasks(Ours):
    """This package through Django's task API: ``.enqueue()`` of ``@task`` functions whose backend
    is ``TASKS["durable"]`` (our DurableBackend); the same workers, occurrences and checks as Ours."""

    name = "ours (django.tasks)"

    def setup(self) -> None:
        from django.conf import settings

        import django_durable_scheduler as scheduler
        from django_durable_scheduler.tasks import queue_kind

        # The backend's OPTIONS principal, granted its queue's kind with a budget that never binds
        # (before the first enqueue creates the task's job, so that the job binds to it).
        principal = settings.TASKS["durable"]["OPTIONS"]["principal"]
        authority = {"principal": principal, "requestedCapabilities": [queue_kind("default")]}
        scheduler.ensure_policy(authority, window=31 * 86400, max_runs=1_000_000, max_units=1_000_000)

    def enqueue_noop(self, i: int) -> None:
        from bench.benchapp.tasks import ours_task_noop

        ours_task_noop.enqueue()

    def enqueue_many(self, n: int) -> None:
        raise NotImplementedError("Django's task API has no bulk enqueue")

    def enqueue_stamp(self, token: int) -> None:
        from bench.benchapp.tasks import ours_task_stamp

        ours_task_stamp.enqueue(token)


class DjangoTasks:
    name = "django-tasks-db"

    def setup(self) -> None:
        pass

    def new_run(self) -> None:
        pass

    def enqueue_noop(self, i: int) -> None:
        from bench.benchapp.tasks import dt_noop

        dt_noop.enqueue()

    def enqueue_stamp(self, token: int) -> None:
        from bench.benchapp.tasks import dt_stamp

        dt_stamp.enqueue(token)

    def exactly_once(self, n: int) -> bool:
        return self.done() == n  # finished once each: no more, no fewer

    def done(self) -> int:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult.objects.successful().count()

    def failed(self) -> int:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult.objects.failed().count()

    def clear(self) -> None:
        from django_tasks_db.models import DBTaskResult

        _truncate([DBTaskResult._meta.db_table])

    def drain_workers(self, level: int) -> WorkerSpec:
        cmd = [*MANAGE, "db_worker", "--batch", "--no-startup-delay", "--no-reload"]
        return WorkerSpec([(cmd, {})] * level, True, f"{level} x db_worker --batch --no-startup-delay")

    def idle_worker(self, poll: float | None) -> WorkerSpec:
        cmd = [*MANAGE, "db_worker", "--no-reload"]
        if poll is not None:
            cmd += ["--interval", str(poll)]
        return WorkerSpec([(cmd, {})], False, " ".join(cmd[3:]), {"interval": poll or 1.0})


class DjangoQ2:
    name = "django-q2"

    def setup(self) -> None:
        pass

    def new_run(self) -> None:
        pass

    def enqueue_noop(self, i: int) -> None:
        from django_q.tasks import async_task

        async_task("bench.benchapp.tasks.q_noop")

    def enqueue_stamp(self, token: int) -> None:
        from django_q.tasks import async_task

        async_task("bench.benchapp.tasks.q_stamp", token)

    def exactly_once(self, n: int) -> bool:
        return self.done() == n  # finished once each: no more, no fewer

    def done(self) -> int:
        from django_q.models import Success

        return Success.objects.count()

    def failed(self) -> int:
        from django_q.models import Failure

        return Failure.objects.count()

    def clear(self) -> None:
        from django_q.models import OrmQ, Task

        _truncate([OrmQ._meta.db_table, Task._meta.db_table])

    def drain_workers(self, level: int) -> WorkerSpec:
        # One cluster; its natural concurrency knob is the number of worker processes.
        env = {"BENCH_Q_WORKERS": str(level)}
        return WorkerSpec([([*MANAGE, "qcluster"], env)], False, f"qcluster, workers={level}, poll 0.2")

    def idle_worker(self, poll: float | None) -> WorkerSpec:
        env = {"BENCH_Q_WORKERS": "1", "BENCH_Q_POLL": str(poll or 0.2)}
        return WorkerSpec([([*MANAGE, "qcluster"], env)], False, f"qcluster, workers=1, poll {poll or 0.2}")


class Procrastinate:
    name = "procrastinate"

    def setup(self) -> None:
        pass

    def new_run(self) -> None:
        pass

    def enqueue_noop(self, i: int) -> None:
        from bench.benchapp.tasks import p_noop  # type: ignore[attr-defined]

        p_noop.defer()

    def enqueue_stamp(self, token: int) -> None:
        from bench.benchapp.tasks import p_stamp  # type: ignore[attr-defined]

        p_stamp.defer(token=token)

    def _count(self, status: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = %s", [status])
            return int(cursor.fetchone()[0])

    def exactly_once(self, n: int) -> bool:
        return self.done() == n  # finished once each: no more, no fewer

    def done(self) -> int:
        return self._count("succeeded")

    def failed(self) -> int:
        return self._count("failed")

    def clear(self) -> None:
        _truncate(["procrastinate_jobs"])

    def drain_workers(self, level: int) -> WorkerSpec:
        cmd = [*MANAGE, "procrastinate", "worker", "--concurrency", str(level), "--one-shot"]
        return WorkerSpec([(cmd, {})], True, f"1 x procrastinate worker --concurrency {level} --one-shot")

    def idle_worker(self, poll: float | None) -> WorkerSpec:
        cmd = [*MANAGE, "procrastinate", "worker"]
        if poll is not None:
            cmd += ["--fetch-job-polling-interval", str(poll)]
        return WorkerSpec([(cmd, {})], False, " ".join(cmd[3:]), {"fetch_job_polling_interval": poll or 5.0})


def systems_for(vendor: str) -> list[object]:
    """Ours first: the workloads of ours alone (W1 bulk, W4, profile, scale) take ``systems[0]``."""
    found: list[object] = [Ours(), OursTasks(), DjangoTasks(), DjangoQ2()]
    if vendor == "postgresql":
        found.append(Procrastinate())
    return found
