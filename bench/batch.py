"""The batch workload (ours only): the settle rate of one batch's members against plain
occurrences, on one database (run inside .venv-bench; ``python3 bench/run.py --workloads batch``
starts it once per database).

    python -m bench.batch --url DATABASE_URL --out results.json [--n N] [--workers 2] [--reps 2]
                          [--autovacuum on|as-is] [--profile N] [--quick]

Per repetition, in alternating order (plain first on even repetitions, batch first on odd):
``--workers`` idle ``runscheduler`` processes are started and seen live (their start-up is not
measured), then N no-op occurrences are committed at once, either by one ``enqueue_many`` (plain)
or by one ``enqueue_batch`` with a callback job (one batch of N members), and drained. The settle
rate is N over the time from that commit to the last member's ``settled_at``. For the batch:
the time from the last member settled to its callback enqueued (the callback's ``created_at``),
to the batch seen completed (this process looks every 5 ms from about 90 % settled on) and to the
callback run; and the checks: every member ran once, one callback, one ``batch_completed``
event, the batch's counts and size. While the batch drains, this process times the look the
workers make after each settle transaction (``batches._done``: the batch row, then one EXISTS
of a live member) and, on PostgreSQL, keeps ``EXPLAIN (ANALYZE, BUFFERS)`` of that EXISTS at a
quarter, half and three quarters of the drain.

PostgreSQL: the database is dropped and created here (``dschbench*`` names only); per run the
``pg_stat_database`` commits and the ``pg_stat_user_tables`` updates of the occurrences and
batches tables (how often the batch row was written while its members settled: the hot row
the design avoids), and the lock waits sampled every 50 ms (bench/scale.py's sampler).
``--autovacuum on`` (the default) turns autovacuum on for the run, as a steady-state install
has it, and restores the previous setting after (bench/history.py's ``autovacuum_on``); it is
off for the occurrences table while the backlog's transaction runs, which is followed by an
``ANALYZE`` (see ``_no_autoanalyze``).
``--profile N``: one more pair of drains of N, each worker under ``py-spy record --idle``: the
share of the worker loop's wall time spent in the batch look, settling, claiming and waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from bench.harness import DRAIN_TIMEOUT, LOG_DIR, Procs, Results, say
from bench.systems import AUTHORITY, MANAGE, Ours, WorkerSpec

CALLBACK_JOB = "bench-batch-done"
# Defaults per database: PostgreSQL takes the 100,000; SQLite's single writer is slower.
DEFAULT_N = {"postgres": 100_000, "sqlite": 20_000}
PLAIN, BATCH = "ours (plain occurrences)", "ours (batch members)"
# The worker loop's frames (as py-spy names them), in the order a sample is attributed to them.
LOOP = "Worker.run (django_durable_scheduler/worker.py)"
PARTS = (
    ("batch look after the settle's commit", ("complete_if_done (django_durable_scheduler/batches.py)",)),
    ("settle (settle_many)", ("OutcomeReporter.flush (django_durable_scheduler/outcomes.py)",)),
    ("claim", ("Worker.claim (django_durable_scheduler/worker.py)",)),
    ("has_due / next_due_at", ("has_due (", "next_due_at (")),
    ("maintain (materialize, sweeps)", ("Worker._maintain (django_durable_scheduler/worker.py)",)),
    ("waiting (sleep, gather)", ("Worker._sleep (", "Worker._gather (")),
    # A burst worker's exit: it waits for the heartbeat thread, which may be renewing leases.
    ("exit (burst: waiting for the heartbeat thread)", ("Worker._shutdown (",)),
)
# Functions whose inclusive share of the loop is reported too: the look's two parts, and a
# deferred field loaded one row at a time (one more round trip per occurrence).
NOTABLE = (
    "_done (django_durable_scheduler/batches.py)",
    "_complete (django_durable_scheduler/batches.py)",
    "Model.refresh_from_db (django/db/models/base.py)",
    "Connection.wait (psycopg/connection.py)",
)


class BatchOurs(Ours):
    """The suite's ``Ours`` with a callback job for the batch, whose occurrence it counts apart
    from the members (the members are the no-op job's)."""

    def setup(self) -> None:
        super().setup()
        from django_durable_scheduler import kernel
        from django_durable_scheduler.models import Job

        if not Job.objects.filter(pk=CALLBACK_JOB).exists():
            kernel.create_job(CALLBACK_JOB, "bench.noop", authority=AUTHORITY, max_attempts=3)

    def clear(self) -> None:
        from django.db import connection

        super().clear()
        with connection.cursor() as cursor:
            # After the occurrences (their batch is PROTECTed): SQLite deletes in this order.
            cursor.execute("DELETE FROM durable_scheduler_batches")

    def members_once(self, n: int) -> bool:
        """Each of the n no-op occurrences succeeded at its first attempt, claimed once, none reclaimed."""
        from django_durable_scheduler.models import Event, Occurrence

        claims = Event.objects.filter(event_type="occurrence_claimed", job_id=self.NOOP_JOB)
        return (
            Occurrence.objects.filter(job_id=self.NOOP_JOB, status="succeeded", attempt=1, fence=1).count()
            == n
            and claims.count() == n
            and claims.values("occurrence_id").distinct().count() == n
            and not Event.objects.filter(event_type="occurrence_reclaimed").exists()
        )


# --------------------------------------------------------------------------- PostgreSQL counters


def pg_counters() -> dict[str, int]:
    """The database's commits and the scheduler tables' row writes (this backend's pending
    statistics flushed first; the workers' are flushed when they exit)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
        commits, rollbacks = cursor.fetchone()
        out = {"commits": commits, "rollbacks": rollbacks}
        cursor.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname IN ('durable_scheduler_occurrences', 'durable_scheduler_batches')"
        )
        for relname, updated, hot in cursor.fetchall():
            table = relname.removeprefix("durable_scheduler_")
            out[f"{table} updated"] = updated
            out[f"{table} hot updated"] = hot
    return out


class WaitEvents:
    """What this database's active backends (but this process's) are waiting on, sampled
    every 50 ms on a connection of its own: samples per ``wait_event_type:wait_event``, with
    ``CPU`` for an active backend that waits on nothing (running, or waiting outside PostgreSQL's
    view)."""

    def __init__(self, exclude: int | None) -> None:
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self._exclude = exclude
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WaitEvents:
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
                    cursor.execute(
                        "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE datname ="
                        " current_database() AND state = 'active' AND pid <> pg_backend_pid()"
                        " AND pid IS DISTINCT FROM %s",
                        [self._exclude],
                    )
                    self.samples += 1
                    for kind, event in cursor.fetchall():
                        self.counts["CPU" if kind is None else f"{kind}:{event}"] += 1
        finally:
            connection.close()

    def summary(self, top: int = 8) -> dict[str, float]:
        """The most sampled waits, as the mean number of backends in each per sample."""
        return {name: round(count / max(1, self.samples), 3) for name, count in self.counts.most_common(top)}


# --------------------------------------------------------------------------- one drain


def _live_workers() -> int:
    from django_durable_scheduler.models import WorkerHeartbeat

    return WorkerHeartbeat.objects.filter(stopped_at__isnull=True).count()


def _start_workers(workers: int, label: str, profile: bool = False) -> Procs:
    """``workers`` idle ``runscheduler`` processes, seen live (heartbeat rows) before it returns."""
    cmd = [*MANAGE, "runscheduler"]
    if profile:
        pyspy = Path(sys.executable).parent / "py-spy"
        procs = []
        for index in range(workers):
            out = LOG_DIR / f"{label}-{index}.pyspy"
            out.unlink(missing_ok=True)
            argv = [str(pyspy), "record", "--idle", "-r", "100", "-f", "raw", "-o", str(out), "--"]
            procs.append(([*argv, *cmd, "--burst"], {}))
        spec = WorkerSpec(procs, True, f"{workers} x runscheduler --burst under py-spy")
        return Procs(spec, label)
    spec = WorkerSpec([(cmd, {})] * workers, False, f"{workers} x runscheduler (concurrency 8)")
    procs_ = Procs(spec, label)
    deadline = time.monotonic() + 120
    while _live_workers() < workers:
        if time.monotonic() > deadline or procs_.all_exited():
            procs_.stop()
            raise SystemExit(f"{label}: the workers did not start\n{procs_.tail()}")
        time.sleep(0.1)
    return procs_


def _enqueue(mode: str, n: int, tag: str) -> str | None:
    """The backlog, committed at once: one ``enqueue_many`` or one ``enqueue_batch``; the batch's id."""
    from django_durable_scheduler import kernel

    now = datetime.now(UTC)
    items = [{"scheduled_for": now, "trigger_key": f"{tag}:{i}"} for i in range(n)]
    if mode == PLAIN:
        kernel.enqueue_many(Ours.NOOP_JOB, items)
        return None
    batch, _ = kernel.enqueue_batch(
        Ours.NOOP_JOB, items, callback=CALLBACK_JOB, batch_id=tag, description=f"bench batch of {n}"
    )
    return batch.batch_id


