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


class Workers:
    """Spawns ``python -m django runscheduler`` against the test database."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Worker] = []

    def start(self, *args: str, verbosity: int = 1) -> Worker:
        log = self.directory / f"worker-{len(self.started)}.log"
        handle = log.open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django",
                "runscheduler",
                "--poll-interval",
                "0.05",
                "--verbosity",
                str(verbosity),
                *args,
            ],
            cwd=ROOT,
            env=subprocess_env(),
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
                worker._handle.close()


def granted(principal_id: str) -> dict:
    """An authority envelope for ``principal_id`` whose principal has a policy covering it (with
    a budget far above what these tests use), so the worker's authorization lets it run."""
    import django_durable_scheduler as scheduler

    from ..conftest import authority_for

    authority = authority_for(principal_id, "tests.run")
    ensure_policy = getattr(scheduler, "ensure_policy", None)
    if ensure_policy is not None:
        ensure_policy(authority)
    return authority
