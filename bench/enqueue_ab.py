"""One-by-one enqueue of this package against an earlier commit, alternating, one process each.

W1 runs each system a few times in a run of many workloads; a change of a few percent to the
enqueue is lost in its spread. This times only ``kernel.enqueue`` of a no-op (the same call as
W1's, through bench/systems.py), a fresh process per sample, the two code copies alternating for
``--rounds``, each on a fresh database of its own built by its own migrations, and prints the
wall and CPU time per call, medians and ranges, and main's ratio. ``--bulk N`` times W1's bulk
enqueue instead (``kernel.enqueue_many`` of N per call), per occurrence. Run it inside .venv-bench:

    .venv-bench/bin/python -m bench.enqueue_ab --baseline 03da7b9 --db sqlite --rounds 8
    .venv-bench/bin/python -m bench.enqueue_ab --baseline 7777f16 --db postgres --rounds 8
    .venv-bench/bin/python -m bench.enqueue_ab --baseline 03da7b9 --db sqlite --bulk 2000

The baseline's copy is exported into ``.bench-baselines/`` as bench/run.py's ``--baseline`` does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .baselines import ROOT, resolve

PG_URL = "postgres://postgres@127.0.0.1:5432/dschbench_ab"


def sample(code: Path, url: str, calls: int, bulk: int = 0) -> tuple[float, float]:
    """One process: Django set up on ``url`` with the package at ``code``, ``calls`` enqueues
    after a warm-up (with ``bulk``, calls of ``enqueue_many`` of that many, ``calls`` occurrences
    in all at least); (wall, CPU) microseconds per occurrence."""
    if bulk:
        times, count, call = max(1, -(-calls // bulk)), bulk, f"ours.enqueue_many({bulk})"
    else:
        times, count, call = calls, 1, "ours.enqueue_noop(i)"
    script = f"""
import os, sys, time
sys.path[:0] = [{str(code)!r}, {str(ROOT)!r}]
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
import django
django.setup()
import django_durable_scheduler
assert django_durable_scheduler.__file__.startswith({str(code)!r}), django_durable_scheduler.__file__
from django.core.management import call_command
call_command("migrate", verbosity=0)
from bench import systems
ours = systems.Ours()
ours.setup()
ours.run = time.time_ns() % 10**12
for i in range(2):
    {call}
    ours.run += 1
wall, cpu = time.perf_counter(), time.process_time()
for i in range({times}):
    {call}
    ours.run += 1
made = {times * count}
print((time.perf_counter() - wall) / made * 1e6, (time.process_time() - cpu) / made * 1e6)
"""
    env = {**os.environ, "DATABASE_URL": url, "PYTHONSAFEPATH": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True)
    wall, cpu = out.stdout.split()[-2:]
    return float(wall), float(cpu)


def _database(kind: str, name: str, directory: str, *, create: bool = True) -> str:
    """A fresh database for one side: a file in ``directory``, or ``dschbench_ab_<name>``
    (dropped again with ``create=False``)."""
    if kind == "sqlite":
        return f"sqlite:///{directory}/{name}.sqlite3"
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "dschbench_ab_{name}" WITH (FORCE)')
        if create:
            conn.execute(f'CREATE DATABASE "dschbench_ab_{name}"')
    return f"{PG_URL}_{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the earlier commit")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=1500, help="enqueues timed per sample")
    parser.add_argument("--bulk", type=int, default=0, help="time enqueue_many of this many instead")
    args = parser.parse_args()
    (baseline,) = resolve([args.baseline])
    # Both copies byte-compiled first, as bench/run.py does: see bench/README, "Running them".
    compiled = [str(baseline.path), str(ROOT / "django_durable_scheduler")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *compiled], check=True)
    with tempfile.TemporaryDirectory() as directory:
        sides = {"main": (ROOT, _database(args.db, "main", directory))}
        sides[baseline.short] = (baseline.path, _database(args.db, baseline.short, directory))
        times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, (code, url) in sides.items():
                times[side].append(sample(code, url, args.calls, args.bulk))
        for side in sides:
            _database(args.db, side, directory, create=False)
    what = "one-by-one enqueue, us per call"
    if args.bulk:
        what = f"bulk enqueue of {args.bulk}, us per occurrence"
    print(f"{args.db}: {what}, {args.rounds} samples of {args.calls} each")
    for side, samples in times.items():
        wall = [w for w, _ in samples]
        cpu = [c for _, c in samples]
        print(
            f"  {side:8s} wall {statistics.median(wall):6.0f} ({min(wall):.0f}-{max(wall):.0f})"
            f"  cpu {statistics.median(cpu):6.0f} ({min(cpu):.0f}-{max(cpu):.0f})"
        )
    main_wall = statistics.median(w for w, _ in times["main"])
    base_wall = statistics.median(w for w, _ in times[baseline.short])
    print(f"  main vs {baseline.short}: {base_wall / main_wall:.2f}x (wall; above 1 main is faster)")


if __name__ == "__main__":
    main()
