"""The workloads, run against one database inside .venv-bench (bench/run.py starts this).

    python -m bench.suite --url DATABASE_URL --out results.json [--quick] [--reps 3]
                          [--workloads w1,w2,w3,w4,pgbench,profile,scale]

For PostgreSQL the database named in the URL is dropped and created here (names dschbench* only);
for SQLite the file is created. Results go to --out as JSON; progress goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Run as a script (python bench/suite.py), the repository root is not on the path yet.
if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from bench.harness import (
    DRAIN_TIMEOUT,
    LOG_DIR,
    PACKAGE_DIR,
    ROOT,
    Procs,
    Results,
    child_env,
    median,
    run_pgbench,
    say,
    steady_rate,
    wait_done,
)

SIZES = {
    "full": {
        "w1": 5000,
        "w2": 5000,
        "w3": 200,
        "w3_rate": 20.0,
        "scale": 20_000,
        "w4_jobs": 100_000,
        "w4_terminal": 1_000_000,
        "w4_backlogs": (5000, 20_000),
        "pgbench_seconds": 10,
        "profile": 5000,
    },
    "quick": {
        "w1": 500,
        "w2": 500,
        "w3": 40,
        "w3_rate": 20.0,
        "scale": 2_000,
        "w4_jobs": 10_000,
        "w4_terminal": 50_000,
        "w4_backlogs": (2000,),
        "pgbench_seconds": 3,
        "profile": 1000,
    },
}


# --------------------------------------------------------------------------- database


def prepare_database(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = Path(parts.path)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    name = parts.path.lstrip("/")
    if not name.startswith("dschbench"):
        raise SystemExit(f"refusing to drop database {name!r}: only dschbench* names")
    import psycopg

    admin = dict(
        host=parts.hostname, port=parts.port or 5432, user=parts.username, dbname="postgres", autocommit=True
    )
    if parts.password:
        admin["password"] = parts.password
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{parts.path}{suffix}").unlink(missing_ok=True)
        return
    import psycopg

    admin = dict(
        host=parts.hostname, port=parts.port or 5432, user=parts.username, dbname="postgres", autocommit=True
    )
    if parts.password:
        admin["password"] = parts.password
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}" WITH (FORCE)')


# --------------------------------------------------------------------------- W1 + W2


def enqueue_one_by_one(system: Any, n: int) -> float:
    system.new_run()
    start = time.perf_counter()
    for i in range(n):
        system.enqueue_noop(i)
    return time.perf_counter() - start


def pg_counters() -> dict[str, int]:
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit, xact_rollback, sessions, tup_inserted, tup_updated, tup_deleted"
            " FROM pg_stat_database WHERE datname = current_database()"
        )
        row = cursor.fetchone()
    return dict(zip(("commits", "rollbacks", "sessions", "inserted", "updated", "deleted"), row, strict=True))


def run_w1_w2(res: Results, systems: list[Any], sizes: dict[str, Any], reps: int, levels: list[int]) -> None:
    n1 = sizes["w1"]
    # W1 bulk (ours only): enqueue_many of n1 in one call, one transaction.
    ours = systems[0]
    for rep in range(reps):
        ours.clear()
        ours.new_run()
        start = time.perf_counter()
        ours.enqueue_many(n1)
        seconds = time.perf_counter() - start
        res.add(
            "W1 enqueue bulk",
            "ours",
            n1 / seconds,
            unit="ops/s",
            better="higher",
            config=f"enqueue_many of {n1}, one transaction",
        )
        say(f"W1 bulk rep {rep + 1}: {n1 / seconds:,.0f}/s")
    ours.clear()
    # W2 drain, preceded by a one-by-one enqueue of the same n (that is the W1 one-by-one sample).
    # At each level every system runs at its own defaults ("W2 drain xN"); ours (both enqueue
    # APIs) then runs once more as one process with N handler threads, against the peers' same
    # runs, which already run N at a time ("W2 drain xN, matched concurrency").
    for level in levels:
        matched = f"W2 drain x{level}, matched concurrency"
        for rep in range(reps):
            for system in systems:  # interleaved, so drift on a shared machine hits all alike
                runs = [(f"W2 drain x{level}", system.drain_workers(level))]
                if getattr(system, "matched_run", False):
                    runs.append((matched, system.drain_workers(1, concurrency=level)))
                for workload, spec in runs:
                    rate = _drain_once(res, system, spec, workload, level, rep, sizes)
                    if not getattr(system, "matched_run", False) and rate is not None:
                        res.add(
                            matched, system.name, rate, unit="ops/s", better="higher", config=spec.description
                        )


def _add_steady_rate(res: Results, system: Any, workload: str, n: int, end: float, config: str) -> None:
    """The drain's rate from the first task seen done to the last (``steady_rate``)."""
    steady = steady_rate(system, n, end)
    if steady is not None:
        name = f"{workload}: steady rate (first to last done)"
        res.add(name, system.name, steady, unit="ops/s", better="higher", config=config)


