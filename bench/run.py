#!/usr/bin/env python3
"""Benchmark this package against its peers: ``python3 bench/run.py [--quick] [--db sqlite,postgres]``.

Standard library only. Builds ``.venv-bench`` (Python 3.11, Django 5.2, this package with the
postgres extra, and the pinned peers of bench/requirements.txt), then runs bench/suite.py once per
database (PostgreSQL ``postgres://postgres@127.0.0.1:5432/dschbench``, created and dropped here;
SQLite in a temporary file), prints one table and writes ``bench/results-<date>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python3 bench/run.py), the repository root is not on the path yet.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import baselines  # noqa: E402

PACKAGE = baselines.PACKAGE

BENCH = ROOT / "bench"
VENV = ROOT / ".venv-bench"
REQUIREMENTS = BENCH / "requirements.txt"
DJANGO = "django>=5.2,<6"
PG_URL = "postgres://postgres@127.0.0.1:5432/dschbench"


def say(message: str) -> None:
    print(f"[run.py] {message}", flush=True)


def python_311() -> Path:
    """This Python if it is 3.11, else pyenv's (a pyenv shim on PATH fails unless 3.11 is active)."""
    if sys.version_info[:2] == (3, 11):
        return Path(sys.executable)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if found := sorted(pyenv.glob("3.11.*/bin/python3")):
        return found[-1]
    raise SystemExit("bench/run.py needs Python 3.11 (run it with one, or install one with pyenv)")


