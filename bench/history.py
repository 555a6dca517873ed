"""The history run (PostgreSQL, ours only): the same figures on a database holding ``--rows``
settled occurrences with their events and reservations and on a nearly empty one (10,000), in
one run: enqueue one by one, drain, pickup p50, the admin pages, the dashboard,
``scheduler_status`` and the retention of one day (``scheduler_prune`` of the oldest day).

    python -m bench.history [--rows 2000000] [--small 10000] [--n 2000] [--w3 100] [--reuse]

(``python3 bench/run.py --workloads history`` runs it inside .venv-bench.) The databases are
``dsch_history`` and ``dsch_history_small``; ``--reuse`` keeps a database that already holds
its rows (they take minutes to load). Autovacuum is turned on for the run (``ALTER SYSTEM``)
and the previous setting restored at the end, also on error. Each database is measured in a
process of its own (``--measure``); this process prints the table and writes the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, Results, say
from bench.systems import Ours

PG_URL = "postgres://postgres@127.0.0.1:5432/dsch_history"
PRUNE_APP = "dsch-history-prune"
# (what, unit, target): the ratio targets are of the full database against the small one.
TARGETS = {
    "enqueue one-by-one": ("ops/s", "ratio >= 0.83 (within 1.2x)"),
    "drain x1": ("ops/s", "ratio >= 0.83 (within 1.2x)"),
    "pickup p50": ("ms", "ratio <= 1.2"),
    "scheduler_status (text)": ("ms", "< 1000 ms"),
    "retention of one day: longest transaction": ("ms", "< 1000 ms"),
}
PAGE_TARGET = "< 300 ms"


# --------------------------------------------------------------------------- one database


class HistoryOurs(Ours):
    """The suite's ``Ours`` on a database that holds history: it counts, checks and clears
    only the bench's own jobs, so that the history stays (and usage matches reservations)."""

    JOBS = (Ours.NOOP_JOB, Ours.STAMP_JOB, Ours.SLEEP_JOB)

    def done(self) -> int:
        from django_durable_scheduler.models import Occurrence

        return Occurrence.objects.filter(job_id=self.NOOP_JOB, status="succeeded").count()

    def failed(self) -> int:
        from django_durable_scheduler.models import Occurrence

        rows = Occurrence.objects.filter(job_id=self.NOOP_JOB)
        return rows.exclude(status__in=["succeeded", "queued", "running"]).count()

    def exactly_once(self, n: int) -> bool:
        from django_durable_scheduler.models import Event, Occurrence

        events = Event.objects.filter(job_id=self.NOOP_JOB)
        claims = events.filter(event_type="occurrence_claimed")
        succeeded = Occurrence.objects.filter(job_id=self.NOOP_JOB, status="succeeded", attempt=1, fence=1)
        return (
            succeeded.count() == n
            and claims.count() == n
            and claims.values("occurrence_id").distinct().count() == n
            and not events.filter(event_type="occurrence_reclaimed").exists()
        )

    def clear(self) -> None:
        _clear_bench_jobs(self.JOBS)


def _clear_bench_jobs(jobs: tuple[str, ...]) -> None:
    """Delete the bench jobs' occurrences (and their events and reservations), then set the
    bench principal's usage back to what its remaining reservations say."""
    from django.db import connection

    from bench.history_load import rebuild_usage

    ids = ", ".join(f"'{j}'" for j in jobs)  # our own constants
    with connection.cursor() as cursor:
        for table in ("events", "authority_reservations", "occurrences"):
            cursor.execute(f"DELETE FROM durable_scheduler_{table} WHERE job_id IN ({ids})")
        cursor.execute("DELETE FROM durable_scheduler_workers")
    rebuild_usage(["bench"])


def _ms(fn: Any, reps: int) -> tuple[float, list[float]]:
    fn()  # warm-up: caches, the dashboard's hourly counts
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), times


def _pages(sample: dict[str, str]) -> dict[str, str]:
    occ = "/admin/durable_scheduler/occurrence/"
    ev = "/admin/durable_scheduler/event/"
    return {
        "occurrence list, first page": occ,
        "occurrence list, status filter": f"{occ}?status__exact=dead_letter",
        "occurrence list, job filter": f"{occ}?job__job_id__exact={sample['job']}",
        "occurrence list, search by id": f"{occ}?q={sample['occurrence']}",
        "event list, first page": ev,
        "event list, type filter": f"{ev}?event_type=occurrence_claimed",
        "occurrence page": f"{occ}{sample['occurrence']}/change/",
        "job list": "/admin/durable_scheduler/job/",
        "job page": f"/admin/durable_scheduler/job/{sample['job']}/change/",
        "dashboard": "/admin/durable_scheduler/schedulerdashboard/",
    }