@contextlib.contextmanager
def _no_autoanalyze(postgres: bool) -> Iterator[None]:
    """PostgreSQL: no autovacuum of the occurrences table while the backlog's transaction runs,
    and an ANALYZE once it has committed. An autoanalyze of the just-truncated table during
    that transaction counts no live row in thousands of pages; the foreign-key checks at its
    commit (each event's occurrence) are then planned as a scan of the claim index (it holds
    occurrence_id last) and each reads the whole index: the commit of 100,000 takes minutes."""
    if not postgres:
        yield
        return
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE durable_scheduler_occurrences SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE durable_scheduler_occurrences")
            cursor.execute("ALTER TABLE durable_scheduler_occurrences RESET (autovacuum_enabled)")


def _explain_probe(batch_id: str) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the EXISTS the workers' look sends (``batches._has_live``)."""
    from django.db import connection

    from django_durable_scheduler.models import ACTIVE_STATUSES, Occurrence

    query = Occurrence.objects.filter(batch_id=batch_id, status__in=ACTIVE_STATUSES)
    sql, params = query.values("pk")[:1].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) SELECT EXISTS ({sql})", params)
        return "\n".join(row[0] for row in cursor.fetchall())


class Watch:
    """What this process sees of a drain: when no member is live any more, every look at the
    batch it timed, and when the batch was seen completed."""

    def __init__(self) -> None:
        self.look_ms: list[float] = []
        self.plans: dict[str, str] = {}
        self.seen_completed: float | None = None
        self.progress: list[tuple[float, int]] = []