def ensure_bench_venv() -> Path:
    """``.venv-bench``'s Python, made or brought up to date (pip quiet unless it fails)."""
    base = python_311()
    python = VENV / "bin" / "python"
    digest = hashlib.sha256()
    for part in (REQUIREMENTS, ROOT / "pyproject.toml"):
        digest.update(part.read_bytes())
    digest.update(f"{DJANGO}|{ROOT}|{base}".encode())
    key = digest.hexdigest()
    stamp = VENV / ".durable-scheduler-stamp.json"
    try:
        current = json.loads(stamp.read_text()).get("key")
    except (OSError, ValueError):
        current = None
    if current == key and python.exists():
        say(".venv-bench is up to date")
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    say(f"creating .venv-bench with {base}")
    if subprocess.call([str(base), "-m", "venv", str(VENV)]) != 0:
        raise SystemExit("could not create .venv-bench")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], capture_output=True)
    say(f"pip install -e .[postgres] {DJANGO!r} -r bench/requirements.txt into .venv-bench")
    cmd = [str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[postgres]", DJANGO]
    if subprocess.call([*cmd, "-r", str(REQUIREMENTS)]) != 0:
        raise SystemExit("pip install into .venv-bench failed (output above)")
    stamp.write_text(json.dumps({"key": key}))
    return python


def compile_sources(python: Path, folders: list[Path]) -> None:
    """Byte-compile our package (and the baselines' copies) before anything is timed: the
    peers come from wheels, which pip compiles at install, while an editable install is
    compiled at each process start wherever bytecode is not written (PYTHONDONTWRITEBYTECODE),
    which would time our compiler, not our start."""
    if folders:
        subprocess.run([str(python), "-m", "compileall", "-q", *map(str, folders)], check=True)


def pg_answers(python: Path) -> str | None:
    probe = (
        "import psycopg; psycopg.connect(host='127.0.0.1', port=5432, user='postgres', dbname='postgres',"
        " connect_timeout=5).close()"
    )
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {proc.returncode}"


# --------------------------------------------------------------------------- report


def _fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit in ("ops/s", "tps"):
        return f"{value:,.0f}"
    if unit == "ms":
        return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"
    return f"{value:,.2f}"


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        values = [v for v in row["samples"] if v is not None]
        failed = len(row["samples"]) - len(values)
        out.append(
            {
                **row,
                "n": len(values),
                "failed_runs": failed,
                "median": statistics.median(values) if values else None,
                "min": min(values) if values else None,
                "max": max(values) if values else None,
            }
        )
    # Ratio of each "ours" row (either enqueue API) to the best peer on the same database and
    # workload, and to django-tasks-db, the peer behind the same django.tasks API (> 1: ours is better).
    peers = ("django-tasks-db", "django-q2", "procrastinate")
    for row in out:
        if not row["system"].startswith("ours") or row["median"] is None:
            continue
        rivals = [
            r
            for r in out
            if r["db"] == row["db"]
            and r["workload"] == row["workload"]
            and r["system"] in peers
            and r["median"]
        ]
        if not rivals:
            continue
        if row["better"] == "higher":
            best = max(rivals, key=lambda r: r["median"])
        else:
            best = min(rivals, key=lambda r: r["median"])
        row["ratio"] = _ratio(row, best)
        row["best_peer"] = best["system"]
        tasks_db = next((r for r in rivals if r["system"] == "django-tasks-db"), None)
        if tasks_db is not None:
            row["ratio_vs_django_tasks_db"] = _ratio(row, tasks_db)
    return out


def _ratio(row: dict, peer: dict) -> float | None:
    """``row``'s median against ``peer``'s, above 1 when ``row`` is better."""
    if row["better"] == "higher":
        return row["median"] / peer["median"]
    return peer["median"] / row["median"] if row["median"] else None


def print_table(rows: list[dict]) -> None:
    headers = (
        "db",
        "workload",
        "system",
        "unit",
        "median",
        "min-max",
        "n",
        "ours vs best peer",
        "vs django-tasks-db",
    )
    if not rows:
        print("\n(no results)")
        return
    table = []
    for r in rows:
        ratio = f"{r['ratio']:.2f}x ({r['best_peer']})" if r.get("ratio") else ""
        vs_dtdb = f"{r['ratio_vs_django_tasks_db']:.2f}x" if r.get("ratio_vs_django_tasks_db") else ""
        unit = r["unit"]
        spread = f"{_fmt(r['min'], unit)}-{_fmt(r['max'], unit)}" if r["median"] is not None else "-"
        n = f"{r['n']}" + (f" ({r['failed_runs']} failed)" if r["failed_runs"] else "")
        table.append(
            (r["db"], r["workload"], r["system"], unit, _fmt(r["median"], unit), spread, n, ratio, vs_dtdb)
        )
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)] if table else []
    print()
    for row in (headers, tuple("-" * w for w in widths), *table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def print_extras(results: dict[str, dict]) -> None:
    for db, data in results.items():
        for name, plan in data.get("plans", {}).items():
            print(f"\n--- {db}: plan of {name}\n{plan}")
        profile = data.get("profile") or {}
        for mode, summary in profile.items():
            print(
                f"\n--- {db}: py-spy profile of our drain ({mode}; {summary.get('occurrences')} occurrences"
                f" in {summary.get('seconds', 0):.1f} s, {summary.get('samples')} samples)"
            )
            for key, label, count in (
                ("inclusive", "inclusive % of all samples", 12),
                (
                    "steady_inclusive",
                    "inclusive % of the steady state (no start-up, no idle helper threads)",
                    30,
                ),
                ("steady_self", "self % of the steady state", 20),
            ):
                if summary.get(key):
                    print(f"  {label}")
                    for name, pct in summary[key][:count]:
                        print(f"  {pct:10.1f}  {name}")
        census = data.get("queries_per_call") or {}
        if census:
            print(f"\n--- {db}: SQL statements per call (ours)")
            for name, count in census.items():
                print(f"  {count:4d}  {name}")
        for note in data.get("notes", []):
            print(f"note ({db}): {note}")


def drain_vs_pgbench(rows: list[dict]) -> list[str]:
    lines = []
    for clients in (1, 2):
        name = f"pgbench single-row UPDATE, {clients} client(s)"
        ref = next((r for r in rows if r["workload"] == name and r["median"]), None)
        if ref is None:
            continue
        for r in rows:
            if r["db"] == "postgres" and r["workload"] == f"W2 drain x{clients}" and r["median"]:
                lines.append(
                    f"postgres W2 drain x{clients} {r['system']}: {r['median']:,.0f}/s = "
                    f"{100 * r['median'] / ref['median']:.1f}% of pgbench -c {clients}"
                    f" ({ref['median']:,.0f} tps)"
                )
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for trying it out")
    parser.add_argument("--db", default="sqlite,postgres", help="comma-separated: sqlite,postgres")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per measurement (default 3)")
    parser.add_argument(
        "--workloads",
        default="w1,w2,w3,w4,pgbench,profile",
        help="subset of w1,w2,w3,w4,pgbench,profile, or scale (PostgreSQL: 1-8 processes, with a plot),"
        " or history (PostgreSQL: millions of settled rows against 10,000; bench/history.py),"
        " or batch (one batch's members against plain occurrences: settle rate, callback; bench/batch.py),"
        " or kill (throughput kept while a worker is SIGKILLed every second; bench/kill.py),"
        " or soak (PostgreSQL: a mixed load under fire, then an audit; bench/soak.py)",
    )
    parser.add_argument(
        "--minutes", type=float, default=30.0, help="soak: how long the load runs (default 30)"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="batch: runscheduler processes per drain (default 2)"
    )
    parser.add_argument(
        "--batch-profile",
        type=int,
        default=0,
        metavar="N",
        help="batch: one more pair of drains of N with the workers under py-spy (default none)",
    )
    parser.add_argument(
        "--autovacuum",
        choices=("on", "as-is"),
        default="on",
        help="batch on PostgreSQL: autovacuum on for the run, then restored (default), or as it is",
    )
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL database (dschbench* names only)")
    parser.add_argument("--out", default=None, help="results file (default bench/results-<date>.json)")
    parser.add_argument("--n", type=int, default=None, help="W1/W2 size (default 5000, quick 500)")
    parser.add_argument("--w3", type=int, default=None, help="W3 occurrences (default 200, quick 40)")
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="RESULTS",
        help="only merge results files of earlier runs (e.g. one per database) into one table and file",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="COMMIT",
        help="W1-W3 also on this commit's package, as ours@<sha>, interleaved with the working tree"
        " each repetition, with a table of main against it (repeat for several commits)",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help="only these systems of the working tree's run (comma-separated names, e.g."
        " 'ours,django-tasks-db,procrastinate'); default: every one",
    )
    parser.add_argument("--setup-only", action="store_true", help="build .venv-bench and stop")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    dbs = [d.strip() for d in args.db.split(",") if d.strip()]
    if not set(dbs) <= {"sqlite", "postgres"} or not dbs:
        parser.error("--db takes sqlite and/or postgres")
    if args.reps < 1:
        parser.error("--reps must be at least 1")

    if args.baseline and {"history", "batch"} & set(args.workloads.split(",")):
        parser.error("--baseline runs with the suite's workloads (w1-w3), not history or batch")
    if args.merge:
        return merge(args.merge, args.out)
    python = ensure_bench_venv()
    if args.setup_only:
        return 0
    compile_sources(python, [ROOT / PACKAGE, ROOT / "bench"])
    if "history" in args.workloads.split(","):
        # Its own databases, its own table and results file (bench/history.py).
        cmd = [str(python), "-m", "bench.history"] + (["--n", str(args.n)] if args.n else [])
        cmd += (["--w3", str(args.w3)] if args.w3 else []) + (["--out", args.out] if args.out else [])
        cmd += ["--reps", str(args.reps)] + (["--rows", "200000"] if args.quick else [])
        say(f"history: {' '.join(cmd[1:])}")
        return subprocess.call(cmd, cwd=ROOT)
    if "batch" in args.workloads.split(","):
        return run_batch(python, args, dbs, argv)
    if "kill" in args.workloads.split(","):
        return run_kill(python, args, dbs)
    if "soak" in args.workloads.split(","):
        # PostgreSQL only, its own database, checks and exit status (bench/soak.py).
        url = args.pg_url if args.pg_url != PG_URL else "postgres://postgres@127.0.0.1:5432/dsch_soak"
        cmd = [str(python), "-m", "bench.soak", "--minutes", str(args.minutes), "--url", url]
        cmd += ["--json", args.out] if args.out else []
        say(f"soak: {' '.join(cmd[1:])}")
        return subprocess.call(cmd, cwd=ROOT)
    started = time.monotonic()
    commits = baselines.resolve(args.baseline)
    compile_sources(python, [commit.path / PACKAGE for commit in commits])
    load_start = load_check("start")
    results: dict[str, dict] = {}
    tmp = Path(tempfile.mkdtemp(prefix="dschbench-"))
    for db in dbs:
        if db == "postgres":
            why = pg_answers(python)
            if why:
                say(f"skipping postgres: the server does not answer: {why}")
                continue
            url = args.pg_url
        else:
            url = f"sqlite:///{tmp / 'dschbench.sqlite3'}"
        if commits:
            data = run_rounds(python, db, url, args, commits, tmp)
        else:
            data = run_suite(python, db, url, args, args.workloads, args.reps, tmp / f"{db}.json")
        if data is not None:
            results[db] = data
    shutil.rmtree(tmp, ignore_errors=True)

    options = {"quick": args.quick, "reps": args.reps, "n": args.n, "w3": args.w3, "load_start": load_start}
    options["baselines"] = {b.label: b.sha for b in commits}
    report(results, argv, args.out, options, started)
    return 0 if results else 1


