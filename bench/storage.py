"""Bytes per job on PostgreSQL: this package against procrastinate, for plain jobs.

    .venv-bench/bin/python bench/storage.py [--n 20000] [--url postgres://postgres@127.0.0.1:5432/dschbench_storage]

(``python3 bench/run.py --setup-only`` makes ``.venv-bench``.) Each system enqueues ``n`` no-op
jobs through its public API (ours: a job created without an authority envelope, then
``enqueue_many`` in chunks; procrastinate: ``defer`` one by one, it has no bulk call that keeps
its per-job triggers), drains them with its own worker command, and is then measured: the
``pg_total_relation_size`` (heap, TOAST, indexes, free-space and visibility maps) of every table
the system owns, partitions included, after the run, after ``VACUUM`` and after ``VACUUM FULL``,
divided by ``n``. Bytes are results, not timings: a noisy machine gives the same figures.
The database named by ``--url`` (a ``dschbench*`` name) is dropped and created here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# An earlier commit's package to measure instead of the working tree's (bench/baselines.py).
if os.environ.get("BENCH_PACKAGE_DIR"):
    sys.path.insert(0, os.environ["BENCH_PACKAGE_DIR"])

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/dschbench_storage"
CHUNK = 1000
# What each system owns: its tables by name prefix (partitions are found from their parent).
PREFIXES = {"ours": "durable_scheduler_", "procrastinate": "procrastinate_"}


def say(message: str) -> None:
    print(f"[storage] {message}", flush=True)


def _tables(prefix: str) -> list[str]:
    """The system's top-level tables (a partition is counted with its parent)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            " AND c.relname LIKE %s ORDER BY c.relname",
            [prefix.replace("_", r"\_") + "%"],
        )
        return [row[0] for row in cursor.fetchall()]


def _sizes(prefix: str) -> dict[str, dict[str, int]]:
    """Per table: its total bytes (with partitions, TOAST and indexes), its heap, its indexes'
    bytes, and its live and dead tuples (the statistics collector's view, after a flush)."""
    from django.db import connection

    out: dict[str, dict[str, int]] = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        for table in _tables(prefix):
            cursor.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(t.relid)), 0),"
                " COALESCE(SUM(pg_relation_size(t.relid)), 0),"
                " COALESCE(SUM(pg_indexes_size(t.relid)), 0),"
                " COALESCE(SUM(s.n_live_tup), 0), COALESCE(SUM(s.n_dead_tup), 0)"
                # A plain table is no partition tree: it is added to its (empty) tree.
                " FROM (SELECT relid FROM pg_partition_tree(%s::regclass) UNION SELECT %s::regclass) t"
                " LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid",
                [table, table],
            )
            total, heap, indexes, live, dead = (int(v) for v in cursor.fetchone())
            out[table] = {"total": total, "heap": heap, "indexes": indexes, "live": live, "dead": dead}
    return out


