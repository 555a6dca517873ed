"""The kill workload (ours only): the throughput kept while a worker is SIGKILLed every second.

    python -m bench.kill [--url DATABASE_URL] [--n 40000] [--reps 3] [--modes none,kills,processes]
                         [--lease 5] [--workers 3] [--every 1] [--pick oldest|random] [--seed 0]
                         [--autovacuum as-is|on] [--code DIR] [--out results.json]

Per run, on a fresh database (PostgreSQL: ``dschbench_kill*`` dropped and created; SQLite: a new
file), N no-op occurrences are enqueued in bulk (one transaction) before any worker starts, then:

- ``none``: ``--workers`` ``runscheduler --lease L`` processes (default concurrency), no kill;
- ``kills``: the same, and every second from the first claim one of them is SIGKILLed and a new
  process with the same command line started at once (what a supervisor such as systemd does);
- ``processes``: one ``runscheduler --processes W --lease L`` supervisor, and every second one
  of its children (``/proc/<pid>/task/<pid>/children``) is SIGKILLed; the supervisor replaces it.

until every occurrence is terminal. The modes alternate within each repetition, so that the
machine's drift hits them alike. From the events table: the wall time from the first claim to
the last success, the throughput, and the audit (every occurrence succeeded, none with two
success events, how many were claimed more than once); for every claim held by a killed worker
and never settled by it (a stranded row), the time from the kill to its reclaim; and for every
kill, the time to the replacement's first claim. Worker ids are ``host:pid``, which is how an
event's owner is tied to the process killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from bench.harness import ROOT, Procs, median, say
from bench.systems import MANAGE, Ours, WorkerSpec

PG_URL = "postgres://postgres@127.0.0.1:5432/dschbench_kill"
MODES = ("none", "kills", "processes")
RUN_TIMEOUT = 900.0
LOAD_WARNING = 1.5
HOST = socket.gethostname()


@dataclass
class Kill:
    """One SIGKILL: the worker's pid, when (``time.time()``), and its replacement's pid."""

    pid: int
    at: float
    replacement: int | None = None


@dataclass
class Fleet:
    """The worker processes of one run and the kills made on them."""

    mode: str
    argv: list[str]
    workers: int
    env: dict[str, str]
    procs: list[Procs] = field(default_factory=list)
    seen: dict[int, float] = field(default_factory=dict)  # worker pid -> first seen
    kills: list[Kill] = field(default_factory=list)

    def start(self) -> None:
        if self.mode == "processes":
            self._spawn([*self.argv, "--processes", str(self.workers)])
        else:
            for _ in range(self.workers):
                self._spawn(self.argv)

    def _spawn(self, argv: list[str]) -> int:
        procs = Procs(WorkerSpec([(argv, {})], False), f"kill-{self.mode}", self.env)
        self.procs.append(procs)
        pid = procs.procs[0].pid
        if self.mode != "processes":
            self.seen[pid] = time.time()
        return pid

    def live(self) -> list[int]:
        """The worker pids alive now (``processes``: the supervisor's children), noting new ones
        as the replacements of the oldest kills that have none yet."""
        if self.mode != "processes":
            return [p.procs[0].pid for p in self.procs if p.procs[0].poll() is None]
        supervisor = self.procs[0].procs[0].pid
        try:
            text = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text()
        except OSError:
            return []
        pids = [int(pid) for pid in text.split()]
        for pid in pids:
            if pid not in self.seen:
                self.seen[pid] = time.time()
                waiting = next((k for k in self.kills if k.replacement is None), None)
                if waiting is not None:
                    waiting.replacement = pid
        return pids

    def kill_one(self, rng: random.Random, pick: str) -> None:
        pids = self.live()
        if not pids:
            return
        victim = rng.choice(sorted(pids)) if pick == "random" else min(pids, key=lambda p: self.seen[p])
        kill = Kill(victim, time.time())
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        self.kills.append(kill)
        if self.mode == "kills":
            for procs in self.procs:
                if procs.procs[0].pid == victim:
                    procs.procs[0].wait()  # reaped, as a supervisor sees it die before it restarts
            kill.replacement = self._spawn(self.argv)

    def stop(self) -> None:
        # Not the victims already reaped: their process group ids may have been reused since.
        for procs in self.procs:
            if procs.procs[0].poll() is None:
                procs.stop()

    def supervisor_alive(self) -> bool:
        return self.mode != "processes" or self.procs[0].procs[0].poll() is None

    def tail(self) -> str:
        return "\n".join(p.tail() for p in self.procs[-self.workers :])


# --------------------------------------------------------------------------- the database


def _libpq(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return parts._replace(scheme="postgresql", path=f"/{dbname}").geturl()


def drop_database(url: str, create: bool = False) -> None:
    """Drop the database (or remove the SQLite file), and create it again if asked."""
    from django.db import connections

    connections.close_all()
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = Path(unquote(parts.path))
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    import psycopg

    name = unquote(parts.path.lstrip("/"))
    if not name.startswith("dschbench_kill"):
        raise SystemExit(f"refusing to drop database {name!r}: only dschbench_kill* names")
    with psycopg.connect(_libpq(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')


def fresh_database(url: str) -> None:
    """A new, empty database, migrated, with the bench's jobs and policy."""
    from django.core.management import call_command

    drop_database(url, create=True)
    call_command("migrate", verbosity=0)
    Ours().setup()


def enqueue(n: int) -> float:
    """N no-ops due now, in one transaction; its seconds. PostgreSQL: then ANALYZE, as an
    autoanalyze would after such an insert (the table is new: no statistics yet)."""
    from django.db import connection, transaction

    from django_durable_scheduler import kernel

    start = time.perf_counter()
    now = datetime.now(UTC)
    with transaction.atomic():
        for first in range(0, n, 5000):
            items = [
                {"scheduled_for": now, "trigger_key": f"k:{i}"} for i in range(first, min(n, first + 5000))
            ]
            kernel.enqueue_many(Ours.NOOP_JOB, items)
    seconds = time.perf_counter() - start
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return seconds


def _claims_exist() -> bool:
    from django_durable_scheduler.models import Event
    from django_durable_scheduler.rules import events

    return Event.objects.filter(event_type=events.OCCURRENCE_CLAIMED).exists()


def _succeeded() -> int:
    from django_durable_scheduler.models import Occurrence

    return Occurrence.objects.filter(status="succeeded").count()


def _active() -> bool:
    from django_durable_scheduler.models import ACTIVE_STATUSES, Occurrence

    return Occurrence.objects.filter(status__in=ACTIVE_STATUSES).exists()


# --------------------------------------------------------------------------- one run


def drive(fleet: Fleet, args: argparse.Namespace, rng: random.Random) -> str | None:
    """Wait for the first claim, then kill every ``--every`` seconds (modes kills and processes)
    until no occurrence is active; what went wrong, if anything."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while not _claims_exist():
        if time.monotonic() > deadline or not fleet.supervisor_alive():
            return "no claim"
        time.sleep(0.02)
    next_kill = time.monotonic() + args.every
    done, since, next_count = -1, time.monotonic(), 0.0  # succeeded, since when; next count
    while _active():
        now = time.monotonic()
        if now > deadline:
            return "timed out"
        if now >= next_count:
            next_count = now + 5.0
            if (count := _succeeded()) != done:
                done, since = count, now
            elif now - since >= args.stall:
                return f"stalled: {done} succeeded, none more for {args.stall:g} s"
        if not fleet.supervisor_alive():
            return "the supervisor died"
        fleet.live()  # the supervisor's new children, seen within 0.1 s
        if fleet.mode != "none" and now >= next_kill:
            fleet.kill_one(rng, args.pick)
            next_kill += args.every
        time.sleep(0.1)
    return None


def run_once(mode: str, rep: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    start = time.perf_counter()
    fresh_database(args.url)
    setup_s = time.perf_counter() - start
    enqueue_s = enqueue(args.n)
    argv = [*MANAGE, "runscheduler", "--lease", str(args.lease)]
    fleet = Fleet(mode, argv, args.workers, env)
    rng = random.Random(args.seed * 1000 + rep)
    load = os.getloadavg()[0]
    fleet.start()
    try:
        problem = drive(fleet, args, rng)
    finally:
        fleet.stop()
    if problem:
        say(f"{mode}, rep {rep + 1}: {problem}\n{fleet.tail()}")
    result = analyse(args.n, fleet.kills)
    result.update(mode=mode, rep=rep + 1, problem=problem, setup_s=setup_s, enqueue_s=enqueue_s)
    result["load_before"] = load
    result["load_after"] = os.getloadavg()[0]
    say(line(result, args.lease))
    return result


# --------------------------------------------------------------------------- the events


def _owner_pid(owner: str | None) -> int | None:
    if not owner or not owner.startswith(f"{HOST}:"):
        return None
    tail = owner.rsplit(":", 1)[1]
    return int(tail) if tail.isdigit() else None


def _stats(values: list[float]) -> dict[str, float | int | None]:
    """Count, p50, p90 and max (nearest rank)."""
    ordered = sorted(values)

    def rank(q: float) -> float | None:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None

    return {"n": len(ordered), "p50": rank(0.5), "p90": rank(0.9), "max": ordered[-1] if ordered else None}


def _events() -> tuple[dict[str, list[tuple[float, int | None]]], list[tuple[str, float]], Counter[str]]:
    """Claims per occurrence in order (time, owner pid), successes (occurrence, time), statuses."""
    from django.db.models import Count

    from django_durable_scheduler.models import Event, Occurrence
    from django_durable_scheduler.rules import events

    claims: dict[str, list[tuple[float, int | None]]] = defaultdict(list)
    rows = Event.objects.filter(event_type__in=(events.OCCURRENCE_CLAIMED, events.OCCURRENCE_RECLAIMED))
    for occurrence, at, owner in rows.order_by("event_id").values_list(
        "occurrence_id", "occurred_at", "owner_id"
    ):
        claims[occurrence].append((at.timestamp(), _owner_pid(owner)))
    successes = [
        (occurrence, at.timestamp())
        for occurrence, at in Event.objects.filter(event_type=events.OCCURRENCE_SUCCEEDED).values_list(
            "occurrence_id", "occurred_at"
        )
    ]
    statuses = Counter(
        {row["status"]: row["n"] for row in Occurrence.objects.values("status").annotate(n=Count("pk"))}
    )
    return claims, successes, statuses


def analyse(n: int, kills: list[Kill]) -> dict[str, Any]:
    """The run's figures from its events (see the module's docstring)."""
    claims, successes, statuses = _events()
    killed = {k.pid: k.at for k in kills}
    first_claim: dict[int, float] = {}
    stranded: list[float] = []
    succeeded = {occurrence for occurrence, _ in successes}
    unreclaimed = 0
    for occurrence, timeline in claims.items():
        for index, (at, pid) in enumerate(timeline):
            if pid is not None and at < first_claim.get(pid, float("inf")):
                first_claim[pid] = at
            # A claim of a killed worker followed by another claim: it never settled it.
            if pid in killed and index + 1 < len(timeline):
                stranded.append(timeline[index + 1][0] - killed[pid])
            elif pid in killed and occurrence not in succeeded:
                unreclaimed += 1
    gaps = [
        first_claim[k.replacement] - k.at
        for k in kills
        if k.replacement is not None and k.replacement in first_claim
    ]
    per_occurrence = Counter(occurrence for occurrence, _ in successes)
    start = min((t[0][0] for t in claims.values() if t), default=None)
    end = max((at for _, at in successes), default=None)
    wall = end - start if start is not None and end is not None else None
    return {
        "n": n,
        "wall_s": wall,
        "throughput": n / wall if wall else None,
        "statuses": dict(statuses),
        "all_succeeded": statuses.get("succeeded", 0) == n and sum(statuses.values()) == n,
        "double_successes": sum(1 for c in per_occurrence.values() if c > 1),
        "claimed_more_than_once": sum(1 for t in claims.values() if len(t) > 1),
        "kills": len(kills),
        "stranded_s": _stats(stranded),
        "stranded_never_reclaimed": unreclaimed,
        "replacement_gap_s": _stats(gaps),
        "replacements_without_claim": sum(
            1 for k in kills if k.replacement is None or k.replacement not in first_claim
        ),
    }


# --------------------------------------------------------------------------- the report


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def line(r: dict[str, Any], lease: float) -> str:
    stranded, gap = r["stranded_s"], r["replacement_gap_s"]
    return (
        f"{r['mode']}, rep {r['rep']}: {r['n']:,} in {_s(r['wall_s'])} s = {_s(r['throughput'], 0)}/s;"
        f" all succeeded {'yes' if r['all_succeeded'] else 'NO ' + str(r['statuses'])},"
        f" double successes {r['double_successes']}, claimed more than once {r['claimed_more_than_once']};"
        f" kills {r['kills']}; stranded {stranded['n']} (never reclaimed {r['stranded_never_reclaimed']}):"
        f" kill -> reclaim p50 {_s(stranded['p50'])}"
        f" p90 {_s(stranded['p90'])} max {_s(stranded['max'])} s (lease {lease:g} s);"
        f" kill -> replacement's first claim p50 {_s(gap['p50'])} p90 {_s(gap['p90'])} s"
        f" ({r['replacements_without_claim']} without a claim); fresh database {r['setup_s']:.1f} s,"
        f" enqueue {r['enqueue_s']:.1f} s;"
        f" load {r['load_before']:.2f} -> {r['load_after']:.2f}"
    )


def summary(results: list[dict[str, Any]], lease: float) -> dict[str, Any]:
    """Per mode: the medians over the repetitions; the throughput kept against ``none``, from
    the medians and per repetition (the runs of one repetition ran side by side in time)."""
    out: dict[str, Any] = {}
    by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by_mode[r["mode"]].append(r)
    for mode, runs in by_mode.items():
        rates = [r["throughput"] for r in runs if r["throughput"] and not r["problem"]]
        out[mode] = {
            "throughput": rates,
            "throughput median": median(rates) if rates else None,
            "wall median": median([r["wall_s"] for r in runs if r["wall_s"]]) if rates else None,
            "audit": all(r["all_succeeded"] and not r["double_successes"] for r in runs),
            "claimed more than once": [r["claimed_more_than_once"] for r in runs],
            "stranded p90": [r["stranded_s"]["p90"] for r in runs],
            "stranded max": [r["stranded_s"]["max"] for r in runs],
            "replacement gap p50": [r["replacement_gap_s"]["p50"] for r in runs],
            "replacement gap p90": [r["replacement_gap_s"]["p90"] for r in runs],
        }
    base = out.get("none", {}).get("throughput median")
    for mode in ("kills", "processes"):
        if mode in out and base and out[mode]["throughput median"]:
            out[mode]["kept"] = out[mode]["throughput median"] / base
            pairs: dict[int, dict[str, float]] = defaultdict(dict)
            for r in results:
                pairs[r["rep"]][r["mode"]] = r["throughput"]
            out[mode]["kept per rep"] = [
                p[mode] / p["none"] for _, p in sorted(pairs.items()) if p.get(mode) and p.get("none")
            ]
    out["stranded target s"] = lease + 1
    return out


def print_summary(s: dict[str, Any]) -> None:
    def many(values: list[float | None], digits: int = 2) -> str:
        return ", ".join(_s(v, digits) for v in values)

    print()
    for mode in MODES:
        if mode not in s:
            continue
        m = s[mode]
        kept = f"; kept {m['kept']:.1%} of none (per rep {many(m['kept per rep'], 3)})" if "kept" in m else ""
        print(
            f"{mode:>9}: throughput median {_s(m['throughput median'], 0)}/s"
            f" (each {many(m['throughput'], 0)}),"
            f" wall median {_s(m['wall median'])} s{kept}"
        )
        print(
            f"{'':>9}  audit {'ok' if m['audit'] else 'FAILED'} (every one succeeded, no double success);"
            f" claimed more than once: {m['claimed more than once']}"
        )
        if mode != "none":
            print(
                f"{'':>9}  stranded kill -> reclaim p90 {many(m['stranded p90'])} s,"
                f" max {many(m['stranded max'])} s"
                f" (target p90 <= lease + 1 = {s['stranded target s']:g} s); kill -> replacement's first"
                f" claim p50 {many(m['replacement gap p50'])} s, p90 {many(m['replacement gap p90'])} s"
            )


# --------------------------------------------------------------------------- the run


def uptime(when: str) -> float:
    text = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    say(f"uptime at the {when}: {text}")
    if load > LOAD_WARNING:
        say(
            f"WARNING: 1-minute load {load:.2f} > {LOAD_WARNING}:"
            " not a quiet machine, the figures are not results"
        )
    return load


def supports_processes(env: dict[str, str]) -> bool:
    """Whether the runscheduler the workers run has ``--processes`` (the supervisor)."""
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", **env}
    proc = subprocess.run(
        [*MANAGE, "runscheduler", "--help"], cwd=ROOT, env=full, capture_output=True, text=True
    )
    return "--processes" in proc.stdout


@contextlib.contextmanager
def autovacuum(url: str, mode: str) -> Iterator[dict[str, str]]:
    """PostgreSQL: autovacuum as the server has it (said in the output: the local server runs
    with it off, and a drain is short), or on for the run and restored (bench/history.py's)."""
    if urlsplit(url).scheme == "sqlite":
        yield {}
        return
    if mode == "on":
        from bench.history import autovacuum_on

        with autovacuum_on(url) as state:
            yield state
        return
    import psycopg

    with psycopg.connect(_libpq(url, "postgres"), autocommit=True) as conn:
        setting = str(conn.execute("SHOW autovacuum").fetchone()[0])  # type: ignore[index]
    say(
        f"autovacuum is {setting} on the server, left as it is (a short drain; --autovacuum on to turn it on)"
    )
    yield {"as-is": setting}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.kill", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=PG_URL, help=f"database (default {PG_URL}; or sqlite:////abs/file)")
    p.add_argument("--n", type=int, default=40_000, help="no-op occurrences per run (default 40,000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every mode (default 3)")
    p.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated, run in this order per repetition"
    )
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument("--lease", type=float, default=5.0, help="runscheduler --lease seconds (default 5)")
    p.add_argument("--pick", choices=("oldest", "random"), default="oldest", help="which worker a kill takes")
    p.add_argument("--seed", type=int, default=0, help="--pick random: random.Random seed (default 0)")
    p.add_argument(
        "--autovacuum", choices=("as-is", "on"), default="as-is", help="PostgreSQL (default as-is)"
    )
    p.add_argument("--every", type=float, default=1.0, help="seconds between kills (default 1)")
    p.add_argument("--stall", type=float, default=60.0, help="a run fails after this long without a success")
    p.add_argument(
        "--code", default=None, help="a checkout whose django_durable_scheduler every process runs"
    )
    p.add_argument("--out", default=None, help="results file (default bench/results-<date>-kill.json)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or not set(modes) <= set(MODES):
        parser().error(f"--modes takes some of {','.join(MODES)}")
    if args.n < 1 or args.reps < 1 or args.workers < 1 or args.lease < 1:
        parser().error("--n, --reps, --workers and --lease must be at least 1")
    if args.every <= 0 or args.stall <= 0:
        parser().error("--every and --stall must be positive")
    os.environ["DATABASE_URL"] = args.url
    env = {"PYTHONPATH": str(ROOT)}
    if args.code:
        # Only the package from there (a link in a directory of its own, first on the path; no
        # working directory on it, PYTHONSAFEPATH): bench/ and its settings stay this checkout's.
        package = Path(args.code).resolve() / "django_durable_scheduler"
        if not (package / "__init__.py").exists():
            parser().error(f"--code: no django_durable_scheduler package in {args.code}")
        shim = Path(tempfile.mkdtemp(prefix="dschbench-kill-code-"))
        (shim / "django_durable_scheduler").symlink_to(package)
        sys.path.insert(0, str(shim))
        env.update(PYTHONPATH=f"{shim}{os.pathsep}{ROOT}", PYTHONSAFEPATH="1")
    import django

    django.setup()
    import django_durable_scheduler

    package = Path(django_durable_scheduler.__file__).resolve().parent
    say(f"django_durable_scheduler from {package}; {args.url}")
    if "processes" in modes and not supports_processes(env):
        say("runscheduler has no --processes here (the supervisor): mode processes skipped")
        modes.remove("processes")
    started = time.monotonic()
    load_start = uptime("start")
    results: list[dict[str, Any]] = []
    with autovacuum(args.url, args.autovacuum) as vacuum:
        try:
            for rep in range(args.reps):
                for mode in modes:
                    results.append(run_once(mode, rep, args, env))
        finally:
            drop_database(args.url)
    load_end = uptime("end")
    s = summary(results, args.lease)
    print_summary(s)
    print(
        f"\nautovacuum: {vacuum or 'n/a (SQLite)'};"
        f" load {load_start:.2f} at the start, {load_end:.2f} at the end"
    )
    out = Path(args.out or ROOT / "bench" / f"results-{datetime.now(UTC):%Y-%m-%d}-kill.json")
    meta = {"argv": argv, "args": vars(args), "minutes": round((time.monotonic() - started) / 60, 1)}
    meta.update(load_start=load_start, load_end=load_end, autovacuum=vacuum, modes=modes)
    out.write_text(json.dumps({"meta": meta, "summary": s, "runs": results}, indent=1, default=str) + "\n")
    say(f"wrote {out}")
    return (
        0
        if all(not r["problem"] and r["all_succeeded"] and not r["double_successes"] for r in results)
        else 1
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