def _watch(mode: str, n: int, batch_id: str | None, procs: Procs, t_commit: float) -> Watch | None:
    """Wait until no member is live (looked at every 0.2 s; the succeeded counted every 2 s);
    for a batch, from about 90 % settled on (or no member live), look every 5 ms whether it is
    completed, then wait for its callback to have run. None on timeout. The 90 % is projected
    from the last count: a drain of a few seconds may end before it, and its "seen completed"
    is then up to 0.2 s late."""
    from django.db import connection

    from django_durable_scheduler.kernel import batches
    from django_durable_scheduler.models import ACTIVE_STATUSES, Batch, Occurrence

    watch = Watch()
    members = Occurrence.objects.filter(job_id=Ours.NOOP_JOB)
    completed = Batch.objects.filter(pk=batch_id, status="completed")
    deadline = time.monotonic() + DRAIN_TIMEOUT
    next_count = next_look = 0.0
    marks = [0.25, 0.5, 0.75]
    tail = False
    while True:
        now = time.monotonic()
        if now > deadline or procs.all_exited():
            return None
        if tail and completed.exists():
            watch.seen_completed = time.time()
            break
        if now >= next_look:
            next_look = now + 0.2
            procs.sample_rss()
            if batch_id is not None and not tail:
                # The look each worker makes after a settle transaction, timed from here (not
                # in the tail: near the end it reads many pages, and it would delay the 5 ms looks).
                start = time.perf_counter()
                batches._done(batch_id, "default")
                watch.look_ms.append((time.perf_counter() - start) * 1000)
                tail = not batches._has_live(batch_id, "default")
            elif batch_id is None and not members.filter(status__in=ACTIVE_STATUSES).exists():
                break
        if now >= next_count and not tail:
            next_count = now + 2.0
            done = members.filter(status="succeeded").count()
            watch.progress.append((time.time() - t_commit, done))
            while marks and done >= marks[0] * n:
                if batch_id is not None and connection.vendor == "postgresql":
                    watch.plans[f"{marks[0]:.0%} settled ({done:,})"] = _explain_probe(batch_id)
                marks.pop(0)
        if batch_id is not None and not tail:
            # The last 10 % is near, from the rate so far (a count comes only every 2 s).
            elapsed, counted = watch.progress[-1]
            rate = counted / elapsed if elapsed > 0 else 0.0
            tail = counted + rate * (time.time() - t_commit - elapsed) >= 0.9 * n
        time.sleep(0.005 if tail else 0.05)
    if batch_id is None:
        return watch
    if connection.vendor == "postgresql":
        watch.plans["every member settled"] = _explain_probe(batch_id)
    ran = Occurrence.objects.filter(job_id=CALLBACK_JOB, status="succeeded")
    while not ran.exists():
        if time.monotonic() > deadline or procs.all_exited():
            break  # the checks report it
        time.sleep(0.02)
    return watch