def run_suite(
    python: Path,
    db: str,
    url: str,
    args: argparse.Namespace,
    workloads: str,
    reps: int,
    out: Path,
    baseline: baselines.Baseline | None = None,
) -> dict | None:
    """One bench/suite.py process on ``url`` (the working tree's package, or ``baseline``'s:
    then ours alone); its results, None when it wrote none."""
    cmd = [str(python), "-m", "bench.suite", "--url", url, "--out", str(out), "--reps", str(reps)]
    cmd += ["--workloads", workloads] + (["--quick"] if args.quick else [])
    cmd += (["--n", str(args.n)] if args.n else []) + (["--w3", str(args.w3)] if args.w3 else [])
    systems = "ours" if baseline is not None else args.systems
    cmd += ["--systems", systems] if systems else []
    if "scale" in workloads:
        cmd += ["--plot", str(BENCH / f"scale-{datetime.now(UTC):%Y-%m-%d}.png")]
    who = "main" if baseline is None else baseline.label
    say(f"{db} ({who}): {' '.join(cmd[1:])}")
    env = dict(os.environ, **(baseline.env() if baseline is not None else {}))
    out.unlink(missing_ok=True)
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    data = json.loads(out.read_text()) if out.exists() else None
    if code:
        say(f"{db} ({who}): suite exited {code}")
        if data is not None:
            data["notes"] = [
                *data.get("notes", []),
                f"suite exited {code}: the workloads after the failure are missing",
            ]
    return data