def _index_sizes(prefix: str) -> dict[str, int]:
    """Every index of the system's tables (partitions' indexes summed under their parent's name)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(p.relname, i.relname), SUM(pg_relation_size(i.oid))"
            " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " JOIN pg_class t ON t.oid = x.indrelid"
            " LEFT JOIN pg_inherits h ON h.inhrelid = i.oid LEFT JOIN pg_class p ON p.oid = h.inhparent"
            " WHERE t.relname LIKE %s GROUP BY 1 ORDER BY 2 DESC",
            [prefix.replace("_", r"\_") + "%"],
        )
        return {name: int(size) for name, size in cursor.fetchall()}


def _vacuum(prefix: str, full: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in _tables(prefix):
            cursor.execute(f'VACUUM {"FULL " if full else ""}ANALYZE "{table}"')


def _measure(system: str, n: int) -> dict[str, Any]:
    prefix = PREFIXES[system]
    result: dict[str, Any] = {}
    for stage in ("after run", "after VACUUM", "after VACUUM FULL"):
        if stage != "after run":
            _vacuum(prefix, full=stage.endswith("FULL"))
        sizes = _sizes(prefix)
        result[stage] = {
            "bytes_per_job": sum(s["total"] for s in sizes.values()) / n,
            "tables": {
                t: {k: v / n if k in ("total", "heap", "indexes") else v for k, v in s.items()}
                for t, s in sizes.items()
                if s["total"]
            },
        }
        if stage == "after run":
            result["indexes_per_job"] = {
                name: size / n for name, size in _index_sizes(prefix).items() if size
            }
    return result


def _drain(argv: list[str], label: str) -> float:
    from bench.harness import child_env

    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{label} worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return time.perf_counter() - start


def run_ours(n: int) -> dict[str, Any]:
    from datetime import UTC, datetime

    import django_durable_scheduler as scheduler
    from django_durable_scheduler.models import Occurrence

    # A plain job: no authority envelope (the default principal), no limit, chain or key.
    scheduler.create_job("storage-noop", "bench.noop")
    now = datetime.now(UTC)
    for first in range(0, n, CHUNK):
        items = [{"scheduled_for": now, "trigger_key": f"s:{i}"} for i in range(first, min(n, first + CHUNK))]
        scheduler.enqueue_many("storage-noop", items)
    seconds = _drain([sys.executable, "-m", "django", "runscheduler", "--burst"], "ours")
    done = Occurrence.objects.filter(status="succeeded").count()
    if done != n:
        raise SystemExit(f"ours: {done} of {n} succeeded")
    say(f"ours: {n} enqueued and drained ({seconds:.1f} s)")
    return _measure("ours", n)


def run_procrastinate(n: int) -> dict[str, Any]:
    from django.db import connection

    from bench.benchapp.tasks import p_noop  # type: ignore[attr-defined]

    for _ in range(n):
        p_noop.defer()
    argv = [sys.executable, "-m", "django", "procrastinate", "worker", "--concurrency", "8", "--one-shot"]
    seconds = _drain(argv, "procrastinate")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        done = cursor.fetchone()[0]
    if done != n:
        raise SystemExit(f"procrastinate: {done} of {n} succeeded")
    say(f"procrastinate: {n} deferred and drained ({seconds:.1f} s)")
    return _measure("procrastinate", n)


def _print(results: dict[str, dict[str, Any]]) -> None:
    stages = ("after run", "after VACUUM", "after VACUUM FULL")
    print(f"{'bytes per job':<16}" + "".join(f"{s:>20}" for s in stages))
    for system, result in results.items():
        print(f"{system:<16}" + "".join(f"{result[s]['bytes_per_job']:>20,.0f}" for s in stages))
    if len(results) == 2:
        ours, peer = results["ours"], results["procrastinate"]
        ratios = [ours[s]["bytes_per_job"] / peer[s]["bytes_per_job"] for s in stages]
        print(f"{'ours / peer':<16}" + "".join(f"{r:>20.2f}" for r in ratios))
    for system, result in results.items():
        print(f"\n{system}, per table after the run (bytes per job; live and dead tuples):")
        for table, s in result["after run"]["tables"].items():
            print(
                f"  {table:<44} {s['total']:>8,.0f} (heap {s['heap']:,.0f}, indexes {s['indexes']:,.0f};"
                f" {s['live']:,} live, {s['dead']:,} dead)"
            )
        print(f"{system}, per index after the run (bytes per job):")
        for name, size in result["indexes_per_job"].items():
            print(f"  {name:<44} {size:>8,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="jobs per system (default 20000)")
    parser.add_argument("--url", default=DEFAULT_URL, help="a PostgreSQL database (dschbench* name)")
    parser.add_argument("--only", choices=sorted(PREFIXES), help="measure one system")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    os.environ["DATABASE_URL"] = args.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    from bench.suite import prepare_database

    prepare_database(args.url)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    results: dict[str, dict[str, Any]] = {}
    if args.only in (None, "ours"):
        results["ours"] = run_ours(args.n)
    if args.only in (None, "procrastinate"):
        results["procrastinate"] = run_procrastinate(args.n)
    _print(results)
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "results": results}, indent=1))


if __name__ == "__main__":
    main()