def _batch_checks(n: int, batch_id: str) -> tuple[dict[str, Any], list[str]]:
    """The batch's outcome and what is wrong with it (nothing, when all is right)."""
    from django_durable_scheduler import kernel
    from django_durable_scheduler.models import Event, Occurrence

    batch = kernel.get_batch(batch_id)
    callbacks = list(Occurrence.objects.filter(job_id=CALLBACK_JOB))
    completed_events = Event.objects.filter(event_type="batch_completed").count()
    progress = kernel.batch_progress(batch_id)
    expected = {"succeeded": n, "dead_letter": 0, "cancelled": 0}
    problems = []
    if batch.status != "completed":
        problems.append(f"batch is {batch.status}")
    if batch.size != n or progress["total"] != n or progress["succeeded"] != n:
        problems.append(f"size {batch.size}, progress {progress}")
    if batch.counts != expected:
        problems.append(f"counts {batch.counts}")
    if len(callbacks) != 1:
        problems.append(f"{len(callbacks)} callbacks")
    elif callbacks[0].pk != batch.callback or (callbacks[0].cause or {}).get("counts") != expected:
        problems.append(
            f"callback {callbacks[0].pk} (batch says {batch.callback}), cause {callbacks[0].cause}"
        )
    elif callbacks[0].status != "succeeded":
        problems.append(f"callback is {callbacks[0].status}")
    if completed_events != 1:
        problems.append(f"{completed_events} batch_completed events")
    callback = callbacks[0] if len(callbacks) == 1 else None
    detail = {
        "batch_status": batch.status,
        "size": batch.size,
        "counts": batch.counts,
        "callbacks": len(callbacks),
        "batch_completed_events": completed_events,
        "callback_created_at": callback and callback.created_at.timestamp(),
        "callback_settled_at": callback and callback.settled_at and callback.settled_at.timestamp(),
    }
    return detail, problems


def _batch_detail(
    res: Results,
    watch: Any,
    detail: dict[str, Any],
    *,
    batch_id: str,
    n: int,
    last: float,
    rep: int,
    mode: str,
) -> list[str]:
    """A batch run's own figures into ``detail`` and ``res`` (the look, the lags to the
    callback, the checks); the problems its checks found."""
    workload = detail["workload"]
    config = detail["config"]
    checks, problems = _batch_checks(n, batch_id)
    detail.update(checks)
    if res.db == "postgres" and detail["batches updated during the drain"] != 1:
        problems.append(f"the batch row was updated {detail['batches updated during the drain']} times")
    looks = sorted(watch.look_ms)
    detail["look ms"] = {
        "n": len(looks),
        "median": statistics.median(looks) if looks else None,
        "p95": looks[min(len(looks) - 1, int(len(looks) * 0.95))] if looks else None,
        "max": looks[-1] if looks else None,
    }
    for name, plan in watch.plans.items():
        res.plans[f"rep {rep + 1}: the look's EXISTS at {name}"] = plan
    lags = {
        "last member settled -> callback enqueued": checks["callback_created_at"],
        "last member settled -> batch seen completed": watch.seen_completed,
        "last member settled -> callback ran": checks["callback_settled_at"],
    }
    for name, at in lags.items():
        ms = None if at is None else (at - last) * 1000
        detail[name] = ms
        res.add(f"{workload}: {name}", mode, ms, unit="ms", better="lower", config=config)
    if looks:
        res.add(
            f"{workload}: the look after a settle (batch row + EXISTS), from outside",
            mode,
            detail["look ms"]["median"],
            unit="ms",
            better="lower",
            config=f"batches._done every 0.2 s during the drain, {len(looks)} samples",
        )
    return problems