def run_rounds(
    python: Path, db: str, url: str, args: argparse.Namespace, commits: list[baselines.Baseline], tmp: Path
) -> dict | None:
    """W1-W3 in rounds, one repetition of every commit and the working tree (with the peers) per
    round, each on its own fresh database; then the working tree's other workloads, once."""
    asked = [w.strip() for w in args.workloads.split(",") if w.strip()]
    rounds = [w for w in asked if w in baselines.ROUND_WORKLOADS]
    rest = [w for w in asked if w not in baselines.ROUND_WORKLOADS]
    parts: list[tuple[baselines.Baseline | None, dict]] = []
    for rep in range(args.reps if rounds else 0):
        for commit in baselines.order(commits, rep):
            say(f"{db}: round {rep + 1} of {args.reps}, {'main' if commit is None else commit.label}")
            target = url if commit is None else commit.url(url)
            out = tmp / f"{db}-{rep}-{'main' if commit is None else commit.short}.json"
            data = run_suite(python, db, target, args, ",".join(rounds), 1, out, commit)
            if data is not None:
                parts.append((commit, data))
    if rest:
        data = run_suite(python, db, url, args, ",".join(rest), args.reps, tmp / f"{db}-rest.json")
        if data is not None:
            parts.append((None, data))
    return baselines.combine(parts) if parts else None