def _drain_once(
    res: Results, system: Any, spec: Any, workload: str, level: int, rep: int, sizes: dict[str, Any]
) -> float | None:
    """One W2 sample: enqueue n one by one (the W1 sample when the sizes match), drain it with
    ``spec``'s workers, record the rate, the per-occurrence server counters and the checks."""
    n1, n2 = sizes["w1"], sizes["w2"]
    system.clear()
    seconds = enqueue_one_by_one(system, n2)
    if n2 == n1 and not workload.endswith("matched concurrency"):
        res.add(
            "W1 enqueue one-by-one",
            system.name,
            n1 / seconds,
            unit="ops/s",
            better="higher",
            config=f"{n1} calls, autocommit",
        )
    before = pg_counters()
    start = time.perf_counter()
    procs = Procs(spec, f"w2-{system.name}-{level}")
    try:
        end, done = wait_done(system, n2, procs, DRAIN_TIMEOUT)
        if end is not None and spec.exits_when_empty:
            procs.wait(60)
    finally:
        procs.stop()
    after = pg_counters()
    failed = system.failed()
    once = system.exactly_once(n2)
    detail: dict[str, Any] = {
        "done": done,
        "failed": failed,
        "load1": os.getloadavg()[0],
        "exactly_once": once,
        "peak_rss_mb": procs.peak_rss_kb / 1024,
    }
    if before:
        detail.update({k: (after[k] - before[k]) / n2 for k in before})
    rate = None if end is None else n2 / (end - start)
    res.add(
        workload, system.name, rate, unit="ops/s", better="higher", config=spec.description, detail=detail
    )
    if end is not None:
        _add_steady_rate(res, system, workload, n2, end, spec.description)
    if end is None:
        say(f"{workload} {system.name}: NOT finished ({done}/{n2})\n{procs.tail()}")
        system.clear()
        return None
    if before:
        # The drain's commits per occurrence (the enqueue's come before), the same for every system.
        res.add(
            f"{workload}: commits per occurrence",
            system.name,
            detail["commits"],
            unit="commits",
            better="lower",
            config=spec.description,
        )
    if procs.peak_rss_kb:
        res.add(
            f"{workload}: peak RSS per process",
            system.name,
            procs.peak_rss_kb / 1024,
            unit="MB",
            better="lower",
            config=spec.description,
        )
    if not once:
        res.notes.append(f"{workload} rep {rep + 1} {system.name}: NOT exactly once")
    skip = ("done", "failed", "load1", "exactly_once", "peak_rss_mb")
    per = ", ".join(f"{k} {v:.2f}" for k, v in detail.items() if k not in skip)
    say(
        f"{workload} rep {rep + 1} {system.name}: enqueue {n2 / seconds:,.0f}/s, "
        f"drain {end - start:.2f} s = {rate:,.0f}/s, load {detail['load1']:.1f}"
        + (f" (per occurrence: {per})" if per else "")
        + (f", {failed} failed" if failed else "")
        + f"; peak RSS {procs.peak_rss_kb / 1024:.0f} MB; exactly once: {'yes' if once else 'NO'}"
    )
    system.clear()
    return rate


def worker_startup(res: Results, systems: list[Any], reps: int) -> None:
    """Time for a burst worker to start and exit on an empty queue (part of every W2 wall time);
    once per worker command (ours runs the same one for both enqueue APIs)."""
    timed: set[tuple[str, ...]] = set()
    for system in systems:
        spec = system.drain_workers(1)
        argv = tuple(arg for cmd, _ in spec.procs for arg in cmd)
        if not spec.exits_when_empty or argv in timed:
            continue
        timed.add(argv)
        system.clear()
        for _ in range(reps):
            start = time.perf_counter()
            procs = Procs(spec, f"startup-{system.name}")
            ok = procs.wait(120)
            procs.stop()
            res.add(
                "startup+exit, empty queue",
                system.name,
                (time.perf_counter() - start) if ok else None,
                unit="s",
                better="lower",
                config=spec.description,
            )