def _database_detail(
    n: int, before: dict[str, Any], after: dict[str, Any], waits: Any, locks: Any
) -> dict[str, Any]:
    """What PostgreSQL's counters and the samplers saw during one drain (nothing elsewhere)."""
    detail: dict[str, Any] = {}
    if before:
        detail["commits per occurrence"] = (after["commits"] - before["commits"]) / n
        detail["rollbacks per occurrence"] = (after["rollbacks"] - before["rollbacks"]) / n
        for table in ("occurrences", "batches"):
            for what in ("updated", "hot updated"):
                key = f"{table} {what}"
                detail[f"{key} during the drain"] = after.get(key, 0) - before.get(key, 0)
    if waits is not None:
        detail["active backends by wait event (mean per sample)"] = waits.summary()
    if locks is not None:
        detail["lock waits mean"] = statistics.fmean(locks.samples) if locks.samples else 0.0
        detail["lock waits peak"] = max(locks.samples, default=0)
        detail["lock waits by lock"] = locks.summary()
    return detail


def _say_drain(
    detail: dict[str, Any],
    *,
    rep: int,
    mode: str,
    n: int,
    rate: float,
    batch_id: str | None,
    once: bool,
    problems: list[str],
) -> None:
    """One run's line on the console."""
    workload = detail["workload"]
    seconds, enqueue_seconds = detail["seconds"], detail["enqueue_seconds"]
    counted = "commits per occurrence" in detail  # PostgreSQL's statistics counters
    locks = "lock waits mean" in detail
    waits = "active backends by wait event (mean per sample)" in detail
    extra = ""
    if batch_id is not None:
        lag = {
            k: _ms_text(detail[f"last member settled -> {k}"])
            for k in ("callback enqueued", "batch seen completed", "callback ran")
        }
        look = detail["look ms"]
        extra = (
            f"; last settled -> callback enqueued {lag['callback enqueued']}, seen completed"
            f" {lag['batch seen completed']}, callback ran {lag['callback ran']}; {detail['callbacks']}"
            f" callback(s), counts {detail['counts']}; look median {_ms_text(look['median'])}"
            f" p95 {_ms_text(look['p95'])}"
        )
        if counted:
            extra += f"; batch row updated {detail['batches updated during the drain']}x during the drain"
    per = f", commits/occ {detail['commits per occurrence']:.3f}" if counted else ""
    locks_text = (
        f", lock waits mean {detail['lock waits mean']:.2f} peak {detail['lock waits peak']}" if locks else ""
    )
    if waits:
        top = list(detail["active backends by wait event (mean per sample)"].items())[:4]
        locks_text += "; active backends by wait: " + ", ".join(f"{k} {v:.2f}" for k, v in top)
    say(
        f"{workload} rep {rep + 1} {mode}: enqueue {n / enqueue_seconds:,.0f}/s, drain {seconds:.1f} s"
        f" = {rate:,.0f}/s, load {detail['load1']:.1f}{per}{locks_text}; members exactly once:"
        f" {'yes' if once else 'NO'}{extra}" + (f"; PROBLEMS: {problems}" if problems else "")
    )


