"""The scale workload (PostgreSQL, ours only): 1, 2, 4 and 8 ``runscheduler`` processes draining
the same backlog on one database, with no-op handlers and with handlers that sleep
20 ms, against pgbench's single-row UPDATE rate at as many clients in the same run.

Per run: throughput; commits and rollbacks per occurrence and deadlocks (``pg_stat_database``
deltas: with SKIP LOCKED a claimer that meets rows another holds skips them, so contention
shows as more claim transactions per occurrence, not as waits); lock waits, sampled every
50 ms from ``pg_locks`` (mean and peak of ungranted locks in this database, and which lock each
waiter waits on: locktype, table, the waiting statement's kind and what blocks it); and the
exactly-once check. Writes a PNG plot when matplotlib is installed.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import DRAIN_TIMEOUT, Procs, Results, run_pgbench, say, wait_done
from bench.systems import MANAGE, WorkerSpec

PROCESSES = (1, 2, 4, 8)
HANDLERS = (("no-op", "bench-noop"), ("sleep 20 ms", "bench-sleep"))


def _counters() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit, xact_rollback, deadlocks FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
        row = cursor.fetchone()
    return dict(zip(("commits", "rollbacks", "deadlocks"), row, strict=True))


# Every ungranted lock of this database's backends (transactionid locks carry no database, so
# the backend's database is what filters), with the table it is on: the lock's own relation,
# or for a transactionid wait (a row lock: the waiter holds the row's tuple lock and waits for
# the locker's transaction) the relation of the tuple lock the waiter holds; and the
# statement of the first backend blocking it, with that backend's state.
_WAITERS = """
SELECT w.locktype, w.mode,
       COALESCE(w.relation::regclass::text,
                (SELECT t.relation::regclass::text FROM pg_locks t
                  WHERE t.pid = w.pid AND t.locktype = 'tuple' AND t.granted LIMIT 1), ''),
       a.query, b.state, b.query
