"""Start real ``runscheduler`` processes for the crash and scale tests.

Each process writes its output to a log file (never a pipe nobody reads, which would block a
chatty worker); ``Workers.cleanup()`` SIGKILLs whatever a failed test left running.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..conftest import ROOT, subprocess_env


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, handle: IO[bytes]) -> None:
        self.proc = proc
        self.log = log
        self._handle = handle

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._handle.flush()

    def output(self, tail: int = 4000) -> str:
        self._handle.flush()
        return self.log.read_text(errors="replace")[-tail:]

    def in_loop(self) -> bool:
        """Whether the worker has logged its start (``worker ID: concurrency ...``, at the
        default verbosity): a SIGTERM before its command runs would end Python's start-up by
        the signal's default action, not stop the worker."""
        self._handle.flush()
        return ": concurrency " in self.log.read_text(errors="replace")

    def close(self) -> None:
        """Close the log file the process writes to."""
        self._handle.close()


class Workers:
    """Spawns ``python -m django runscheduler`` against the test database."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Worker] = []

    def start(self, *args: str, verbosity: int = 1, module: str = "django", **env: str) -> Worker:
        """``python -m <module> runscheduler``: ``django``, or ``django_durable_scheduler``
        (which records stop signals from its first moments)."""
        log = self.directory / f"worker-{len(self.started)}.log"
        handle = log.open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                "runscheduler",
                "--poll-interval",
                "0.05",
                "--verbosity",
                str(verbosity),
                *args,
            ],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        worker = Worker(proc, log, handle)
        self.started.append(worker)
        return worker

    def cleanup(self) -> None:
        for worker in self.started:
            if worker.alive():
                worker.proc.kill()
            try:
                worker.proc.wait(timeout=30)
            finally:
                worker.close()


def granted(principal_id: str) -> dict:
    """An authority envelope for ``principal_id`` whose principal has a policy covering it (with
    a budget far above what these tests use), so the worker's authorization lets it run."""
    import django_durable_scheduler as scheduler

    from ..conftest import authority_for

    authority = authority_for(principal_id, "tests.run")
    ensure_policy = getattr(scheduler, "ensure_policy", None)
    if ensure_policy is not None:
        # A budget, so that the runs are charged and reserved (a policy has none by default).
        ensure_policy(authority, max_runs=100_000, max_units=100_000)
    return authority


RACE_T0_MS = 1_767_614_400_000  # 2026-01-05 12:00 UTC: a 24 h window starts at 00:00, 12 h of margin


def queue_race(settings, queued: int, max_runs: int):
    """The budget race's world: job ``race`` of principal ``racer`` with ``queued`` due
    occurrences and a 24 h policy of ``max_runs`` runs, on a clock set to the race's start.
    Returns the policy."""
    from datetime import timedelta

    from django.db import transaction

    import django_durable_scheduler as scheduler
    from django_durable_scheduler.rules.validation import from_ms

    from ..conftest import Clock, authority_for

    t0 = from_ms(RACE_T0_MS)
    settings.DURABLE_SCHEDULER_CLOCK = Clock(t0)
    scheduler.create_job("race", "k", authority=authority_for("racer", "x.run"), max_attempts=3)
    policy = scheduler.set_policy(
        "user",
        "racer",
        capabilities=["x.run"],
        window=timedelta(hours=24),
        max_runs=max_runs,
        max_units=10**6,
    )
    with transaction.atomic():
        for n in range(queued):
            scheduler.enqueue("race", scheduled_for=t0 - timedelta(seconds=queued - n), trigger_key=f"t{n}")
    return policy


def start_racers(racers: int, mode: str, revision: int, *extra: str) -> list[subprocess.Popen[str]]:
    """``racers`` budget racer processes (tests/procs/budget_racer.py) on the race's clock,
    all starting their claims at the same instant, two seconds from now."""
    env = subprocess_env(
        START_AT=str(time.time() + 2.0),
        DSCH_CLOCK_T0=str(RACE_T0_MS),
        DSCH_CLOCK_START=str(time.time()),
        DSCH_CLOCK_SPEED="1",
    )
    command = [sys.executable, "-m", "tests.procs.budget_racer"]
    return [
        subprocess.Popen(
            [*command, f"racer-{i}", mode, str(revision), str(2 + i), *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(racers)
    ]