# --------------------------------------------------------------------------- W3


def run_w3(res: Results, systems: list[Any], sizes: dict[str, Any], reps: int) -> None:
    n, rate = sizes["w3"], sizes["w3_rate"]
    for poll in (None, 0.1):
        label = "default poll" if poll is None else f"poll {poll:g} s"
        for rep in range(reps):
            for system in systems:
                system.clear()
                system.new_run()
                stamp = Path(tempfile.mkstemp(prefix="dschbench-stamp-")[1])
                spec = system.idle_worker(poll)
                procs = Procs(spec, f"w3-{system.name}", {"BENCH_STAMP_FILE": str(stamp)})
                try:
                    result = _latency_run(system, stamp, n, rate)
                finally:
                    procs.stop()
                    system.clear()
                if result is None:
                    say(f"W3 {system.name} {label}: worker did not start\n{procs.tail()}")
                    continue
                latencies, missing = result
                stamp.unlink(missing_ok=True)
                if missing:
                    say(f"W3 {system.name} {label}: {missing} of {n} never started")
                ms = sorted(x * 1000 for x in latencies)
                p50, p90, p95 = (_percentile(ms, q) for q in (0.5, 0.9, 0.95))
                worst = ms[-1] if ms else None
                for stat, value in (("p50", p50), ("p90", p90), ("p95", p95), ("max", worst)):
                    res.add(
                        f"W3 latency {stat}, {label}",
                        system.name,
                        None if missing else value,
                        unit="ms",
                        better="lower",
                        config=spec.description,
                    )
                say(
                    f"W3 {label} rep {rep + 1} {system.name}: p50 {p50 or 0:.1f} ms, "
                    f"p90 {p90 or 0:.1f} ms, p95 {p95 or 0:.1f} ms, max {worst or 0:.1f} ms"
                )