FROM pg_locks w
JOIN pg_stat_activity a ON a.pid = w.pid
LEFT JOIN pg_stat_activity b ON b.pid = (pg_blocking_pids(w.pid))[1]
WHERE NOT w.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid()
"""


def fingerprint(sql: str | None) -> str:
    """A statement's kind: its verb, the first scheduler table it names and its locking
    clause (``SELECT durable_scheduler_authority_policies FOR UPDATE``)."""
    if not sql:
        return "-"
    text = " ".join(sql.split())
    verb = text.split(" ", 1)[0].upper()
    table = re.search(r'(?:FROM|UPDATE|INTO)\s+"?(\w+)"?', text, re.IGNORECASE)
    clause = re.search(r"FOR (?:NO KEY )?UPDATE(?: SKIP LOCKED)?|FOR (?:KEY )?SHARE", text, re.IGNORECASE)
    return " ".join(
        part for part in (verb, table and table.group(1), clause and clause.group(0).upper()) if part
    )


class LockSampler:
    """Samples the ungranted locks in this database every 50 ms, on a connection of its own:
    how many (``samples``), and what each waiter waits on (``waits``: samples per locktype,
    relation and the waiting statement's fingerprint, with the blocking statements seen)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.waits: Counter[tuple[str, str, str]] = Counter()
        self.blockers: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                while not self._stop.wait(0.05):
                    cursor.execute(_WAITERS)
                    rows = cursor.fetchall()
                    self.samples.append(len(rows))
                    for locktype, mode, relation, waiting, state, blocking in rows:
                        key = (f"{locktype} {mode}", relation or "-", fingerprint(waiting))
                        self.waits[key] += 1
                        self.blockers[key][f"{fingerprint(blocking)} ({state or '-'})"] += 1
        finally:
            connection.close()

    def summary(self, top: int = 5) -> list[dict[str, Any]]:
        """The most sampled waits, each with its share of all waiter samples and its most
        frequent blockers."""
        total = sum(self.waits.values()) or 1
        return [
            {
                "lock": lock,
                "relation": relation,
                "waiting": waiting,
                "samples": count,
                "share": count / total,
                "blocked by": dict(self.blockers[lock, relation, waiting].most_common(3)),
            }
            for (lock, relation, waiting), count in self.waits.most_common(top)
        ]


def _enqueue(job_id: str, n: int, run: str) -> None:
    """The backlog in one transaction, so that the workers see it all at once."""
    from django.db import transaction

    from django_durable_scheduler import kernel

    now = datetime.now(UTC)
    with transaction.atomic():
        for start in range(0, n, 5000):
            end = min(n, start + 5000)
            kernel.enqueue_many(
                job_id, [{"scheduled_for": now, "trigger_key": f"s:{run}:{i}"} for i in range(start, end)]
            )


def _live_workers() -> int:
    from django_durable_scheduler.models import WorkerHeartbeat

    return WorkerHeartbeat.objects.filter(stopped_at__isnull=True).count()


def run_scale(res: Results, ours: Any, sizes: dict[str, Any], url: str, plot: str | None) -> None:
    """Per run: the processes are started and idle first (their start-up is not measured), then
    the backlog is committed at once and timed until every occurrence has succeeded."""
    n = sizes["scale"]
    points: dict[str, list[tuple[int, float]]] = {}
    for label, job_id in HANDLERS:
        for processes in PROCESSES:
            ours.clear()
            spec = WorkerSpec([([*MANAGE, "runscheduler"], {})] * processes, False)
            procs = Procs(spec, f"scale-{processes}")
            try:
                deadline = time.monotonic() + 120
                while _live_workers() < processes and time.monotonic() < deadline:
                    time.sleep(0.1)
                before = _counters()
                with LockSampler() as locks:
                    _enqueue(job_id, n, f"{label}-{processes}")
                    start = time.perf_counter()
                    end, done = wait_done(ours, n, procs, DRAIN_TIMEOUT)
                after = _counters()
            finally:
                procs.stop()
            workload = f"scale: {label}, {processes} process(es)"
            config = f"{processes} x runscheduler (concurrency 8), {n} occurrences committed at once"
            if end is None:
                say(f"{workload}: NOT finished ({done}/{n})\n{procs.tail()}")
                res.add(workload, "ours", None, unit="ops/s", better="higher", config=config)
                continue
            rate = n / (end - start)
            once = ours.exactly_once(n)
            detail = {
                **{f"{k} per occurrence": (after[k] - before[k]) / n for k in ("commits", "rollbacks")},
                "deadlocks": after["deadlocks"] - before["deadlocks"],
                "lock waits mean": statistics.fmean(locks.samples) if locks.samples else 0.0,
                "lock waits peak": max(locks.samples, default=0),
                "lock waits by lock": locks.summary(),
                "exactly_once": once,
            }
            res.add(workload, "ours", rate, unit="ops/s", better="higher", config=config, detail=detail)
            if not once:
                res.notes.append(f"{workload}: NOT exactly once")
            points.setdefault(label, []).append((processes, rate))
            say(
                f"{workload}: {rate:,.0f}/s; commits/occ {detail['commits per occurrence']:.2f}, "
                f"rollbacks/occ {detail['rollbacks per occurrence']:.3f}, deadlocks {detail['deadlocks']}, "
                f"lock waits mean {detail['lock waits mean']:.2f} peak {detail['lock waits peak']}; "
                f"exactly once: {'yes' if once else 'NO'}"
            )
            for wait in detail["lock waits by lock"]:
                say(
                    f"  {wait['share']:.0%} of waiter samples ({wait['samples']}): {wait['lock']} on"
                    f" {wait['relation']}, waiting: {wait['waiting']}; blocked by: {wait['blocked by']}"
                )
    ours.clear()
    run_pgbench(res, url, sizes, 1, PROCESSES)
    reference = {
        clients: row["samples"][-1]
        for clients in PROCESSES
        for row in res.rows
        if row["workload"] == f"pgbench single-row UPDATE, {clients} client(s)"
    }
    res.extra["scale"] = {"points": points, "pgbench": reference, "n": n}
    if plot:
        _plot(points, reference, n, Path(plot))


def _plot(
    points: dict[str, list[tuple[int, float]]], reference: dict[int, float], n: int, path: Path
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, series in points.items():
        ax.plot([p for p, _ in series], [r for _, r in series], marker="o", label=f"drain, {label} handlers")
    if reference:
        clients = sorted(reference)
        ax.plot(
            clients, [reference[c] for c in clients], linestyle="--", color="grey", label="pgbench UPDATE tps"
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(PROCESSES), [str(p) for p in PROCESSES])
    ax.set_xlabel("worker processes (pgbench: clients)")
    ax.set_ylabel("occurrences per second")
    ax.set_title(f"{n:,} occurrences on one PostgreSQL, 8 handler threads per process")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    say(f"plot written to {path}")
