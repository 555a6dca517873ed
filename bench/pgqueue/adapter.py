"""The harness adapter: ``python -m bench.pgqueue.adapter`` with the harness's environment.

One process per replica, as the contract asks: the producer thread enqueues at
``PRODUCER_RATE`` (re-read from ``PRODUCER_RATE_CONTROL_FILE``, which the high-load phase
raises), the main thread runs ``manage.py runscheduler`` (so a SIGKILL of the replica kills its
worker too, and SIGTERM stops it the documented way), and a sampler thread prints the JSONL
samples every ``SAMPLE_EVERY_S``. Only the package's public API is used: ``create_job``,
``enqueue``/``enqueue_many``, ``@handler``, and the ``migrate``, ``runscheduler`` and
``scheduler_status`` commands. The ``ENQUEUE`` tokens the harness may write on stdin are not
read: pacing is the adapter's, on wall-clock credit, as procrastinate's adapter does it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

JOB_ID = "pgqueue-bench"
# The tables the harness samples for dead tuples and sizes (adapter.json lists the same).
# The events table is left out: it is partitioned by day, so the parent has no row statistics,
# and its rows are only ever inserted.
EVENT_MODELS = ("Occurrence", "AuthorityReservation", "AuthorityUsage", "WorkerHeartbeat", "OutcomeCount")
OBSERVER_METRICS = {"queue_depth", "producer_target_rate"}

logger = logging.getLogger("bench.pgqueue")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(float(value)) if value.strip() else default


@dataclass(frozen=True)
class Config:
    """The harness's environment, read once (defaults as in its CONTRIBUTING_ADAPTERS.md)."""

    system: str
    scenario: str
    mode: str
    rate: int
    rate_file: str
    batch_max: int
    batch_ms: int
    target_depth: int
    workers: int
    payload_bytes: int
    sample_every_s: int
    database: str | None

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            system=os.environ.get("BENCH_SYSTEM", "dds"),
            scenario=os.environ.get("SCENARIO", "long_horizon"),
            mode=os.environ.get("PRODUCER_MODE", "fixed"),
            rate=_env_int("PRODUCER_RATE", 800),
            rate_file=os.environ.get("PRODUCER_RATE_CONTROL_FILE", ""),
            batch_max=max(1, _env_int("PRODUCER_BATCH_MAX", 1)),
            batch_ms=max(1, _env_int("PRODUCER_BATCH_MS", 10)),
            target_depth=_env_int("TARGET_DEPTH", 1000),
            workers=max(1, _env_int("WORKER_COUNT", 32)),
            payload_bytes=_env_int("JOB_PAYLOAD_BYTES", 256),
            sample_every_s=max(1, _env_int("SAMPLE_EVERY_S", 5)),
            database="scheduler" if os.environ.get("BENCH_PREPARED") == "1" else None,
        )

    def current_rate(self) -> float:
        """The offered rate now: the control file's when it is there and readable."""
        if self.rate_file:
            try:
                return float(Path(self.rate_file).read_text().strip())
            except (OSError, ValueError):
                pass
        return float(self.rate)


class Producer:
    """Enqueues the offered load, credited on real elapsed time (the contract's pacing rule)."""

    def __init__(self, config: Config, depth: Depth, stop: threading.Event) -> None:
        self.config, self.depth, self.stop = config, depth, stop
        self.target_rate = float(config.rate)
        self._nonce = uuid.uuid4().hex[:12]  # trigger keys stay unique across restarts
        self._seq = 0
        self._pad = "x" * config.payload_bytes

    def run(self) -> None:
        credit, last, rate_read_at = 0.0, time.monotonic(), 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if self.config.mode == "depth-target":
                self.target_rate = 0.0
                want = min(self.config.batch_max, self.config.target_depth - self.depth.value)
                if want <= 0:
                    self.stop.wait(0.05)
                    continue
            else:
                if now - rate_read_at >= 0.1:
                    self.target_rate, rate_read_at = self.config.current_rate(), now
                if self.target_rate <= 0:
                    credit, last = 0.0, now
                    self.stop.wait(0.1)
                    continue
                credit += self.target_rate * (now - last)
                last = now
                if credit < 1.0:
                    wait = (1.0 - credit) / self.target_rate
                    if self.config.batch_max > 1:
                        wait = max(wait, self.config.batch_ms / 1000.0)
                    self.stop.wait(wait)
                    continue
                want = min(self.config.batch_max, int(credit))
                credit -= want
            self._enqueue(want)

    def _enqueue(self, n: int) -> None:
        from django.db import connections

        import django_durable_scheduler as scheduler

        items = []
        for _ in range(n):
            created = time.time()
            items.append(
                {
                    "scheduled_for": int(created * 1000),
                    "trigger_key": f"{self._nonce}:{self._seq}",
                    "payload": {"created_at": created, "seq": self._seq, "pad": self._pad},
                }
            )
            self._seq += 1
        try:
            if n == 1:
                scheduler.enqueue(JOB_ID, **items[0])
            else:
                scheduler.enqueue_many(JOB_ID, items)
        except Exception as exc:  # chaos phases kill connections: log, reconnect, go on
            logger.warning("enqueue failed: %s", str(exc).splitlines()[0] if str(exc) else exc)
            connections["default"].close()
            self.stop.wait(0.05)
            return
        from . import telemetry

        telemetry.RECORDER.enqueued_n(n)


