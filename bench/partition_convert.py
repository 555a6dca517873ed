"""Migration 0005 on a filled events table (PostgreSQL): how long the conversion to day
partitions holds the table's ACCESS EXCLUSIVE lock, how long the whole migration takes, and the
longest an insert of an event waited meanwhile.

    python bench/partition_convert.py [--events 1000000] [--url postgres://.../dsch_partition_big]

It drops and creates the database named in the URL, migrates it to 0004 (a plain table), fills
the events by SQL (``INSERT ... SELECT generate_series``: one job, one occurrence in 100 with
events, 30 days of timestamps), then runs ``migrate`` while two other connections watch: one
polls ``pg_locks`` every millisecond for an ACCESS EXCLUSIVE lock granted on the events table
(the lock time is the sum of the polls that saw one), the other inserts an event in a loop and
keeps the longest time one took. Standalone: its own settings, the package's migrations only.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import django
import psycopg
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
TABLE = "durable_scheduler_events"


def configure(url: str) -> None:
    parts = urlsplit(url)
    settings.configure(
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=["django_durable_scheduler"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": parts.path.lstrip("/"),
                "USER": parts.username or "",
                "PASSWORD": parts.password or "",
                "HOST": parts.hostname or "",
                "PORT": str(parts.port or ""),
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def recreate(url: str) -> None:
    parts = urlsplit(url)
    server = url.replace(parts.path, "/postgres")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}"')
        conn.execute(f'CREATE DATABASE "{parts.path.lstrip("/")}"')


def fill(events: int) -> None:
    """One job, one occurrence per 100 events, ``events`` events over the last 30 days."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_scheduler_jobs (job_id, kind, trigger, payload, authority, enabled,"
            " revision, max_attempts, created_at, updated_at, retry_base_delay_ms, retry_max_delay_ms)"
            " VALUES ('bench', 'k', '{}', NULL, '{}', true, 1, 3, now(), now(), 1000, 1000)"
        )
        cursor.execute(
            "INSERT INTO durable_scheduler_occurrences (occurrence_id, job_id, job_revision, idempotency_key,"
            " trigger_key, scheduled_for, available_at, status, attempt, max_attempts, fence, authority,"
            " created_at, updated_at, settled_at, principal_key, priority)"
            " SELECT 'occ' || g, 'bench', 1, 'key' || g, 't' || g, now(), now(), 'succeeded', 1, 3, 1, '{}',"
            " now(), now(), now(), '', 0 FROM generate_series(1, %s) g",
            [events // 100],
        )
        cursor.execute(
            f"INSERT INTO {TABLE} (job_id, occurrence_id, event_type, occurred_at, owner_id, fence, data)"
            " SELECT 'bench', 'occ' || (1 + g %% %s), 'occurrence_succeeded',"
            " now() - (g * interval '30 days') / %s, 'w', 1, '{\"n\": 1}' FROM generate_series(1, %s) g",
            [events // 100, events, events],
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


class Watch(threading.Thread):
    """A connection of its own, running ``probe`` in a loop until stopped."""

    def __init__(self, url: str, probe) -> None:
        super().__init__(daemon=True)
        self.url, self.probe, self.stop, self.result = url, probe, threading.Event(), 0.0

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                self.result = self.probe(conn, self.result)


def lock_probe(conn, held: float) -> float:
    started = time.perf_counter()
    (locked,) = conn.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " WHERE l.mode = 'AccessExclusiveLock' AND l.granted AND c.relname LIKE %s",
        [f"{TABLE}%"],
    ).fetchone()
    time.sleep(0.001)
    return held + (time.perf_counter() - started if locked else 0.0)


def insert_probe(conn, longest: float) -> float:
    started = time.perf_counter()
    conn.execute(
        f"INSERT INTO {TABLE} (job_id, event_type, occurred_at, data)"
        " VALUES ('bench', 'probe', now(), '{}')"
    )
    time.sleep(0.005)
    return max(longest, time.perf_counter() - started - 0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--url", default="postgres://postgres@127.0.0.1:5432/dsch_partition_big")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    recreate(args.url)
    configure(args.url)
    from django.core.management import call_command

    call_command("migrate", "durable_scheduler", "0004", verbosity=0)
    started = time.perf_counter()
    fill(args.events)
    print(f"filled {args.events:,} events in {time.perf_counter() - started:.1f} s")
    watches = [Watch(args.url, lock_probe), Watch(args.url, insert_probe)]
    for watch in watches:
        watch.start()
    time.sleep(0.5)
    started = time.perf_counter()
    call_command("migrate", "durable_scheduler", "0005", verbosity=0)
    elapsed = time.perf_counter() - started
    time.sleep(0.5)
    for watch in watches:
        watch.stop.set()
        watch.join()
    lock, insert = (watch.result for watch in watches)
    print(f"migration 0005: {elapsed:.2f} s in all; ACCESS EXCLUSIVE held {lock * 1000:.0f} ms;")
    print(f"longest insert of an event meanwhile: {insert * 1000:.0f} ms")


if __name__ == "__main__":
    main()
