"""The soak's worker processes (bench/soak.py): real ``runscheduler`` processes, some steady
(never killed: their memory and connections are watched over the whole run) and some victims
(SIGKILLed at random and started again at once, each start a new incarnation with its own worker
id), and the samples of each process's resident set and database connections."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Incarnation:
    """One started process: its worker id (also its connections' application_name), and what
    was seen of it: (seconds since the load started, value) samples of VmRSS (kB) and of its
    connections."""

    worker_id: str
    steady: bool
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    killed: bool = False
    exit_code: int | None = None
    rss: list[tuple[float, int]] = field(default_factory=list)
    connections: list[tuple[float, int]] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def in_loop(self) -> bool:
        """Whether the worker has logged its start line (its loop runs)."""
        return ": concurrency " in self.log.read_text(errors="replace")

    def report(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "steady": self.steady,
            "killed": self.killed,
            "exit_code": self.exit_code,
            "rss_kb": self.rss,
            "connections": self.connections,
        }


def rss_kb(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


class Fleet:
    """``steady`` + ``victims`` worker slots against one database, all on the soak's clock."""

    def __init__(self, env: dict[str, str], log_dir: Path, *, concurrency: int, lease: float) -> None:
        self.env = env
        self.log_dir = log_dir
        self.argv = [
            sys.executable,
            "-m",
            "django",
            "runscheduler",
            "--concurrency",
            str(concurrency),
            "--lease",
            str(lease),
            "--poll-interval",
            "0.5",
            "--grace",
            "10",
        ]
        self.slots: dict[str, Incarnation] = {}
        self.all: list[Incarnation] = []
        self.t0 = time.monotonic()

    def start(self, slot: str, *, steady: bool) -> Incarnation:
        worker_id = f"soak-{slot}-{sum(1 for i in self.all if i.worker_id.startswith(f'soak-{slot}-'))}"
        log = self.log_dir / f"{worker_id}.log"
        env = {**self.env, "DSCH_SOAK_APP": worker_id}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*self.argv, "--worker-id", worker_id],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        incarnation = Incarnation(worker_id, steady, proc, log, self.elapsed())
        self.slots[slot] = incarnation
        self.all.append(incarnation)
        return incarnation

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def wait_in_loop(self, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(i.in_loop() for i in self.slots.values()):
                return True
            if any(not i.alive() for i in self.slots.values()):
                return False
            time.sleep(0.2)
        return False

    def kill_and_restart(self, slot: str) -> str:
        """SIGKILL the slot's process and start its next incarnation; the killed worker's id."""
        victim = self.slots[slot]
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.proc.pid, signal.SIGKILL)
        victim.exit_code = victim.proc.wait(30)
        victim.killed = True
        self.start(slot, steady=False)
        return victim.worker_id

    def sample(self, by_app: dict[str, int] | None) -> None:
        """Each live process's VmRSS, and its connections from ``by_app`` (None: the database
        did not answer, so no connection sample this time)."""
        now = self.elapsed()
        for incarnation in self.slots.values():
            if not incarnation.alive():
                continue
            kb = rss_kb(incarnation.proc.pid)
            if kb is not None:
                incarnation.rss.append((now, kb))
            if by_app is not None:
                incarnation.connections.append((now, by_app.get(incarnation.worker_id, 0)))

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM every live process (a graceful stop), then wait for each exit code."""
        for incarnation in self.slots.values():
            if incarnation.alive():
                incarnation.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for incarnation in self.slots.values():
            try:
                incarnation.exit_code = incarnation.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                incarnation.exit_code = None

    def kill_all(self) -> None:
        """Whatever is left (an interrupted run): SIGKILL, so nothing outlives the soak."""
        for incarnation in self.all:
            if incarnation.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(incarnation.proc.pid, signal.SIGKILL)
                incarnation.proc.wait(30)

    def tail(self, incarnation: Incarnation, chars: int = 3000) -> str:
        return incarnation.log.read_text(errors="replace")[-chars:]

    def report(self) -> list[dict[str, Any]]:
        return [incarnation.report() for incarnation in self.all]