def _percentile(ms: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``ms`` (nearest rank below), None when empty."""
    return ms[min(len(ms) - 1, int(len(ms) * q))] if ms else None


def _read_stamps(path: Path) -> dict[str, float]:
    stamps: dict[str, float] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            stamps.setdefault(parts[0], float(parts[1]))
    return stamps


def _latency_run(system: Any, stamp: Path, n: int, rate: float) -> tuple[list[float], int] | None:
    # Warm up: the worker is up when it has run one; then let it go idle.
    system.enqueue_stamp(-1)
    deadline = time.time() + 60
    while "-1" not in _read_stamps(stamp):
        if time.time() > deadline:
            return None
        time.sleep(0.05)
    time.sleep(1.5)
    sent: dict[str, float] = {}
    start = time.time()
    for i in range(n):
        target = start + i / rate
        pause = target - time.time()
        if pause > 0:
            time.sleep(pause)
        sent[str(i)] = time.time()  # the moment the user code calls enqueue
        system.enqueue_stamp(i)
    deadline = time.time() + 30
    while True:
        stamps = _read_stamps(stamp)
        if all(k in stamps for k in sent) or time.time() > deadline:
            break
        time.sleep(0.1)
    latencies = [stamps[k] - t for k, t in sent.items() if k in stamps]
    return latencies, len(sent) - len(latencies)


# --------------------------------------------------------------------------- W4


def _explain(sql: str) -> str:
    from django.db import connection

    prefix = "EXPLAIN " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
    with connection.cursor() as cursor:
        cursor.execute(prefix + sql)
        rows = cursor.fetchall()
    if connection.vendor == "postgresql":
        return "\n".join(r[0] for r in rows)
    return "\n".join(str(r[-1]) for r in rows)


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _timed(fn: Any, repeat: int) -> tuple[list[float], int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times = []
    with CaptureQueriesContext(connection) as ctx:
        fn()
    queries = len(ctx.captured_queries)
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times, queries


def _authority_text(principal: str) -> str:
    from django_durable_scheduler.rules.authority import normalize_authority
    from django_durable_scheduler.rules.identity import canonical_json

    return canonical_json(
        normalize_authority(
            {"principal": {"type": "user", "id": principal}, "requestedCapabilities": ["reports.send"]}
        )
    )


def insert_jobs(n: int) -> None:
    """n enabled cron jobs (a realistic mix of expressions and zones), none due for a while."""
    from datetime import UTC, datetime, timedelta

    from django_durable_scheduler.models import Job
    from django_durable_scheduler.rules.authority import normalize_authority

    crons = [
        {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"},
        {"cron": "*/15 * * * *"},
        {"cron": "30 2 * * *", "timezone": "America/New_York"},
        {"cron": "0 0 1 * *"},
        {"cron": "5 4 * * sun", "timezone": "Asia/Kolkata"},
    ]
    now = datetime.now(UTC)
    authorities = [
        normalize_authority({"principal": {"type": "user", "id": f"p{k}"}, "requestedCapabilities": []})
        for k in range(100)
    ]
    batch: list[Job] = []
    for k in range(n):
        batch.append(
            Job(
                job_id=f"w4-job-{k:06d}",
                kind="bench.noop",
                trigger=crons[k % len(crons)],
                payload={"n": k},
                authority=authorities[k % 100],
                enabled=True,
                revision=1,
                max_attempts=3,
                created_at=now,
                updated_at=now,
                # Future fire times only: nothing is due during the measurement.
                next_fire_at=now + timedelta(hours=1, seconds=(k * 7919) % 86_400),
            )
        )
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    if batch:
        Job.objects.bulk_create(batch)


def insert_terminal(n: int, jobs: int) -> None:
    """n terminal occurrences of the first ``jobs`` w4 jobs: 90 % succeeded, 5 % dead_letter,
    5 % cancelled, settled over the past weeks, with realistic ids, envelopes and results."""
    from django.db import connection

    template = _authority_text("PRINCIPAL")
    head, tail = template.split("PRINCIPAL")
    chunk = 100_000
    done = 0
    while done < n:
        size = min(chunk, n - done)
        lo = done + 1
        if connection.vendor == "postgresql":
            sql = f"""
            INSERT INTO durable_scheduler_occurrences (occurrence_id, job_id, job_revision,
              idempotency_key, trigger_key, scheduled_for, available_at, status, attempt, max_attempts,
              fence, lease_owner, lease_expires_at, authority, payload, last_error, result, created_at,
              updated_at, settled_at, principal_key, metadata, receipt, priority)
            SELECT 'occ_' || h, 'w4-job-' || lpad((g % {jobs})::text, 6, '0'), 1,
              'scheduler:v1:' || h, 'schedule:' || to_char(ts, 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), ts, ts,
              st, CASE WHEN st = 'cancelled' THEN 0 ELSE 1 + g % 3 END, 3,
              CASE WHEN st = 'cancelled' THEN 0 ELSE 1 + g % 3 END, NULL, NULL,
              (%s || 'p' || ((g % {jobs}) % 100) || %s)::jsonb,
              jsonb_build_object('n', g % {jobs}),
              CASE WHEN st = 'succeeded' THEN NULL ELSE
                jsonb_build_object('type', 'RuntimeError', 'message', 'boom ' || g) END,
              CASE WHEN st = 'succeeded' THEN jsonb_build_object('sent', g % 50) ELSE NULL END,
              ts, ts + interval '1 second', ts + interval '1 second',
              '["user","p' || ((g % {jobs}) % 100) || '"]', NULL, NULL, 0
            FROM (
              SELECT g, md5(g::text) || md5('x' || g::text) AS h,
                now() - interval '1 hour' - (g * interval '2 second') AS ts,
                CASE WHEN g % 20 = 0 THEN 'dead_letter' WHEN g % 20 = 1 THEN 'cancelled'
                  ELSE 'succeeded' END AS st
              FROM generate_series({lo}, {lo + size - 1}) AS g
            ) AS s
            """
            params: list[Any] = [head, tail]
        else:
            sql = f"""
            INSERT INTO durable_scheduler_occurrences (occurrence_id, job_id, job_revision,
              idempotency_key, trigger_key, scheduled_for, available_at, status, attempt, max_attempts,
              fence, lease_owner, lease_expires_at, authority, payload, last_error, result, created_at,
              updated_at, settled_at, principal_key, metadata, receipt, priority)
            WITH RECURSIVE g(x) AS (SELECT {lo} UNION ALL SELECT x + 1 FROM g WHERE x < {lo + size - 1}),
            s AS (
              SELECT x AS g, lower(hex(randomblob(32))) AS h,
                strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || (3600 + x * 2) || ' seconds') || '000'
                  AS ts,
                strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || (3599 + x * 2) || ' seconds') || '000'
                  AS ts1,
                CASE WHEN x % 20 = 0 THEN 'dead_letter' WHEN x % 20 = 1 THEN 'cancelled'
                  ELSE 'succeeded' END AS st
              FROM g
            )
            SELECT 'occ_' || h, 'w4-job-' || substr('000000' || (g % {jobs}), -6), 1,
              'scheduler:v1:' || h, 'schedule:' || replace(substr(ts, 1, 23), ' ', 'T') || 'Z', ts, ts,
              st, CASE WHEN st = 'cancelled' THEN 0 ELSE 1 + g % 3 END, 3,
              CASE WHEN st = 'cancelled' THEN 0 ELSE 1 + g % 3 END, NULL, NULL,
              %s || 'p' || ((g % {jobs}) % 100) || %s,
              '{{"n":' || (g % {jobs}) || '}}',
              CASE WHEN st = 'succeeded' THEN NULL ELSE
                '{{"message":"boom ' || g || '","type":"RuntimeError"}}' END,
              CASE WHEN st = 'succeeded' THEN '{{"sent":' || (g % 50) || '}}' ELSE NULL END,
              ts, ts1, ts1, '["user","p' || ((g % {jobs}) % 100) || '"]', NULL, NULL, 0
            FROM s
            """
            params = [head, tail]
        # Literal % (modulo, strftime) doubled for the driver's %s parameter style.
        sql = sql.replace("%", "%%").replace("%%s", "%s")
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        done += size
        say(f"  {done:,} terminal occurrences inserted")


def run_w4(res: Results, ours: Any, sizes: dict[str, Any], reps: int) -> None:
    from django_durable_scheduler.models import Job

    query_census(res, ours)
    ours.clear()
    Job.objects.exclude(pk__in=[ours.NOOP_JOB, ours.STAMP_JOB]).delete()
    _w4_idle_tick(res, sizes["w4_jobs"], repeat=30 * reps)
    big_table = _w4_claim_latencies(res, ours, sizes)
    _w4_claim_plans(res, ours, big_table)
    _drop_pending()


def _w4_idle_tick(res: Results, n_jobs: int, repeat: int) -> None:
    """(a) An idle scheduler tick with N enabled cron jobs, nothing due."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_durable_scheduler import kernel

    start = time.perf_counter()
    insert_jobs(n_jobs)
    _analyze()
    say(f"W4: {n_jobs:,} cron jobs inserted in {time.perf_counter() - start:.1f} s")
    with CaptureQueriesContext(connection) as ctx:
        assert kernel.materialize_due() == 0
    tick_sql = [q["sql"] for q in ctx.captured_queries]
    res.plans["materialize_due (nothing due)"] = "\n\n".join(
        f"{sql}\n--\n{_explain(sql)}" for sql in tick_sql if sql.lstrip().upper().startswith("SELECT")
    )
    for label, fn in (
        ("materialize_due()", lambda: kernel.materialize_due()),
        ("next_due_at()", lambda: kernel.next_due_at()),
        ("claim_batch(limit=4), nothing due", lambda: kernel.claim_batch(owner="w4", lease=30, limit=4)),
    ):
        times, queries = _timed(fn, repeat)
        res.add(
            f"W4 idle tick: {label}, {n_jobs:,} jobs",
            "ours",
            median(times),
            unit="ms",
            better="lower",
            config=f"{queries} queries; median of {repeat}",
            detail={"queries": queries, "min": min(times), "max": max(times)},
        )
        say(f"W4 {label}: {queries} queries, median {median(times):.2f} ms (max {max(times):.2f})")