def drain(res: Results, ours: BatchOurs, mode: str, n: int, workers: int, rep: int) -> float | None:
    """One run: idle workers, N committed at once (plain or one batch), drained; the rows added."""
    from django.db import connection
    from django.db.models import Max

    from bench.scale import LockSampler
    from django_durable_scheduler.models import Occurrence

    ours.clear()
    short = "plain" if mode == PLAIN else "batch"
    workload = f"drain x{workers}"
    config = f"{workers} x runscheduler (concurrency 8, started idle), {n:,} committed at once"
    procs = _start_workers(workers, f"batch-{short}-{rep}")
    postgres = res.db == "postgres"
    try:
        connection.ensure_connection()
        own = connection.connection.info.backend_pid if postgres else None
        samplers = (LockSampler(), WaitEvents(own)) if postgres else (None, None)
        with contextlib.ExitStack() as stack:
            locks, waits = (stack.enter_context(x) if x is not None else None for x in samplers)
            with _no_autoanalyze(postgres):
                start = time.perf_counter()
                batch_id = _enqueue(mode, n, f"bench-{short}-{rep}")
                t_commit = time.time()
                enqueue_seconds = time.perf_counter() - start
            before = pg_counters()
            watch = _watch(mode, n, batch_id, procs, t_commit)
    finally:
        procs.stop()
    after = pg_counters()
    api = "enqueue_many" if mode == PLAIN else "enqueue_batch"
    res.add(
        f"enqueue of {n:,} in one call ({api})",
        mode,
        n / enqueue_seconds,
        unit="ops/s",
        better="higher",
        config="one transaction",
    )
    if watch is None:
        say(f"{workload} {mode}: NOT finished\n{procs.tail()}")
        res.add(f"{workload}: settle rate", mode, None, unit="ops/s", better="higher", config=config)
        res.notes.append(f"{workload} rep {rep + 1} {mode}: NOT finished")
        return None
    last = (
        Occurrence.objects.filter(job_id=Ours.NOOP_JOB).aggregate(last=Max("settled_at"))["last"].timestamp()
    )
    rate = n / (last - t_commit)
    once = ours.members_once(n)
    detail: dict[str, Any] = {
        "workload": workload,
        "config": config,
        "seconds": last - t_commit,
        "enqueue_seconds": enqueue_seconds,
        "load1": os.getloadavg()[0],
        "members_exactly_once": once,
        "peak_rss_mb": procs.peak_rss_kb / 1024,
        "progress": watch.progress,
    }
    detail.update(_database_detail(n, before, after, waits, locks))
    problems = [] if once else ["members not exactly once"]
    if batch_id is not None:
        problems += _batch_detail(res, watch, detail, batch_id=batch_id, n=n, last=last, rep=rep, mode=mode)
    detail["problems"] = problems
    if problems:
        res.notes.append(f"{workload} rep {rep + 1} {mode}: " + "; ".join(problems))
    res.add(
        f"{workload}: settle rate", mode, rate, unit="ops/s", better="higher", config=config, detail=detail
    )
    if before:
        res.add(
            f"{workload}: commits per occurrence",
            mode,
            detail["commits per occurrence"],
            unit="commits",
            better="lower",
            config=config,
        )
    _say_drain(detail, rep=rep, mode=mode, n=n, rate=rate, batch_id=batch_id, once=once, problems=problems)
    return rate