def measure_pages(res: Results, reps: int) -> None:
    """Each admin page through Django's test client as a superuser: the median time, the
    statement count and the slowest statement."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from django_durable_scheduler.models import Occurrence

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    if user is None:
        user = user_model.objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    oldest = Occurrence.objects.filter(job_id="hist-007").order_by("job_id", "trigger_key").first()
    assert oldest is not None, "no history rows"
    for label, url in _pages({"job": "hist-007", "occurrence": oldest.pk}).items():

        def get(url: str = url) -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        ms, times = _ms(get, reps)
        with CaptureQueriesContext(connection) as ctx:
            get()
        slowest = max(ctx.captured_queries, key=lambda q: float(q["time"]))
        detail = {
            "url": url,
            "times": times,
            "queries": len(ctx.captured_queries),
            "slowest_ms": float(slowest["time"]) * 1000,
            "slowest_sql": slowest["sql"][:400],
        }
        res.add(f"admin: {label}", "ours", ms, unit="ms", better="lower", detail=detail)
        say(
            f"{label}: {ms:.1f} ms, {len(ctx.captured_queries)} queries,"
            f" slowest {detail['slowest_ms']:.1f} ms"
        )


def measure_status(res: Results, reps: int) -> None:
    from io import StringIO

    from django.core.management import call_command

    ms, times = _ms(lambda: call_command("scheduler_status", stdout=StringIO()), reps)
    res.add("scheduler_status (text)", "ours", ms, unit="ms", better="lower", detail={"times": times})
    say(f"scheduler_status: {ms:.1f} ms")


class _LongestTransaction:
    """The longest open transaction of the backends named ``application_name``, sampled every
    10 ms from ``pg_stat_activity`` on a connection of its own: how long locks were held."""

    def __init__(self, url: str, application_name: str) -> None:
        self.url, self.name, self.longest = url, application_name, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _LongestTransaction:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(_libpq(self.url), autocommit=True) as conn:
            while not self._stop.wait(0.01):
                row = conn.execute(
                    "SELECT max(extract(epoch FROM clock_timestamp() - xact_start)) FROM pg_stat_activity"
                    " WHERE application_name = %s AND xact_start IS NOT NULL AND state <> 'idle'",
                    [self.name],
                ).fetchone()
                if row and row[0] is not None:
                    self.longest = max(self.longest, float(row[0]))


def measure_retention(res: Results, url: str) -> None:
    """``manage.py scheduler_prune`` of the oldest day of history (a process of its own):
    its wall time and its longest transaction (the lock time)."""
    from django.db.models import Min

    from django_durable_scheduler import conf
    from django_durable_scheduler.models import Occurrence

    oldest = Occurrence.objects.filter(settled_at__isnull=False).aggregate(at=Min("settled_at"))["at"]
    older = int((conf.now() - oldest).total_seconds()) - 86400
    env = dict(os.environ, PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="bench.settings", PGAPPNAME=PRUNE_APP)
    cmd = [sys.executable, "-m", "django", "scheduler_prune", "--older-than", str(older), "--json"]
    with _LongestTransaction(url, PRUNE_APP) as sampler:
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        res.notes.append(f"scheduler_prune failed: {proc.stderr[-500:]}")
        return
    detail = {"output": proc.stdout.strip()[-500:], "seconds": seconds}
    res.add("retention of one day: wall", "ours", seconds * 1000, unit="ms", better="lower", detail=detail)
    res.add(
        "retention of one day: longest transaction",
        "ours",
        sampler.longest * 1000,
        unit="ms",
        better="lower",
        detail=detail,
    )
    say(
        f"retention of one day: {seconds:.1f} s, longest transaction {sampler.longest * 1000:.0f} ms:"
        f" {proc.stdout.strip()}"
    )


def measure_worker(res: Results, system: Any, n: int, w3: int, reps: int) -> None:
    """Enqueue one by one, drain and pickup with the suite's own measurements."""
    from bench.suite import _drain_once, run_w3

    sizes = {"w1": n, "w2": n, "w3": w3, "w3_rate": 20.0}
    scratch = Results(res.db)
    for rep in range(reps):
        _drain_once(scratch, system, system.drain_workers(1), "W2 drain x1", 1, rep, sizes)
    run_w3(scratch, [system], sizes, reps)
    names = {
        "W1 enqueue one-by-one": "enqueue one-by-one",
        "W2 drain x1": "drain x1",
        "W3 latency p50, default poll": "pickup p50",
    }
    for row in scratch.rows:
        if row["workload"] in names:
            for value in row["samples"]:
                res.add(names[row["workload"]], "ours", value, unit=row["unit"], better=row["better"])
    res.extra["worker_rows"] = scratch.rows