def _w4_claim_latencies(res: Results, ours: Any, sizes: dict[str, Any]) -> str:
    """(b) Claim latency: empty table vs N terminal occurrences, and vs a large due backlog.
    Leaves the terminal occurrences in place; returns the label of that table."""
    from django_durable_scheduler.models import Occurrence

    _events_clear()
    _claim_latency(res, ours, "empty table")
    _claim_latency(res, ours, "empty table", limit=4)
    for backlog in sizes["w4_backlogs"]:
        _claim_latency(res, ours, f"{backlog:,} due backlog", queued=backlog, samples=50)
    n_term = sizes["w4_terminal"]
    _events_clear()
    Occurrence.objects.all().delete()
    start = time.perf_counter()
    insert_terminal(n_term, jobs=1000)
    _analyze()
    say(f"W4: {n_term:,} terminal occurrences inserted in {time.perf_counter() - start:.1f} s")
    label = f"{n_term:,} terminal rows"
    _claim_latency(res, ours, label)
    _claim_latency(res, ours, label, limit=4)
    return label


def _claim_latency(
    res: Results, ours: Any, label: str, queued: int = 300, limit: int = 1, samples: int = 100
) -> None:
    from django_durable_scheduler import kernel

    _drop_pending()
    ours.new_run()
    if queued:
        ours.enqueue_many(queued)
    _analyze()
    times = []
    for _ in range(min(samples, queued // limit)):
        start = time.perf_counter()
        kernel.claim_batch(owner="w4", lease=300, limit=limit)
        times.append((time.perf_counter() - start) * 1000)
    res.add(
        f"W4 claim_batch(limit={limit}) latency, {label}",
        "ours",
        median(times),
        unit="ms",
        better="lower",
        config=f"{queued} queued due; median of {len(times)} claims",
        detail={"min": min(times), "max": max(times), "p95": sorted(times)[int(len(times) * 0.95)]},
    )
    say(f"W4 claim latency (limit {limit}, {label}): median {median(times):.2f} ms, max {max(times):.2f}")


def _w4_claim_plans(res: Results, ours: Any, label: str) -> None:
    """The claim's queries and their plans with the big table (and 300 queued)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_durable_scheduler import kernel

    _drop_pending()
    ours.new_run()
    ours.enqueue_many(300)
    _analyze()
    with CaptureQueriesContext(connection) as ctx:
        kernel.claim_batch(owner="w4-plan", lease=300, limit=4)
    for index, query in enumerate(ctx.captured_queries):
        sql = query["sql"]
        if sql.lstrip().upper().startswith("SELECT"):
            res.plans[f"claim_batch query {index + 1} ({label})"] = f"{sql}\n--\n{_explain(sql)}"
        else:
            short = sql[:300] + (" ..." if len(sql) > 300 else "")
            res.plans[f"claim_batch query {index + 1} ({label})"] = short


def query_census(res: Results, ours: Any) -> None:
    """Statements (and round trips) per kernel call, as the worker and user code make them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_durable_scheduler import kernel

    ours.clear()
    ours.new_run()
    census: dict[str, int] = {}

    def count(label: str, fn: Any) -> Any:
        with CaptureQueriesContext(connection) as ctx:
            value = fn()
        census[label] = len(ctx.captured_queries)
        return value

    count("enqueue (one occurrence)", lambda: ours.enqueue_noop(0))
    count("enqueue_many (100 occurrences)", lambda: ours.enqueue_many(100))
    one = count("claim_batch(limit=1)", lambda: kernel.claim_batch(owner="census", lease=60, limit=1))
    four = count("claim_batch(limit=4)", lambda: kernel.claim_batch(owner="census", lease=60, limit=4))
    count("materialize_due (nothing due)", lambda: kernel.materialize_due())
    count("next_due_at", lambda: kernel.next_due_at())
    count(
        "settle succeeded",
        lambda: kernel.settle(one[0].pk, owner="census", fence=one[0].fence, outcome="succeeded"),
    )
    for row in four:
        kernel.settle(row.pk, owner="census", fence=row.fence, outcome="succeeded")
    ours.clear()
    res.extra["queries_per_call"] = census
    say("queries per call: " + ", ".join(f"{k}: {v}" for k, v in census.items()))


def _drop_pending() -> None:
    """Delete the non-terminal occurrences (and every event: the claims wrote many)."""
    from django_durable_scheduler.models import AuthorityReservation, Occurrence

    _events_clear()
    AuthorityReservation.objects.all().delete()
    Occurrence.objects.exclude(status__in=["succeeded", "dead_letter", "cancelled"]).delete()


def _events_clear() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE durable_scheduler_events")
        else:
            cursor.execute("DELETE FROM durable_scheduler_events")


# --------------------------------------------------------------------------- profile


def run_profile(res: Results, ours: Any, sizes: dict[str, Any]) -> None:
    """py-spy over a drain of our runscheduler (all threads; wall clock with --idle, and CPU)."""
    pyspy = Path(sys.executable).parent / "py-spy"
    if not pyspy.exists():
        res.notes.append("py-spy missing: no profile")
        return
    n = sizes["profile"]
    profile: dict[str, Any] = {}
    for mode in ("wall", "cpu"):
        ours.clear()
        ours.new_run()
        ours.enqueue_many(n)
        out = LOG_DIR / f"profile-{mode}.txt"
        argv = [str(pyspy), "record", "-r", "250", "-f", "raw", "-o", str(out)]
        if mode == "wall":
            argv.append("--idle")
        cmd = [*argv, "--", sys.executable, "-m", "django", "runscheduler", "--burst"]
        env = child_env()
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not out.exists():
            res.notes.append(f"py-spy {mode} failed: {proc.stderr[-500:]}")
            continue
        profile[mode] = summarize_profile(out.read_text())
        profile[mode]["seconds"] = seconds
        profile[mode]["occurrences"] = n
        say(f"profile ({mode}): {n} occurrences in {seconds:.1f} s under py-spy")
    ours.clear()
    res.extra["profile"] = profile


def summarize_profile(raw: str, top: int = 30) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    self_counts: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame_name(f) for f in stack.split(";")]
        self_counts[frames[-1]] += count
        for name in set(frames):
            incl[name] += count

    def share(counter: Counter[str], of: int) -> list[tuple[str, float]]:
        return [(name, 100.0 * c / max(1, of)) for name, c in counter.most_common(top)]

    # The steady state: without start-up (imports, django.setup) and without the helper threads
    # that only sleep (heartbeat, LISTEN), so the shares are of the drain's own work.
    steady_self: Counter[str] = Counter()
    steady_incl: Counter[str] = Counter()
    steady = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit() or any(marker in stack for marker in STARTUP_OR_IDLE):
            continue
        count = int(count_text)
        steady += count
        frames = [_frame_name(f) for f in stack.split(";")]
        steady_self[frames[-1]] += count
        for name in set(frames):
            steady_incl[name] += count
    return {
        "samples": total,
        "self": share(self_counts, total),
        "inclusive": share(incl, total),
        "steady_samples": steady,
        "steady_self": share(steady_self, steady),
        "steady_inclusive": share(steady_incl, steady),
    }


STARTUP_OR_IDLE = ("setup (django/__init__.py", "_heartbeat (", "Listener.run (", "_find_and_load (")


def _frame_name(frame: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py)" with a short package-relative path.
    match = re.match(r"(.*) \((.*?):\d+\)$", frame)
    if not match:
        return frame
    func, path = match.groups()
    for marker in ("site-packages/", "lib/python3.11/", f"{ROOT}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{func} ({path})"


# --------------------------------------------------------------------------- main


def versions() -> dict[str, Any]:
    from importlib.metadata import version

    from django.db import connection

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    for dist in (
        "django",
        "django-durable-scheduler",
        "django-tasks",
        "django-tasks-db",
        "django-q2",
        "procrastinate",
        "psycopg",
        "py-spy",
    ):
        try:
            info[dist] = version(dist)
        except Exception:
            info[dist] = None
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            info["server"] = f"PostgreSQL {cursor.fetchone()[0]}"
            settings = {}
            for name in (
                "shared_buffers",
                "synchronous_commit",
                "fsync",
                "max_connections",
                "work_mem",
                "autovacuum",
            ):
                cursor.execute(f"SHOW {name}")
                settings[name] = cursor.fetchone()[0]
            info["server_settings"] = settings
        else:
            cursor.execute("SELECT sqlite_version()")
            info["server"] = f"SQLite {cursor.fetchone()[0]}"
            cursor.execute("PRAGMA journal_mode")
            journal = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous")
            info["server_settings"] = {"journal_mode": journal, "synchronous": cursor.fetchone()[0]}
    info["database_settings"] = {
        k: v
        for k, v in connection.settings_dict.items()
        if k in ("ENGINE", "NAME", "HOST", "PORT", "OPTIONS", "CONN_MAX_AGE")
    }
    from django.conf import settings as dj

    info["Q_CLUSTER"] = dj.Q_CLUSTER
    info["TASKS"] = dj.TASKS
    return info


def package_in_use() -> dict[str, str]:
    """Where this process and a worker process import the package from, and which commit that is;
    in a baseline run both must be the baseline's copy, or its figures would be the working tree's."""
    import django_durable_scheduler

    here = str(Path(django_durable_scheduler.__file__).resolve().parent)
    probe = "import django_durable_scheduler as p, pathlib; print(pathlib.Path(p.__file__).resolve().parent)"
    worker = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=child_env(), capture_output=True, text=True
    ).stdout.strip()
    if PACKAGE_DIR:
        expected = str(Path(PACKAGE_DIR).resolve() / "django_durable_scheduler")
        if {here, worker} != {expected}:
            raise SystemExit(f"baseline run imports {here} (workers {worker}), not {expected}")
        commit = os.environ.get("BENCH_COMMIT", "?")
    else:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "django_durable_scheduler"],
            capture_output=True,
            text=True,
        )
        commit = head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")
    return {"path": here, "worker_path": worker, "commit": commit}


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.suite")
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workloads", default="w1,w2,w3,w4,pgbench,profile")
    parser.add_argument("--levels", default="1,2")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--systems", default=None, help="only these systems (comma-separated names)")
    parser.add_argument("--n", type=int, default=None, help="W1/W2 size (overrides the mode's)")
    parser.add_argument("--w3", type=int, default=None, help="W3 count (overrides the mode's)")
    parser.add_argument("--plot", default=None, help="scale: where to write the PNG plot")
    return parser.parse_args(argv)


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    """The mode's sizes, with the ones given on the command line."""
    sizes = dict(SIZES["quick" if args.quick else "full"])
    if args.n:
        sizes["w1"] = sizes["w2"] = sizes["profile"] = args.n
    if args.w3:
        sizes["w3"] = args.w3
    return sizes


