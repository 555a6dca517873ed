"""What one-by-one enqueue writes on SQLite: the pages each commit puts in the WAL, by B-tree
(table or index), for this package and django-tasks-db, the same W1 call as bench/suite.py's.

    .venv-bench/bin/python -m bench.sqlite_pages [--calls 50]

In WAL mode a commit appends every page it changed, whole, to the WAL, and the connection that
takes the WAL past ``wal_autocheckpoint`` pages copies them back into the database file: the
pages a commit changes are what SQLite's part of an enqueue grows with. Each system runs in a
process of its own on a fresh file (as the project README asks: WAL, ``IMMEDIATE``), enqueues
``--warmup`` calls, empties the WAL, and enqueues ``--calls`` more with automatic checkpoints off,
so that the WAL holds exactly their commits; its frames are then mapped to their B-trees with
SQLite's ``dbstat`` table.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = {"ours": "Ours", "django-tasks-db": "DjangoTasks"}


def measure(system: str, path: str, warmup: int, calls: int) -> dict[str, float]:
    """In this process (Django set up on ``path``): pages per commit of ``system``'s enqueue."""
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench import systems

    call_command("migrate", verbosity=0)
    peer = getattr(systems, SYSTEMS[system])()
    peer.setup()
    peer.run = time.time_ns()  # ours: the trigger keys of this process
    for i in range(warmup):
        peer.enqueue_noop(i)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        cursor.execute("PRAGMA wal_autocheckpoint = 0")
    for i in range(calls):
        peer.enqueue_noop(warmup + i)
    wal = Path(path + "-wal").read_bytes()
    page_size = struct.unpack(">I", wal[8:12])[0]
    owners = dict(
        (page, name) for name, page in sqlite3.connect(path).execute("SELECT name, pageno FROM dbstat")
    )
    pages: collections.Counter[str] = collections.Counter()
    commits = 0
    for offset in range(32, len(wal) - page_size - 23, page_size + 24):
        page, commit_size = struct.unpack(">II", wal[offset : offset + 8])
        pages[owners.get(page, "(page 1)" if page == 1 else "(free)")] += 1
        commits += commit_size != 0
    return {name: count / commits for name, count in pages.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's side: a system to measure
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, os.environ["BENCH_SQLITE_PATH"], args.warmup, args.calls)))
        return
    with tempfile.TemporaryDirectory() as directory:
        for system in SYSTEMS:
            path = f"{directory}/{system}.sqlite3"
            env = {**os.environ, "DATABASE_URL": f"sqlite:///{path}", "BENCH_SQLITE_PATH": path}
            command = [sys.executable, "-m", "bench.sqlite_pages", "--one", system]
            command += ["--calls", str(args.calls), "--warmup", str(args.warmup)]
            out = subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True, text=True)
            pages = json.loads(out.stdout.splitlines()[-1])
            print(f"{system}: {sum(pages.values()):.1f} pages a commit")
            for name, per_commit in pages.items():
                print(f"  {per_commit:5.2f}  {name}")


if __name__ == "__main__":
    main()