def _ms_text(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


# --------------------------------------------------------------------------- profile


def profile_pair(res: Results, ours: BatchOurs, n: int, workers: int) -> None:
    """A drain of N plain and of a batch of N by burst workers under ``py-spy record --idle``:
    where the worker loop's wall time goes (its samples only, start-up and handler threads left out)."""
    pyspy = Path(sys.executable).parent / "py-spy"
    if not pyspy.exists():
        res.notes.append("py-spy missing: no profile")
        return
    shares: dict[str, Any] = {}
    for mode in (PLAIN, BATCH):
        ours.clear()
        short = "plain" if mode == PLAIN else "batch"
        _enqueue(mode, n, f"bench-profile-{short}")
        label = f"profile-{short}"
        start = time.perf_counter()
        procs = _start_workers(workers, label, profile=True)
        finished = procs.wait(DRAIN_TIMEOUT)
        seconds = time.perf_counter() - start
        procs.stop()
        outs = [LOG_DIR / f"{label}-{index}.pyspy" for index in range(workers)]
        if not finished or not all(out.exists() for out in outs):
            res.notes.append(f"profile {mode}: py-spy wrote nothing\n{procs.tail()}")
            continue
        shares[mode] = loop_shares("\n".join(out.read_text() for out in outs))
        shares[mode]["seconds"] = seconds
        say(f"profile {mode}: {n:,} in {seconds:.1f} s under py-spy; loop wall time: {shares[mode]['parts']}")
    ours.clear()
    res.extra["batch_profile"] = {"n": n, "workers": workers, "modes": shares}


def loop_shares(raw: str) -> dict[str, Any]:
    """Of the samples whose stack is in the worker loop (``Worker.run``), the share of each part
    of it (the first of PARTS a stack is in), the inclusive share of the NOTABLE functions, and
    the functions most of the batch look's samples are in."""
    from bench.suite import _frame_name

    parts: Counter[str] = Counter()
    look: Counter[str] = Counter()
    notable: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [_frame_name(f) for f in stack.split(";")]
        if LOOP not in frames:
            continue
        count = int(count_text)
        total += count
        part = next(
            (name for name, markers in PARTS if any(f.startswith(markers) for f in frames)),
            "other",
        )
        parts[part] += count
        for name in NOTABLE:
            if name in frames:
                notable[name] += count
        if part == PARTS[0][0]:
            look[frames[-1]] += count
    return {
        "loop_samples": total,
        "parts": {name: round(100 * c / max(1, total), 1) for name, c in parts.most_common()},
        "inclusive": {name: round(100 * notable[name] / max(1, total), 1) for name in NOTABLE},
        "batch look leaf functions": {
            name: round(100 * c / max(1, total), 2) for name, c in look.most_common(8)
        },
    }


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def _autovacuum(url: str, wanted: str) -> Iterator[dict[str, str] | None]:
    if urlsplit(url).scheme not in ("postgres", "postgresql") or wanted != "on":
        yield None
        return
    from bench.history import autovacuum_on

    with autovacuum_on(url) as state:
        yield state


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the database (PostgreSQL: dschbench* names only)")
    parser.add_argument("--out", required=True, help="where the results of this database go (JSON)")
    parser.add_argument(
        "--n", type=int, default=None, help="occurrences per drain (PostgreSQL 100,000, SQLite 20,000)"
    )
    parser.add_argument("--workers", type=int, default=2, help="runscheduler processes (default 2)")
    parser.add_argument("--reps", type=int, default=2, help="pairs of drains, alternating (default 2)")
    parser.add_argument(
        "--autovacuum",
        choices=("on", "as-is"),
        default="on",
        help="PostgreSQL: autovacuum on for the run, then restored (default), or as the server has it",
    )
    parser.add_argument("--profile", type=int, default=0, help="N of one more pair under py-spy (0: none)")
    parser.add_argument("--quick", action="store_true", help="2,000 per drain unless --n says otherwise")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.reps < 1 or (args.n is not None and args.n < 1) or args.profile < 0:
        parser.error("--n, --workers and --reps must be at least 1, --profile at least 0")
    from bench.suite import _save, drop_database, prepare_database, versions

    os.environ["DATABASE_URL"] = args.url
    prepare_database(args.url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    db = "postgres" if connection.vendor == "postgresql" else connection.vendor
    n = args.n or (2000 if args.quick else DEFAULT_N.get(db, 20_000))
    res = Results(db)
    res.extra.update(versions=versions(), reps=args.reps, logs=str(LOG_DIR))
    res.extra["sizes"] = {"batch": n, "workers": args.workers, "cpus": os.cpu_count()}
    ours = BatchOurs()
    ours.setup()
    say(
        f"{db}: {res.extra['versions']['server']}; {n:,} per drain, {args.workers} workers; logs in {LOG_DIR}"
    )
    started = time.monotonic()
    try:
        with _autovacuum(args.url, args.autovacuum) as autovacuum:
            res.extra["autovacuum"] = autovacuum or (
                {"as-is": _show(connection)} if db == "postgres" else None
            )
            for rep in range(args.reps):
                order = (PLAIN, BATCH) if rep % 2 == 0 else (BATCH, PLAIN)
                rates = {mode: drain(res, ours, mode, n, args.workers, rep) for mode in order}
                if rates[PLAIN] and rates[BATCH]:
                    ratio = rates[BATCH] / rates[PLAIN]
                    res.add(
                        f"drain x{args.workers}: batch / plain settle rate",
                        "ours",
                        ratio,
                        unit="x",
                        better="higher",
                        config=f"per repetition, order {' then '.join(order)}",
                    )
                    say(f"rep {rep + 1}: batch / plain = {ratio:.3f}")
                _save(res, args.out)
            if args.profile:
                profile_pair(res, ours, args.profile, args.workers)
    finally:
        _save(res, args.out)
        say(f"{db} done in {(time.monotonic() - started) / 60:.1f} min")
        ours.clear()
        connection.close()
        if not args.keep_db:
            drop_database(args.url)
    return 0


def _show(connection: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return str(cursor.fetchone()[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