def _set_up(args: argparse.Namespace, sizes: dict[str, Any]) -> tuple[Results, list[Any]]:
    """A fresh, migrated database, the results to fill and the systems under test, set up."""
    os.environ["DATABASE_URL"] = args.url
    prepare_database(args.url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from bench.systems import systems_for

    db = "postgres" if connection.vendor == "postgresql" else connection.vendor
    res = Results(db)
    res.extra["versions"] = {**versions(), "package": package_in_use()}
    res.extra["sizes"] = {k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()}
    res.extra["reps"] = args.reps
    res.extra["logs"] = str(LOG_DIR)
    package = res.extra["versions"]["package"]
    say(f"{db}: {res.extra['versions']['server']}; package {package['commit']} from {package['path']}")
    say(f"logs in {LOG_DIR}")
    systems = systems_for(connection.vendor)
    if args.systems:
        wanted = {name.strip() for name in args.systems.split(",")}
        systems = [s for s in systems if s.name in wanted or s.name == "ours"]  # W4 runs on ours
    for system in systems:
        system.setup()
    return res, systems


def _save(res: Results, out: str) -> None:
    Path(out).write_text(
        json.dumps(
            {"db": res.db, "rows": res.rows, "notes": res.notes, "plans": res.plans, **res.extra},
            indent=1,
            default=str,
        )
    )


def _run_workloads(res: Results, systems: list[Any], sizes: dict[str, Any], args: argparse.Namespace) -> None:
    """Each workload asked for, in a fixed order; the results are saved after each."""
    workloads = {w.strip() for w in args.workloads.split(",") if w.strip()}
    levels = [int(x) for x in args.levels.split(",")]
    postgres = res.db == "postgres"
    if "w1" in workloads or "w2" in workloads:
        say(f"W1/W2 enqueue + drain ({sizes['w2']} occurrences, levels {levels}, {args.reps} reps)")
        run_w1_w2(res, systems, sizes, args.reps, levels)
        worker_startup(res, systems, args.reps)
        _save(res, args.out)
    if "w3" in workloads:
        say(f"W3 latency ({sizes['w3']} at {sizes['w3_rate']:g}/s)")
        run_w3(res, systems, sizes, args.reps)
        _save(res, args.out)
    if "pgbench" in workloads and postgres:
        say("pgbench reference")
        run_pgbench(res, args.url, sizes, args.reps)
        _save(res, args.out)
    if "profile" in workloads:
        say("profile of our drain")
        run_profile(res, systems[0], sizes)
        _save(res, args.out)
    if "w4" in workloads:
        say("W4 scale")
        run_w4(res, systems[0], sizes, args.reps)
        _save(res, args.out)
    if "scale" in workloads and postgres:
        from bench.scale import run_scale  # its systems need Django set up

        say(f"scale: 1-8 processes draining {sizes['scale']:,} occurrences")
        run_scale(res, systems[0], sizes, args.url, args.plot)
        _save(res, args.out)


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    sizes = _sizes(args)
    res, systems = _set_up(args, sizes)
    started = time.monotonic()
    try:
        _run_workloads(res, systems, sizes, args)
    finally:
        from django.db import connection

        _save(res, args.out)
        say(f"{res.db} done in {(time.monotonic() - started) / 60:.1f} min")
        connection.close()
        if not args.keep_db:
            drop_database(args.url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