def load_check(when: str) -> list[float]:
    """The load averages now, with a warning above 1.5: figures taken beside other work are not results."""
    load = [round(x, 2) for x in os.getloadavg()]
    if load[0] > 1.5:
        say(f"WARNING: load average {load[0]} at the {when} of the run (above 1.5): not a result")
    return load


def own_database(python: Path, args: argparse.Namespace, db: str, tmp: Path, name: str) -> str | None:
    """The URL of a workload's own database (``dschbench_<name>`` on PostgreSQL, unless
    ``--pg-url`` names one, so that it never drops a suite run's at the default name; a file in
    ``tmp`` on SQLite), or None, said, when PostgreSQL does not answer."""
    if db != "postgres":
        return f"sqlite:///{tmp / f'dschbench-{name}.sqlite3'}"
    why = pg_answers(python)
    if why:
        say(f"skipping postgres: the server does not answer: {why}")
        return None
    return args.pg_url if args.pg_url != PG_URL else f"{PG_URL}_{name}"


def run_batch(python: Path, args: argparse.Namespace, dbs: list[str], argv: list[str]) -> int:
    """bench/batch.py once per database, then the same table and results file as the suite's
    (default ``bench/results-<date>-batches.json``)."""
    started = time.monotonic()
    results: dict[str, dict] = {}
    tmp = Path(tempfile.mkdtemp(prefix="dschbench-batch-"))
    for db in dbs:
        url = own_database(python, args, db, tmp, "batch")
        if url is None:
            continue
        out = tmp / f"{db}.json"
        cmd = [str(python), "-m", "bench.batch", "--url", url, "--out", str(out), "--reps", str(args.reps)]
        cmd += ["--workers", str(args.workers), "--autovacuum", args.autovacuum]
        cmd += (["--n", str(args.n)] if args.n else []) + (["--quick"] if args.quick else [])
        cmd += ["--profile", str(args.batch_profile)] if args.batch_profile else []
        say(f"{db}: {' '.join(cmd[1:])}")
        code = subprocess.call(cmd, cwd=ROOT)
        if out.exists():
            results[db] = json.loads(out.read_text())
        if code:
            say(f"{db}: bench.batch exited {code}")
    shutil.rmtree(tmp, ignore_errors=True)
    out_path = args.out or str(BENCH / f"results-{datetime.now(UTC):%Y-%m-%d}-batches.json")
    options = {"reps": args.reps, "n": args.n, "workers": args.workers, "autovacuum": args.autovacuum}
    report(results, argv, out_path, options, started)
    for db, data in results.items():
        for mode, shares in ((data.get("batch_profile") or {}).get("modes") or {}).items():
            print(f"\n--- {db}: where the worker loop's wall time goes, {mode} (py-spy --idle)")
            for part, pct in shares["parts"].items():
                print(f"  {pct:6.1f} %  {part}")
            for name, pct in shares["inclusive"].items():
                print(f"  {pct:6.1f} %  inclusive: {name}")
        if data.get("autovacuum"):
            print(f"{db}: autovacuum {data['autovacuum']}")
    return 0 if results else 1


def run_kill(python: Path, args: argparse.Namespace, dbs: list[str]) -> int:
    """bench/kill.py once per database (a fresh one per run), with its own table and results file."""
    code = 0
    tmp = Path(tempfile.mkdtemp(prefix="dschbench-kill-"))
    for db in dbs:
        url = own_database(python, args, db, tmp, "kill")
        if url is None:
            continue
        cmd = [str(python), "-m", "bench.kill", "--url", url, "--reps", str(args.reps)]
        cmd += ["--n", str(args.n or (3000 if args.quick else 40_000))]
        out = args.out and (args.out if len(dbs) == 1 else args.out.replace(".json", f"-{db}.json"))
        cmd += ["--out", out or str(BENCH / f"results-{datetime.now(UTC):%Y-%m-%d}-kill-{db}.json")]
        say(f"{db}: {' '.join(cmd[1:])}")
        code = subprocess.call(cmd, cwd=ROOT) or code
    shutil.rmtree(tmp, ignore_errors=True)
    return code