def _history_rows() -> dict[str, int]:
    from django.db import connection

    counts = {}
    with connection.cursor() as cursor:
        for table in ("occurrences", "events", "authority_reservations", "authority_usage"):
            cursor.execute(f"SELECT count(*) FROM durable_scheduler_{table}")
            counts[table] = int(cursor.fetchone()[0])
    return counts


def _prepare(url: str, rows: int, reuse: bool) -> tuple[Results, Any]:
    """The database, created and filled unless ``reuse`` finds it filled; the results and the system."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.history_settings"
    name = urlsplit(url).path.lstrip("/")
    filled = reuse and _exists(url, name)
    if not filled:
        _recreate(url, name)
    import django

    django.setup()
    from django.core.management import call_command

    from bench.history_load import load
    from bench.suite import versions

    call_command("migrate", verbosity=0)
    res = Results("postgres")
    res.extra["versions"] = versions()
    system = HistoryOurs()
    system.setup()
    if filled and _history_rows()["occurrences"] >= rows * 0.9:  # retention took a day or two
        say(f"{name}: reusing {_history_rows()}")
        system.clear()
    else:
        seconds = load(rows)
        res.extra["load_seconds"] = seconds
        say(f"{name}: loaded in {seconds:.0f} s: {_history_rows()}")
    res.extra["history_rows"] = _history_rows()
    return res, system


def _libpq(url: str, dbname: str | None = None) -> str:
    parts = urlsplit(url)
    if dbname is not None:
        parts = parts._replace(path=f"/{dbname}")
    return urlunsplit(parts._replace(scheme="postgresql"))


def _exists(url: str, name: str) -> bool:
    import psycopg

    with psycopg.connect(_libpq(url, "postgres"), autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def _recreate(url: str, name: str) -> None:
    import psycopg

    if not name.startswith("dsch_history"):
        raise SystemExit(f"refusing to drop database {name!r}: only dsch_history* names")
    with psycopg.connect(_libpq(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def measure(args: argparse.Namespace) -> int:
    res, system = _prepare(args.url, args.rows, args.reuse)
    try:
        measure_worker(res, system, args.n, args.w3, args.reps)
        measure_pages(res, args.page_reps)
        measure_status(res, args.page_reps)
        measure_retention(res, args.url)
    finally:
        system.clear()
        Path(args.out).write_text(
            json.dumps({"rows": res.rows, "notes": res.notes, **res.extra}, default=str)
        )
    return 0


# --------------------------------------------------------------------------- the run


@contextlib.contextmanager
def autovacuum_on(url: str) -> Iterator[dict[str, str]]:
    """Autovacuum on for the run (``ALTER SYSTEM``, reloaded), then the previous setting back:
    the value ``postgresql.auto.conf`` held, or none (the configuration files' value)."""
    import psycopg

    with psycopg.connect(_libpq(url, "postgres"), autocommit=True) as conn:
        before = conn.execute("SHOW autovacuum").fetchone()[0]
        row = conn.execute(
            "SELECT setting FROM pg_file_settings WHERE name = 'autovacuum'"
            " AND sourcefile LIKE '%%postgresql.auto.conf' ORDER BY seqno DESC LIMIT 1"
        ).fetchone()
        conn.execute("ALTER SYSTEM SET autovacuum = on")
        conn.execute("SELECT pg_reload_conf()")
    state = {"before": before, "during": _show_autovacuum(url)}
    say(f"autovacuum: {before} before the run, {state['during']} for the run")
    try:
        yield state
    finally:
        # On a connection of its own, retried: the server may have restarted during the run.
        for attempt in range(30):
            try:
                with psycopg.connect(_libpq(url, "postgres"), autocommit=True) as conn:
                    if row is None:
                        conn.execute("ALTER SYSTEM RESET autovacuum")
                    else:
                        conn.execute(f"ALTER SYSTEM SET autovacuum = '{row[0]}'")  # what the file held
                    conn.execute("SELECT pg_reload_conf()")
                break
            except psycopg.OperationalError:
                if attempt == 29:
                    raise
                time.sleep(2)
        state["after"] = _show_autovacuum(url)
        say(f"autovacuum: {state['after']} again after the run")


def _show_autovacuum(url: str) -> str:
    import psycopg

    time.sleep(0.5)  # the reload reaches the server's processes
    with psycopg.connect(_libpq(url, "postgres"), autocommit=True) as conn:
        return str(conn.execute("SHOW autovacuum").fetchone()[0])


def _median(rows: list[dict[str, Any]], workload: str) -> float | None:
    for row in rows:
        if row["workload"] == workload:
            values = [v for v in row["samples"] if v is not None]
            return statistics.median(values) if values else None
    return None


def table(small: dict[str, Any], full: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per figure: small, full, full/small and the target."""
    lines = []
    for row in full["rows"]:
        name = row["workload"]
        a, b = _median(small["rows"], name), _median(full["rows"], name)
        target = TARGETS.get(name, (row["unit"], PAGE_TARGET if name.startswith("admin:") else ""))[1]
        lines.append(
            {
                "figure": name,
                "unit": row["unit"],
                "small": a,
                "full": b,
                "ratio": b / a if a and b else None,
                "target": target,
            }
        )
    return lines


def print_table(lines: list[dict[str, Any]], sizes: tuple[int, int]) -> None:
    def fmt(v: float | None) -> str:
        return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:,.1f}")

    head = ("figure", "unit", f"{sizes[0]:,} rows", f"{sizes[1]:,} rows", "full/small", "target")
    cells = [
        (
            x["figure"],
            x["unit"],
            fmt(x["small"]),
            fmt(x["full"]),
            f"{x['ratio']:.2f}x" if x["ratio"] else "-",
            x["target"],
        )
        for x in lines
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print()
    for row in (head, tuple("-" * w for w in widths), *cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def run(args: argparse.Namespace) -> int:
    base = urlsplit(args.pg_url).path.lstrip("/")
    parts: dict[str, dict[str, Any]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="dsch-history-"))
    started = time.monotonic()
    with autovacuum_on(args.pg_url) as autovacuum:
        for label, name, rows in (("small", f"{base}_small", args.small), ("full", base, args.rows)):
            out = tmp / f"{label}.json"
            cmd = [sys.executable, "-m", "bench.history", "--measure", "--url", _libpq(args.pg_url, name)]
            cmd += ["--rows", str(rows), "--out", str(out), "--n", str(args.n), "--w3", str(args.w3)]
            cmd += ["--reps", str(args.reps), "--page-reps", str(args.page_reps)] + (
                ["--reuse"] if args.reuse else []
            )
            say(f"{label}: {' '.join(cmd[1:])}")
            code = subprocess.call(cmd, cwd=ROOT)
            if not out.exists():
                raise SystemExit(f"{label}: the measurement wrote no results (exit {code})")
            parts[label] = json.loads(out.read_text())
    lines = table(parts["small"], parts["full"])
    print_table(lines, (args.small, args.rows))
    for label, part in parts.items():
        for note in part.get("notes", []):
            print(f"note ({label}): {note}")
    print(f"\nautovacuum: {autovacuum}")
    path = (
        Path(args.out) if args.out else ROOT / "bench" / f"results-{datetime.now(UTC):%Y-%m-%d}-history.json"
    )
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.history", *sys.argv[1:]]),
        "minutes": round((time.monotonic() - started) / 60, 1),
        "autovacuum": autovacuum,
    }
    path.write_text(
        json.dumps({"meta": meta, "table": lines, "per_database": parts}, indent=1, default=str) + "\n"
    )
    say(f"wrote {path}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=PG_URL, help="the full database (dsch_history* names only)")
    parser.add_argument("--rows", type=int, default=2_000_000, help="settled occurrences (default 2,000,000)")
    parser.add_argument(
        "--small", type=int, default=10_000, help="the nearly empty database's (default 10,000)"
    )
    parser.add_argument("--n", type=int, default=2000, help="occurrences to enqueue and drain (default 2000)")
    parser.add_argument("--w3", type=int, default=100, help="pickup samples (default 100)")
    parser.add_argument("--reps", type=int, default=1, help="drains and pickup runs per database (default 1)")
    parser.add_argument("--page-reps", type=int, default=5, help="timings per page (default 5)")
    parser.add_argument("--reuse", action="store_true", help="keep a database that holds its rows already")
    parser.add_argument(
        "--out", default=None, help="results file (default bench/results-<date>-history.json)"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.small < 1 or args.n < 1 or args.w3 < 1 or args.reps < 1 or args.page_reps < 1:
        parser.error("--rows, --small, --n, --w3, --reps and --page-reps must be at least 1")
    if args.measure:
        return measure(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
