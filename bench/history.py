"""The history run (PostgreSQL, ours only): the same figures on a database holding ``--rows``
settled occurrences with their events and reservations and on a nearly empty one (10,000), in
one run: enqueue one by one, drain, pickup p50, the admin pages, the dashboard,
``scheduler_status`` (both also as a first read, their hourly counts made anew) and the
retention of one day (the retention engine on the oldest day, which drops its events'
partition whole, then its batched deletes alone on the next day).

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
    "scheduler_status (text)": ("ms", "ratio <= 1.2, < 1000 ms"),
    "admin: dashboard": ("ms", "ratio <= 1.2, < 300 ms"),
    "dashboard, hours counted anew": ("ms", "ratio <= 1.2"),
    "scheduler_status, hours counted anew": ("ms", "ratio <= 1.2, < 1000 ms"),
    "retention of one day (partition drop): partition lock": ("ms", "< 1000 ms"),
    "retention of one day (partition drop): longest batch transaction": ("ms", "< 1000 ms"),
    "retention of one day (batched deletes only): longest batch transaction": ("ms", "< 1000 ms"),
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


def _ms(fn: Any, reps: int, before: Any = None) -> tuple[float, list[float]]:
    """The median of ``reps`` timed calls after one warm-up; ``before`` runs untimed before each."""
    fn()  # warm-up: caches, the dashboard's hourly counts
    times = []
    for _ in range(reps):
        if before is not None:
            before()
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


def measure_first_reads(res: Results, reps: int) -> None:
    """The dashboard and ``scheduler_status`` as their first reader after a deploy sees them:
    the hourly counts (``OutcomeCount``) deleted before each timed call, so the call counts a
    week of hours from the occurrences and their claim events."""
    from io import StringIO

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from django_durable_scheduler.models import OutcomeCount

    def forget() -> None:
        OutcomeCount.objects.all().delete()

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))

    def dashboard() -> None:
        response = client.get("/admin/durable_scheduler/schedulerdashboard/")
        assert response.status_code == 200, response.status_code

    for label, fn in (
        ("dashboard, hours counted anew", dashboard),
        ("scheduler_status, hours counted anew", lambda: call_command("scheduler_status", stdout=StringIO())),
    ):
        ms, times = _ms(fn, reps, before=forget)
        res.add(label, "ours", ms, unit="ms", better="lower", detail={"times": times})
        say(f"{label}: {ms:.1f} ms")


class _Transactions:
    """The write transactions (those with a transaction id) of the backends named
    ``application_name``, sampled every 10 ms from ``pg_stat_activity`` on a connection of its
    own: how long each held its locks, and the statements seen in it, so that a partition's
    detach (DDL, the rescued rows' ``INSERT``) is told from a batch of row deletes."""

    def __init__(self, url: str, application_name: str) -> None:
        self.url, self.name = url, application_name
        self.seen: dict[tuple[int, str], dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Transactions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(_libpq(self.url), autocommit=True) as conn:
            while not self._stop.wait(0.01):
                rows = conn.execute(
                    "SELECT pid, xact_start::text, extract(epoch FROM clock_timestamp() - xact_start),"
                    " split_part(ltrim(query), ' ', 1) || CASE WHEN query ILIKE '%%PARTITION%%'"
                    " OR query ILIKE 'DROP TABLE%%' THEN ' (partition)' ELSE '' END"
                    " FROM pg_stat_activity WHERE application_name = %s AND backend_xid IS NOT NULL",
                    [self.name],
                ).fetchall()
                for pid, started, seconds, verb in rows:
                    tx = self.seen.setdefault((pid, started), {"seconds": 0.0, "statements": set()})
                    tx["seconds"] = max(tx["seconds"], float(seconds))
                    tx["statements"].add(verb.upper())

    def longest(self, partition: bool) -> float:
        """The longest transaction that detached a partition (``partition``) or deleted rows."""
        found = [
            tx["seconds"]
            for tx in self.seen.values()
            if any(v.endswith("(partition)") or v.startswith("INSERT") for v in tx["statements"]) == partition
        ]
        return max(found, default=0.0)


def prune_now(older_than: float, batched_only: bool) -> dict[str, Any]:
    """In this process: the retention engine's prune of what settled more than ``older_than``
    seconds ago, as ``scheduler_prune`` runs it (days of events dropped whole where they are
    partitioned, then the rest in batches), or with ``batched_only`` its batched deletes alone
    (every event of the day deleted row by row, as where history is not partitioned); what it
    did, as the workers' retention records it."""
    from datetime import timedelta

    from django_durable_scheduler import conf
    from django_durable_scheduler.housekeeping.retention import plan as retention
    from django_durable_scheduler.models import TERMINAL_STATUSES

    started = time.perf_counter()
    if not batched_only:
        result = retention.prune(timedelta(seconds=older_than))
    else:
        now = conf.now()
        cutoff = now - timedelta(seconds=older_than)
        plan = retention.Plan(
            now=now,
            cutoffs={str(status): cutoff for status in TERMINAL_STATUSES},
            job_events=None,
            caller_keys=cutoff,
            protect_keys=False,
        )
        result = retention.PruneResult(cutoff=cutoff, dry_run=False)
        for status in plan.cutoffs:  # retention.apply without its drop_partitions step
            retention._prune_status(plan, status, cutoff, "default", result)
    return result.record(time.perf_counter() - started)


def _retention_once(res: Results, url: str, label: str, batched_only: bool) -> None:
    from datetime import timedelta

    from django.db.models import Min

    from django_durable_scheduler import conf
    from django_durable_scheduler.models import Occurrence

    oldest = Occurrence.objects.filter(settled_at__isnull=False).aggregate(at=Min("settled_at"))["at"]
    # To the end of the oldest settled day: that day's partition is the first to go whole.
    cutoff = oldest.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    older = (conf.now() - cutoff).total_seconds()
    env = dict(os.environ, PYTHONPATH=str(ROOT), PGAPPNAME=PRUNE_APP)
    cmd = [sys.executable, "-m", "bench.history", "--url", url, "--prune", str(older)]
    cmd += ["--batched-only"] if batched_only else []
    with _Transactions(url, PRUNE_APP) as sampler:
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        res.notes.append(f"{label} failed: {proc.stderr[-800:]}")
        say(f"{label} failed: {proc.stderr[-800:]}")
        return
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    batches = sampler.longest(partition=False) * 1000
    detail = {
        "record": record,
        "seconds": seconds,
        "day": [str(cutoff - timedelta(days=1)), str(cutoff)],
        "transactions": len(sampler.seen),
        "longest_partition_transaction_ms": sampler.longest(partition=True) * 1000,
    }
    figures = {"wall": (seconds * 1000, "ms"), "longest batch transaction": (batches, "ms")}
    if not batched_only:
        figures["partition lock"] = (record["partition_lock_seconds"] * 1000, "ms")
        figures["partitions dropped"] = (len(record["partitions_dropped"]), "count")
    for name, (value, unit) in figures.items():
        res.add(f"{label}: {name}", "ours", value, unit=unit, better="lower", detail=detail)
    say(
        f"{label}: {seconds:.1f} s, longest batch transaction {batches:.0f} ms,"
        f" partitions {record['partitions_dropped']} locked {record['partition_lock_seconds'] * 1000:.0f} ms:"
        f" {record['occurrences']} occurrences, {record['events']} events, {record['reservations']}"
        f" reservations, {record['kept_open_window']} kept (open window)"
    )


def measure_retention(res: Results, url: str) -> None:
    """The retention of the oldest day of history in a process of its own, twice: the engine as
    ``scheduler_prune`` runs it (the day's events dropped whole), then its batched deletes alone
    on the next day (the day's events deleted row by row)."""
    _retention_once(res, url, "retention of one day (partition drop)", batched_only=False)
    _retention_once(res, url, "retention of one day (batched deletes only)", batched_only=True)


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

    from bench.history_load import load, partition_days
    from bench.suite import versions

    call_command("migrate", verbosity=0)
    if not filled:
        partition_days()  # before anything writes an event
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
        measure_first_reads(res, args.page_reps)
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
    parser.add_argument("--prune", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batched-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.small < 1 or args.n < 1 or args.w3 < 1 or args.reps < 1 or args.page_reps < 1:
        parser.error("--rows, --small, --n, --w3, --reps and --page-reps must be at least 1")
    if args.prune is not None:
        os.environ.update(DATABASE_URL=args.url, DJANGO_SETTINGS_MODULE="bench.history_settings")
        import django

        django.setup()
        print(json.dumps(prune_now(args.prune, args.batched_only)))
        return 0
    if args.measure:
        return measure(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