class Depth:
    """Due occurrences not yet claimed, as ``scheduler_status --json`` reports them (``due``)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.value = 0

    def run(self) -> None:
        from django.core.management import call_command
        from django.db import connections

        while not self.stop.is_set():
            out = io.StringIO()
            try:
                call_command("scheduler_status", "--json", stdout=out, stderr=io.StringIO())
            except SystemExit:
                pass  # unhealthy (a backlog older than --max-lag, say): the JSON is still there
            except Exception as exc:
                logger.warning("scheduler_status failed: %s", exc)
                connections["default"].close()
            with contextlib.suppress(ValueError, KeyError):
                self.value = int(json.loads(out.getvalue())["due"])
            self.stop.wait(1.0)


def sample(config: Config, producer: Producer, depth: Depth, stop: threading.Event) -> None:
    """Every SAMPLE_EVERY_S, aligned to the wall clock's boundaries, one record per metric."""
    from . import telemetry

    every = config.sample_every_s
    stop.wait(every - (time.time() % every))
    last_enq, last_done, last_t = telemetry.RECORDER.enqueued, telemetry.RECORDER.completed, time.monotonic()
    observer = telemetry.instance_id() == 0
    while not stop.is_set():
        stop.wait(every - (time.time() % every))
        if stop.is_set():
            return
        now = time.monotonic()
        elapsed, last_t = max(0.001, now - last_t), now
        enq, done = telemetry.RECORDER.enqueued, telemetry.RECORDER.completed
        p50, p95, p99 = telemetry.RECORDER.percentiles(0.50, 0.95, 0.99)
        stamp = telemetry.now_iso()
        for metric, value, window in (
            ("claim_p50_ms", p50, telemetry.WINDOW_S),
            ("claim_p95_ms", p95, telemetry.WINDOW_S),
            ("claim_p99_ms", p99, telemetry.WINDOW_S),
            ("enqueue_rate", (enq - last_enq) / elapsed, float(every)),
            ("completion_rate", (done - last_done) / elapsed, float(every)),
            ("queue_depth", float(depth.value), 0.0),
            ("producer_target_rate", producer.target_rate, 0.0),
        ):
            if metric in OBSERVER_METRICS and not observer:
                continue
            telemetry.emit(
                {
                    "t": stamp,
                    "system": config.system,
                    "kind": "adapter",
                    "subject_kind": "adapter",
                    "subject": "",
                    "metric": metric,
                    "value": value if math.isfinite(value) else 0.0,
                    "window_s": window,
                }
            )
        last_enq, last_done = enq, done


def _check_package() -> str:
    """The directory of the package imported; BENCH_PACKAGE_DIR, when set, must be it."""
    import django_durable_scheduler as scheduler

    found = Path(scheduler.__file__).resolve().parent
    wanted = os.environ.get("BENCH_PACKAGE_DIR")
    if wanted and found != (Path(wanted) / "django_durable_scheduler").resolve():
        raise SystemExit(f"adapter: imported {found}, but BENCH_PACKAGE_DIR is {wanted}")
    return str(found)


def _descriptor(config: Config, package_dir: str) -> dict[str, object]:
    from django.apps import apps
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    from . import telemetry

    applied = MigrationRecorder(connection).applied_migrations()
    ours = sorted(name for app, name in applied if app == "durable_scheduler")
    return {
        "kind": "descriptor",
        "system": config.system,
        "event_tables": [
            f"public.{apps.get_model('durable_scheduler', name)._meta.db_table}" for name in EVENT_MODELS
        ],
        "extensions": [],
        "version": os.environ.get("BENCH_VERSION", "working tree"),
        "package_dir": package_dir,
        "schema_version": ours[-1] if ours else "",
        "db_name": connection.settings_dict["NAME"],
        "started_at": telemetry.now_iso(),
    }


def main() -> int:
    config = Config.from_env()
    if config.scenario != "long_horizon":
        print(f"adapter: only SCENARIO=long_horizon is implemented, not {config.scenario!r}", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.pgqueue.settings")
    import django

    django.setup()
    from django.core.management import call_command

    import django_durable_scheduler as scheduler

    from . import telemetry
    from .tasks import KIND

    package_dir = _check_package()
    # Replicas start one after another (the harness waits for each descriptor), so only the
    # first one migrates a fresh database.
    call_command("migrate", verbosity=0, stdout=sys.stderr)
    with contextlib.suppress(scheduler.Conflict):  # made by an earlier replica or incarnation
        scheduler.create_job(JOB_ID, KIND)
    telemetry.emit(_descriptor(config, package_dir))

    stop = threading.Event()
    depth = Depth(stop)
    producer = Producer(config, depth, stop)
    threads = [threading.Thread(target=producer.run, name="producer", daemon=True)]
    threads.append(
        threading.Thread(target=sample, args=(config, producer, depth, stop), name="sampler", daemon=True)
    )
    if telemetry.instance_id() == 0 or config.mode == "depth-target":
        threads.append(threading.Thread(target=depth.run, name="depth", daemon=True))
    for thread in threads:
        thread.start()
    # -v 0: a line per settled occurrence on stderr is not what a loaded production worker logs.
    args = ["--concurrency", str(config.workers), "--grace", "3", "--verbosity", "0"]
    if config.database:
        args += ["--database", config.database]
    try:
        # SIGTERM stops it as it stops any worker: handlers finish, the command returns.
        call_command("runscheduler", *args, stdout=sys.stderr, stderr=sys.stderr)
    finally:
        stop.set()
        threads[0].join(timeout=2.0)
    print("adapter: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
