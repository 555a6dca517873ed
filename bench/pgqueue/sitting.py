"""One sitting of the neutral PostgreSQL queue harness: ours (three ways) and procrastinate.

    python3 bench/pgqueue/sitting.py --harness ../postgresql-job-queue-benchmarking \\
        --harness-python ../pgqb-venv/bin/python --python .venv-bench/bin/python

Standard library only. The harness (hardbyte/postgresql-job-queue-benchmarking, with the
native-mode changes bench/log/2026-12-07-pgqueue-harness.md describes) runs once per cell and
system, one system after another in an order rotated per cell so that drift reaches them all:
a clean rate step, then the chaos and pressure scenarios with their phases shortened (``--scale``
lengthens them). Systems: ``dds`` (this package at its defaults), ``dds-prepared`` (the
workers' alias that prepares statements, docs/scaling.md), ``procrastinate`` (its unchanged
harness adapter) and ``dds-baseline`` (this adapter against another copy of the package:
``--baseline-dir``, or ``--baseline COMMIT`` exported with ``git archive``). Each run's
``summary.json`` and ``raw.csv`` are copied under ``--out`` with ``results.json`` (the table's
rows), and the table is printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent
SYSTEMS = ("dds", "dds-prepared", "procrastinate", "dds-baseline")
# A cell: its name, replicas, rate per replica, phase specs, stressed phase, the phase after it.
Cell = tuple[str, int, int, list[str], str, str]

# Cells: (name, replicas, phase specs with base seconds, the stressed phase, the phase after it).
# Phase names follow the harness's own scenarios of the same name; only durations differ.
W, B, S, R = 8, 15, 25, 20  # warmup, baseline, stress, recovery (seconds at --scale 1)
CHAOS_CELLS = {
    "crash_recovery": (
        2,
        [
            ("warmup", "warmup", W),
            ("baseline", "clean", B),
            ("kill", "kill-worker(instance=0)", S),
            ("restart", "start-worker(instance=0)", S),
            ("recovery", "clean", R),
        ],
        "kill",
        "recovery",
    ),
    "chaos_repeated_kills": (
        2,
        [
            ("warmup", "warmup", W),
            ("baseline", "clean", B),
            ("repeated", "repeated-kill(instance=0,period={period})", S + 10),
            # Longer than the 30 s lease: what the last kill stranded is run again within it.
            ("recovery", "clean", R + 15),
        ],
        "repeated",
        "recovery",
    ),
    "idle_in_tx_saturation": (
        1,
        [
            ("warmup", "warmup", W),
            ("clean_1", "clean", B),
            ("idle_1", "idle-in-tx", S),
            ("recovery_1", "recovery", R),
        ],
        "idle_1",
        "recovery_1",
    ),
    "active_readers": (
        1,
        [
            ("warmup", "warmup", W),
            ("clean_1", "clean", B),
            ("readers_1", "active-readers", S),
            ("recovery_1", "clean", R),
        ],
        "readers_1",
        "recovery_1",
    ),
    "chaos_pg_backend_kill": (
        1,
        [
            ("warmup", "warmup", W),
            ("baseline", "clean", B),
            ("kills", "pg-backend-kill(rate=2)", S),
            ("recovery", "clean", R),
        ],
        "kills",
        "recovery",
    ),
    "sustained_high_load": (
        1,
        [
            ("warmup", "warmup", W),
            ("clean_1", "clean", B),
            ("pressure_1", "high-load", S),
            ("recovery_1", "clean", R),
        ],
        "pressure_1",
        "recovery_1",
    ),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--harness", type=Path, required=True, help="the harness checkout (bench.py at its root)"
    )
    parser.add_argument(
        "--harness-python", required=True, help="a Python with the harness's and procrastinate's deps"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="the Python that runs our adapter (Django, psycopg)"
    )
    parser.add_argument("--pg-url-base", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument(
        "--db-prefix", default="dschbench_pgq_", help="prefix of every database the harness makes"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--cells", default="rates," + ",".join(CHAOS_CELLS))
    parser.add_argument("--rates", default="150,400,600,900", help="the clean rate step, jobs/s")
    parser.add_argument("--chaos-rate", type=int, default=200, help="jobs/s per replica in the other cells")
    parser.add_argument("--worker-count", type=int, default=32, help="WORKER_COUNT (the harness's default)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every phase's duration")
    parser.add_argument("--sample-every", type=int, default=2)
    parser.add_argument(
        "--baseline", default="18e9321", help="commit of dds-baseline (exported by git archive)"
    )
    parser.add_argument(
        "--baseline-dir", type=Path, help="a checkout of the baseline instead (its package is used)"
    )
    parser.add_argument("--out", type=Path, default=None, help="default bench/results-pgqueue-<UTC time>/")
    parser.add_argument("--table-only", type=Path, help="print the table of an earlier --out and stop")
    return parser.parse_args(argv)


def cells(args: argparse.Namespace) -> list[Cell]:
    """(name, replicas, rate per replica, phase specs, stressed phase, phase after) per cell."""
    found: list[Cell] = []
    wanted = args.cells.split(",")

    def secs(base: int) -> int:
        return max(4, round(base * float(args.scale)))

    if "rates" in wanted:
        for rate in (int(r) for r in args.rates.split(",")):
            specs = [f"warmup=warmup:{secs(W)}s", f"clean=clean:{secs(R)}s"]
            found.append((f"rate_{rate}", 1, rate, specs, "clean", ""))
    for name, (replicas, phases, stressed, after) in CHAOS_CELLS.items():
        if name in wanted:
            period = f"{max(3, round(10 * args.scale))}s"
            specs = [f"{label}={kind.format(period=period)}:{secs(base)}s" for label, kind, base in phases]
            found.append((name, replicas, args.chaos_rate, specs, stressed, after))
    return found


def native_adapters(args: argparse.Namespace, out: Path) -> Path:
    """The harness's BENCH_NATIVE_ADAPTERS file: how to start each system without docker."""
    ours = {"PYTHONSAFEPATH": "1", "DJANGO_SETTINGS_MODULE": "bench.pgqueue.settings"}
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    baseline = baseline_package(args)
    adapter = [args.python, "-m", "bench.pgqueue.adapter"]
    spec = {
        "dds": {
            "BENCH_PACKAGE_DIR": str(REPO),
            "PYTHONPATH": str(REPO),
            "BENCH_VERSION": head.stdout.strip(),
        },
        "dds-prepared": {
            "BENCH_PACKAGE_DIR": str(REPO),
            "PYTHONPATH": str(REPO),
            "BENCH_VERSION": head.stdout.strip(),
            "BENCH_PREPARED": "1",
        },
        "dds-baseline": {
            "BENCH_PACKAGE_DIR": str(baseline),
            "PYTHONPATH": f"{baseline}{os.pathsep}{REPO}",
            "BENCH_VERSION": args.baseline if not args.baseline_dir else str(args.baseline_dir),
        },
    }
    registry: dict[str, dict[str, object]] = {
        system: {
            "bench_dir": str(HERE / "systems" / system),
            "argv": adapter,
            "cwd": str(REPO),
            "env": {**ours, **env, "BENCH_SYSTEM": system},
        }
        for system, env in spec.items()
    }
    registry["procrastinate"] = {
        "bench_dir": str(args.harness / "procrastinate-bench"),
        "argv": [args.harness_python, str(args.harness / "procrastinate-bench" / "main.py")],
        "env": {},
    }
    path = out / "native-adapters.json"
    path.write_text(json.dumps(registry, indent=2))
    return path


