#!/usr/bin/env python3
"""The admin dashboard's queries on a large occurrences table: ``python3 bench/dashboard.py
[--rows 1000000]`` (PostgreSQL, ``postgres://postgres@127.0.0.1:5432/dschdash``, created and
dropped here; run with the ``.venv-bench`` interpreter that bench/run.py builds).

Fills the table through ``enqueue_many`` (20 jobs of 5 kinds), settles 95 % of the rows over the
last two days and leaves 5 % queued, then times each of ``dashboard.collect()``'s queries and
prints its plan's scan types, so that a full scan shows.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
URL = "postgres://postgres@127.0.0.1:5432/dschdash"
SCAN = re.compile(
    r"((?:Parallel )?(?:Seq Scan|Index Only Scan|Index Scan|Bitmap Heap Scan|Bitmap Index Scan))"
    r"(?: using \S+)? on (\S+)"
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/dashboard.py")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="time the database the last run filled (its hourly counts cleared)",
    )
    args = parser.parse_args(argv)
    if not args.reuse:
        subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", "dschdash"], check=True)
        subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", "dschdash"], check=True)
    os.environ.update(DATABASE_URL=URL, DJANGO_SETTINGS_MODULE="bench.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from datetime import UTC, datetime

    from django.core.management import call_command
    from django.db import connection

    import django_durable_scheduler as scheduler

    call_command("migrate", verbosity=0)
    if args.reuse:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE durable_scheduler_outcome_counts")
        return time_collect(args.reps)
    jobs = [f"job-{n}" for n in range(20)]
    for n, job_id in enumerate(jobs):
        scheduler.create_job(job_id, f"kind.{n % 5}")
    start = time.perf_counter()
    per_job = args.rows // len(jobs)
    now = datetime.now(UTC)
    for job_id in jobs:
        for first in range(0, per_job, 5000):
            keys = range(first, min(per_job, first + 5000))
            scheduler.enqueue_many(job_id, [{"scheduled_for": now, "trigger_key": f"k{i}"} for i in keys])
    with connection.cursor() as cursor:
        # Settle 95 % over the last two days: 90 % succeeded, 5 % dead-lettered (bench data only).
        cursor.execute(
            "UPDATE durable_scheduler_occurrences SET"
            " status = CASE WHEN hashtext(occurrence_id) % 20 = 0 THEN 'dead_letter' ELSE 'succeeded' END,"
            " attempt = 1,"
            " settled_at = now() - (abs(hashtext(idempotency_key)) % 172800) * interval '1 second',"
            " last_error = CASE WHEN hashtext(occurrence_id) % 20 = 0"
            '   THEN \'{"type": "ValueError", "message": "bench"}\'::jsonb END'
            " WHERE abs(hashtext(occurrence_id)) % 20 <> 1"
        )
        cursor.execute("VACUUM ANALYZE durable_scheduler_occurrences")
        cursor.execute("SELECT status, count(*) FROM durable_scheduler_occurrences GROUP BY 1 ORDER BY 1")
        counts = cursor.fetchall()
    print(f"filled {args.rows:,} rows in {time.perf_counter() - start:.0f} s: {counts}")
    return time_collect(args.reps)


def time_collect(reps: int) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_durable_scheduler.admin import dashboard

    totals = []
    for _ in range(reps + 1):
        began = time.perf_counter()
        dashboard.collect()
        totals.append((time.perf_counter() - began) * 1000)
    # The first view counts the hours that are over (rollups.py); the views after it read them.
    print(f"\ndashboard.collect(): first {totals[0]:.1f} ms (counts the last day's hours)")
    warm = totals[1:]
    print(f"dashboard.collect(): then median {statistics.median(warm):.1f} ms, min {min(warm):.1f} ms")
    with CaptureQueriesContext(connection) as queries:
        dashboard.collect()
    print(f"{'ms':>8}  {'scans (relation)':<60}  query")
    for query in queries.captured_queries:
        sql = query["sql"]
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT TEXT) " + sql)
            plan = [row[0] for row in cursor.fetchall()]
        ms = next(float(line.split()[2]) for line in plan if line.startswith("Execution Time"))
        scans = sorted({m.group(1) + " " + m.group(2) for line in plan if (m := SCAN.search(line))})
        print(f"{ms:>8.1f}  {'; '.join(scans)[:60]:<60}  {' '.join(sql.split())[:80]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
