"""What the workloads share: the worker processes of a run, the results they add to, waiting
for a drain to finish, and pgbench as the physical reference (bench/suite.py and
bench/scale.py both use them; neither imports the other's workloads to get them)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
DRAIN_TIMEOUT = 900.0
LOG_DIR = Path(tempfile.mkdtemp(prefix="dschbench-logs-"))
# A baseline run (bench/baselines.py): the directory holding an earlier commit's package, which
# this process and every worker it starts must import instead of the working tree's.
PACKAGE_DIR = os.environ.get("BENCH_PACKAGE_DIR", "")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a Django process the bench starts: this repository's bench settings, and
    a baseline's package ahead of the working tree's (no current directory prepended to the path)."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_DIR, str(ROOT)) if p)
    if PACKAGE_DIR:
        env["PYTHONSAFEPATH"] = "1"
    env.update(extra)
    return env


def say(message: str) -> None:
    print(f"[bench] {message}", flush=True)


class Procs:
    """Worker processes of one run, each in its own session (so a stop reaches its children)."""

    def __init__(self, spec: Any, label: str, extra_env: dict[str, str] | None = None) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        safe = re.sub(r"[^\w.-]+", "_", label)  # a system's name may have spaces or parentheses
        for index, (argv, env_extra) in enumerate(spec.procs):
            env = child_env(**{**env_extra, **(extra_env or {})})
            log = LOG_DIR / f"{safe}-{index}-{time.time_ns()}.log"
            self.logs.append(log)
            with log.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )

    peak_rss_kb = 0

    def sample_rss(self) -> None:
        """Keep the largest resident set (VmRSS) seen of any process this harness started."""
        for p in self.procs:
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.peak_rss_kb = max(self.peak_rss_kb, int(line.split()[1]))

    def all_exited(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self) -> None:
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            for p in self.procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, sig)
            if self.wait(grace):
                break
        # qcluster leaves its children in the same session: make sure none survive.
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)

    def tail(self, lines: int = 15) -> str:
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)


class Results:
    def __init__(self, db: str) -> None:
        self.db = db
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.plans: dict[str, str] = {}
        self.extra: dict[str, Any] = {}

    def add(
        self,
        workload: str,
        system: str,
        value: float | None,
        *,
        unit: str,
        better: str,
        config: str = "",
        detail: dict[str, Any] | None = None,
    ) -> None:
        for row in self.rows:
            if row["workload"] == workload and row["system"] == system:
                break
        else:
            row = {
                "db": self.db,
                "workload": workload,
                "system": system,
                "unit": unit,
                "better": better,
                "config": config,
                "samples": [],
                "details": [],
            }
            self.rows.append(row)
        row["samples"].append(value)
        if detail:
            row["details"].append(detail)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# Fine enough that a drain of under a second is not measured in steps of several percent,
# coarse enough that the two count queries of each poll take a small share of a core.
POLL = 0.02


# Per system (by id): when its last wait_done first saw a finished task, and how many it saw then.
FIRST_SEEN: dict[int, tuple[float, int]] = {}


def steady_rate(system: Any, n: int, end: float) -> float | None:
    """The drain's steady rate, from the first finished task seen to the last: what the
    workers sustain once started, without their start-up (None if all came in one poll)."""
    first = FIRST_SEEN.get(id(system))
    if first is None or end <= first[0] or first[1] >= n:
        return None
    return (n - first[1]) / (end - first[0])


def wait_done(system: Any, n: int, procs: Any, timeout: float) -> tuple[float | None, int]:
    """Poll the database until ``n`` are recorded finished; the elapsed seconds (None on timeout).
    Every POLL seconds: a drain is timed to within one poll, late by half of one on average."""
    start = time.perf_counter()
    deadline = start + timeout
    done = 0
    FIRST_SEEN.pop(id(system), None)
    while time.perf_counter() < deadline:
        if procs is not None:
            procs.sample_rss()
        done = system.done()
        if done and id(system) not in FIRST_SEEN:
            FIRST_SEEN[id(system)] = (time.perf_counter(), done)
        if done >= n:
            return time.perf_counter(), done
        if done + system.failed() >= n:
            return None, done  # some ended otherwise (failed, dead-lettered): it will not finish
        if procs is not None and procs.all_exited():
            done = system.done()
            return (time.perf_counter(), done) if done >= n else (None, done)
        time.sleep(POLL)
    return None, done


def run_pgbench(
    res: Results, url: str, sizes: dict[str, Any], reps: int, clients_list: tuple[int, ...] = (1, 2)
) -> None:
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        res.notes.append("pgbench not found: no physical reference")
        return
    parts = urlsplit(url)
    conn = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432), "-U", parts.username or ""]
    db = parts.path.lstrip("/")
    env = dict(os.environ)
    if parts.password:
        env["PGPASSWORD"] = parts.password
    subprocess.run([pgbench, "-i", "-q", "-s", "10", *conn, db], check=True, env=env, capture_output=True)
    script = Path(tempfile.mkstemp(prefix="dschbench-pgbench-", suffix=".sql")[1])
    script.write_text(
        "\\set aid random(1, 100000 * :scale)\n"
        "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n"
    )
    try:
        for clients in clients_list:
            for _ in range(reps):
                seconds = str(sizes["pgbench_seconds"])
                argv = [pgbench, "-n", "-c", str(clients), "-j", str(clients), "-T", seconds]
                proc = subprocess.run(
                    [*argv, "-f", str(script), *conn, db],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", proc.stdout)
                tps = float(match.group(1)) if match else None
                res.add(
                    f"pgbench single-row UPDATE, {clients} client(s)",
                    "postgres",
                    tps,
                    unit="tps",
                    better="higher",
                    config=f"pgbench -n -c {clients} -T {seconds}, one UPDATE per tx, scale 10",
                )
                say(f"pgbench -c {clients}: {tps} tps")
    finally:
        script.unlink(missing_ok=True)
        subprocess.run([pgbench, "-i", "-I", "d", *conn, db], env=env, capture_output=True)