def baseline_package(args: argparse.Namespace) -> Path:
    """A directory holding only the baseline's ``django_durable_scheduler`` (nothing else of
    its tree may come first on the path: its ``bench`` package would hide this one)."""
    if args.baseline_dir:
        root = REPO / ".bench-baselines" / f"pgq-{args.baseline_dir.name}"
        root.mkdir(parents=True, exist_ok=True)
        link = root / "django_durable_scheduler"
        if not link.exists():
            link.symlink_to((args.baseline_dir / "django_durable_scheduler").resolve())
        return root
    root = REPO / ".bench-baselines" / args.baseline
    if not (root / "django_durable_scheduler").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", args.baseline, "django_durable_scheduler"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return Path(root)


def run_cell(
    args: argparse.Namespace, env: dict[str, str], cell: Cell, system: str, out: Path
) -> dict[str, Any]:
    """One harness run of one system through one cell; its summary, copied, and how it ended."""
    name, replicas, rate, specs, _, _ = cell
    seconds = sum(int(re.sub(r"\D", "", spec.rsplit(":", 1)[1])) for spec in specs)
    argv = [
        args.harness_python,
        str(args.harness / "bench.py"),
        "run",
        "--systems",
        system,
        "--fast",
        "--skip-build",
        "--producer-rate",
        str(rate),
        "--replicas",
        str(replicas),
        "--worker-count",
        str(args.worker_count),
        "--sample-every",
        str(args.sample_every),
    ]
    for spec in specs:
        argv += ["--phase", spec]
    log = out / f"{name}.{system}.log"
    started = time.monotonic()
    with log.open("w") as handle:
        proc = subprocess.Popen(
            argv, cwd=args.harness, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | str = proc.wait(timeout=seconds * 2 + 180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = "timeout"
    found = re.findall(r"results at: (\S+)", log.read_text())
    record = {
        "cell": name,
        "system": system,
        "rate": rate,
        "replicas": replicas,
        "exit": code,
        "wall_s": round(time.monotonic() - started, 1),
    }
    if found and (Path(found[-1]) / "summary.json").exists():
        run_dir = Path(found[-1])
        target = out / f"{name}.{system}"
        target.mkdir(exist_ok=True)
        shutil.copy(run_dir / "summary.json", target / "summary.json")
        with (run_dir / "raw.csv").open("rb") as raw, gzip.open(target / "raw.csv.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        record["summary"] = json.loads((run_dir / "summary.json").read_text())
    return record


def row(record: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """The table's figures for one run: the stressed (or clean) phase, and the phase after it."""
    _, _, _, _, stressed, after = cell
    phases = record.get("summary", {}).get("systems", {}).get(record["system"], {}).get("phases", {})
    hot, tail = phases.get(stressed, {}), phases.get(after, {})

    def metric(block: dict[str, Any], name: str) -> float | None:
        found = block.get("metrics", {}).get(name) or {}
        return found.get("median")

    return {
        "cell": record["cell"],
        "system": record["system"],
        "offered": metric(hot, "enqueue_rate"),
        "throughput": metric(hot, "completion_rate"),
        "p50": metric(hot, "claim_p50_ms"),
        "p95": metric(hot, "claim_p95_ms"),
        "p99": metric(hot, "claim_p99_ms"),
        "lost": tail.get("jobs_lost"),
        "recovery_s": tail.get("chaos_recovery_time_s", tail.get("recovery_to_baseline_s")),
        "dead_tuples": hot.get("peak_dead_tup"),
        "end": "ok"
        if record["exit"] == 0
        else ("TIMEOUT" if record["exit"] == "timeout" else f"exit {record['exit']}"),
    }


def table(rows: list[dict[str, Any]]) -> str:
    def fmt(value: object, digits: int = 1) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.{digits}f}"
        return str(value)

    lines = [
        "| cell | system | offered/s | done/s | claim p50 / p95 / p99 ms | jobs lost | recovery s"
        " | dead tuples, peak | end |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        claim = " / ".join(fmt(r[k]) for k in ("p50", "p95", "p99"))
        lines.append(
            f"| {r['cell']} | {r['system']} | {fmt(r['offered'], 0)} | {fmt(r['throughput'], 0)} | {claim} "
            f"| {fmt(r['lost'], 0)} | {fmt(r['recovery_s'])} | {fmt(r['dead_tuples'], 0)} | {r['end']} |"
        )
    return "\n".join(lines)


def autovacuum(args: argparse.Namespace) -> str:
    """The server's ``autovacuum`` setting: the dead-tuple figures assume it is on."""
    probe = (
        "import psycopg, sys; print(psycopg.connect(sys.argv[1]).execute('SHOW autovacuum').fetchone()[0])"
    )
    found = subprocess.run(
        [args.harness_python, "-c", probe, f"{args.pg_url_base}/postgres"], capture_output=True, text=True
    )
    return found.stdout.strip() or found.stderr.strip()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table_only:
        print(table(json.loads((args.table_only / "results.json").read_text())["rows"]))
        return 0
    if "BENCH_NATIVE_ADAPTERS" not in (args.harness / "bench_harness" / "adapters.py").read_text():
        print(
            "sitting: the harness has no native mode yet: bench/log/2026-12-07-pgqueue-harness.md",
            file=sys.stderr,
        )
        return 2
    if autovacuum(args) != "on":
        print("[sitting] warning: autovacuum is not on: dead tuples will not be reclaimed", file=sys.stderr)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M")
    out = (args.out or REPO / "bench" / f"results-pgqueue-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "BENCH_PG_URL_BASE": args.pg_url_base,
        "BENCH_DB_PREFIX": args.db_prefix,
        "BENCH_NATIVE_ADAPTERS": str(native_adapters(args, out)),
    }
    systems = args.systems.split(",")
    rows, records = [], []
    for index, cell in enumerate(cells(args)):
        for system in systems[index % len(systems) :] + systems[: index % len(systems)]:
            print(f"[sitting] {cell[0]} {system} ...", file=sys.stderr, flush=True)
            record = run_cell(args, env, cell, system, out)
            records.append({k: v for k, v in record.items() if k != "summary"})
            rows.append(row(record, cell))
            print(f"[sitting] {cell[0]} {system}: {rows[-1]['end']} in {record['wall_s']} s", file=sys.stderr)
            (out / "results.json").write_text(
                json.dumps({"args": sys.argv[1:], "runs": records, "rows": rows}, indent=2)
            )
    print(table(rows))
    print(f"\nresults: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