def merge(paths: list[str], out: str | None) -> int:
    """Combine the results files of several runs (one per database) into one report."""
    results: dict[str, dict] = {}
    metas = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if "rows" in data:  # the output of one bench.suite run (one database)
            metas.append({"suite": path})
            per_db = {data["db"]: data}
        else:
            metas.append(data["meta"])
            per_db = {
                db: {**extra, "rows": [r for r in data["table"] if r["db"] == db]}
                for db, extra in data["per_database"].items()
            }
        for db, extra in per_db.items():
            into = results.setdefault(db, {"rows": []})
            for key, value in extra.items():
                if key == "rows":
                    continue
                if isinstance(value, dict) and isinstance(into.get(key), dict):
                    into[key] = {**into[key], **value}
                elif key not in into or value:
                    into[key] = value
            for row in extra["rows"]:
                row = {k: v for k, v in row.items() if k in RAW_KEYS}
                same = next(
                    (
                        r
                        for r in into["rows"]
                        if (r["db"], r["workload"], r["system"])
                        == (row["db"], row["workload"], row["system"])
                    ),
                    None,
                )
                if same is None:
                    into["rows"].append(row)
                else:
                    same["samples"] = same["samples"] + row["samples"]
                    same["details"] = same.get("details", []) + row.get("details", [])
    report(results, ["--merge", *paths], out, {"merged": metas}, time.monotonic())
    return 0


RAW_KEYS = ("db", "workload", "system", "unit", "better", "config", "samples", "details")


def report(results: dict[str, dict], argv: list[str], out: str | None, options: dict, started: float) -> None:
    rows = summarize([row for data in results.values() for row in data["rows"]])
    print_extras(results)
    print("\n" + "\n".join(drain_vs_pgbench(rows)))
    print_table(rows)
    compared = baselines.comparison(rows)
    baselines.print_comparison(compared, _fmt)
    if "merged" not in options:
        options = {**options, "load_end": load_check("end")}
    stamp = datetime.now(UTC)
    path = Path(out) if out else BENCH / f"results-{stamp:%Y-%m-%d}.json"
    meta = {
        "date": stamp.isoformat(timespec="seconds"),
        "command": " ".join(["python3", "bench/run.py", *argv]),
        **options,
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    path.write_text(
        json.dumps(
            {
                "meta": meta,
                "table": rows,
                "drain_vs_pgbench": drain_vs_pgbench(rows),
                "main_vs_baselines": compared,
                "per_database": {
                    db: {k: v for k, v in data.items() if k != "rows"} for db, data in results.items()
                },
            },
            indent=1,
            default=str,
        )
        + "\n"
    )
    for db, data in results.items():
        v = data.get("versions", {})
        print(
            f"\n{db}: {v.get('server')}; Python {v.get('python')}, Django {v.get('django')}, "
            f"ours {v.get('django-durable-scheduler')}, django-tasks {v.get('django-tasks')} + "
            f"django-tasks-db {v.get('django-tasks-db')}, django-q2 {v.get('django-q2')}, "
            f"procrastinate {v.get('procrastinate')}; {v.get('cpus')} CPUs;"
            f" settings {v.get('server_settings')}"
        )
        package = v.get("package") or {}
        print(f"{db}: main (ours) is {package.get('commit', '?')}")
        for label, bv in (data.get("baselines") or {}).items():
            print(f"{db}: {label} is {(bv.get('package') or {}).get('commit', '?')}")
        autovacuum = (v.get("server_settings") or {}).get("autovacuum")
        if autovacuum == "on":
            print(f"{db}: WARNING: autovacuum was on: a vacuum may have landed in a short W1-W3 measurement")
        elif autovacuum:
            print(f"{db}: autovacuum {autovacuum}")
    for when in ("start", "end"):
        if load := options.get(f"load_{when}"):
            flag = " (above 1.5: these figures are not results)" if load[0] > 1.5 else ""
            print(f"load average at the {when}: {' '.join(map(str, load))}{flag}")
    say(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("\n[run.py] interrupted", file=sys.stderr)
        sys.exit(130)
