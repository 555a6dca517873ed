"""The soak (PostgreSQL, ours only): a mixed load under fire for ``--minutes``, then an audit.

    python -m bench.soak [--minutes 30] [--url postgres://postgres@127.0.0.1:5432/dsch_soak]
                         [--steady 2] [--victims 2] [--rate 1] [--seed N] [--json FILE]

(``python3 bench/run.py --workloads soak --minutes 30`` runs it inside .venv-bench.) The database
is dropped and created here (names containing ``soak`` only) and kept at the end for a look
(``--drop`` drops it). ``--steady`` ``runscheduler`` processes run the whole time and
``--victims`` more are SIGKILLed at random every few seconds (``--kill-every``) and started
again at once. Meanwhile this process keeps enqueuing the mixed load (bench/soak_load.py),
restarts the PostgreSQL server once (at 40 % of the run, ``pg_ctlcluster ... restart``; not with
``--no-pg-restart``) and moves the clock every process reads (bench/soakapp/clock.py) across a
UTC midnight once (at 60 %), so that the events' day partitions roll over, and samples every
worker's resident set and connections. Then the load stops, the workers drain what is due and
are stopped with SIGTERM, and the audit (bench/soak_audit.py) prints each check with PASS or
FAIL; the exit status is 1 when any fails. tests/test_soak.py runs the same for two minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PG_URL = "postgres://postgres@127.0.0.1:5432/dsch_soak"
SAMPLE_EVERY = 2.0  # seconds between samples of memory, connections and running limits
STEPS_PER_SECOND = 10  # operations of the mix per second at --rate 1
PG_RESTART_AT, CLOCK_JUMP_AT = 0.4, 0.6  # shares of the run
# The clock starts this long before midnight, plus the time to the jump: setup and the workers'
# start take less, so the clock is still before midnight when it is moved past it.
CLOCK_LEAD = timedelta(seconds=60)
AFTER_MIDNIGHT = timedelta(seconds=30)  # where the jump sets the clock


def say(message: str) -> None:
    print(f"[soak] {message}", flush=True)


# --------------------------------------------------------------------------- database and server


def _admin_dsn(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if "soak" not in name:
        raise SystemExit(f"refusing to drop database {name!r}: the soak only drops names containing 'soak'")
    return urlunsplit(parts._replace(path="/postgres")), name


def fresh_database(url: str, *, drop_only: bool = False) -> None:
    import psycopg

    admin, name = _admin_dsn(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def pg_cluster() -> str:
    versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])
    return versions[-1]


def can_restart_pg() -> bool:
    return bool(shutil.which("pg_ctlcluster")) and Path("/etc/postgresql").is_dir()


def restart_pg() -> float:
    """Restart the local server (every connection to it dies); the seconds until it answers."""
    started = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", pg_cluster(), "main", "restart"],
        check=True,
        capture_output=True,
        timeout=180,
    )
    while subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"]).returncode != 0:
        if time.monotonic() - started > 180:
            raise RuntimeError("PostgreSQL did not come back within 180 s")
        time.sleep(0.2)
    return time.monotonic() - started


def setup_django(url: str, clock_file: Path) -> None:
    os.environ.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="bench.soak_settings",
        DSCH_SOAK_CLOCK=str(clock_file),
        DSCH_SOAK_APP="soak-driver",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def start_clock(clock_file: Path, seconds_to_jump: float) -> datetime:
    """Set the clock so that it reaches ``CLOCK_LEAD`` before a UTC midnight about when the
    jump is due; that midnight. Days ahead, past the partition of everything before migration
    0005 (which ends a day or two after today), so that the days on both sides of it have
    partitions of their own."""
    from bench.soakapp import clock
    from django_durable_scheduler.housekeeping.partitions import day_start

    midnight = day_start(datetime.now(UTC) + timedelta(days=5))
    clock.move_to(clock_file, midnight - CLOCK_LEAD - timedelta(seconds=seconds_to_jump))
    return midnight


# --------------------------------------------------------------------------- samples


def connections_by_app() -> dict[str, int] | None:
    """Connections to this database by application_name (a worker's id); None while the
    database does not answer."""
    from django.db import Error, connection, connections

    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() GROUP BY 1"
            )
            return dict(cursor.fetchall())
    except Error:
        connections.close_all()
        return None


def running_under_limits() -> dict[str, int] | None:
    """Runs holding an unexpired lease now, per limit: the most each limit allows at once."""
    from django.db import Error, connections
    from django.db.models import Count

    from django_durable_scheduler import conf
    from django_durable_scheduler.models import Occurrence

    try:
        held = Occurrence.objects.filter(status="running", lease_expires_at__gt=conf.now())
        found = {
            f"limited[{key}]": n
            for key, n in held.filter(job_id="limited").values_list("concurrency_key").annotate(n=Count("pk"))
        }
        found["joblimit"] = held.filter(job_id="joblimit").count()
        found["capped"] = held.filter(job_id="capped").count()
        return found
    except Error:
        connections.close_all()
        return None


def left_to_drain(now: datetime) -> int:
    """Occurrences running or due, and closed batches waiting for their completion: 0 once
    the workers have done all they can."""
    from django.db.models import Q

    from django_durable_scheduler.models import Batch, Occurrence

    busy = Occurrence.objects.filter(
        Q(status="running") | Q(status__in=["queued", "retry_wait"], available_at__lte=now)
    )
    return busy.count() + Batch.objects.filter(status="closed").count()


# --------------------------------------------------------------------------- the run


class Soak:
    """One run: the fleet, the load and the timeline of kills, the restart and the jump."""

    def __init__(self, args: argparse.Namespace, clock_file: Path, log_dir: Path) -> None:
        from bench.soak_fleet import Fleet
        from bench.soak_load import Load

        self.args = args
        self.clock_file = clock_file
        self.rng = random.Random(args.seed)
        self.load = Load(self.rng)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        self.fleet = Fleet(env, log_dir, concurrency=args.concurrency, lease=args.lease)
        self.limits_seen: dict[str, int] = {}
        self.events: dict[str, Any] = {"kills": []}
        self.midnight: datetime | None = None

    def start_workers(self) -> None:
        for n in range(self.args.steady):
            self.fleet.start(f"steady{n + 1}", steady=True)
        for n in range(self.args.victims):
            self.fleet.start(f"victim{n + 1}", steady=False)
        if not self.fleet.wait_in_loop():
            for incarnation in self.fleet.all:
                print(self.fleet.tail(incarnation), file=sys.stderr)
            raise SystemExit("the workers did not start")

    def sample(self) -> None:
        self.fleet.sample(connections_by_app())
        for limit, n in (running_under_limits() or {}).items():
            self.limits_seen[limit] = max(n, self.limits_seen.get(limit, 0))

    def load_phase(self, seconds: float) -> None:
        """The mixed load for ``seconds``, with the kills, the restart and the jump on time."""
        from bench.soakapp import clock

        t0 = self.fleet.elapsed()
        next_kill = 5.0
        next_sample = 0.0
        step = 1.0 / (STEPS_PER_SECOND * self.args.rate)
        while (t := self.fleet.elapsed() - t0) < seconds:
            if self.args.victims and t >= next_kill:
                slot = self.rng.choice([s for s in self.fleet.slots if s.startswith("victim")])
                self.events["kills"].append([round(t, 1), self.fleet.kill_and_restart(slot)])
                next_kill = t + self.args.kill_every * self.rng.uniform(0.5, 1.5)
            if (
                "pg_restart" not in self.events
                and t >= PG_RESTART_AT * seconds
                and not self.args.no_pg_restart
            ):
                say(f"restarting PostgreSQL at {t:.0f} s")
                self.events["pg_restart"] = {"at": round(t, 1), "seconds": round(restart_pg(), 2)}
                say(f"PostgreSQL answers again after {self.events['pg_restart']['seconds']} s")
            if "clock_jump" not in self.events and t >= CLOCK_JUMP_AT * seconds:
                self.jump(t, clock)
            if t >= next_sample:
                self.sample()
                next_sample = t + SAMPLE_EVERY
            began = time.monotonic()
            self.load.step()
            time.sleep(max(0.0, step - (time.monotonic() - began)))
        self.events["load_window"] = [round(t0, 1), round(self.fleet.elapsed(), 1)]

    def jump(self, t: float, clock: Any) -> None:
        from django_durable_scheduler import conf

        before = conf.now()
        assert self.midnight is not None
        offset = clock.move_to(self.clock_file, self.midnight + AFTER_MIDNIGHT)
        after = conf.now()
        self.events["clock_jump"] = {
            "at": round(t, 1),
            "from": before.isoformat(),
            "to": after.isoformat(),
            "seconds": round((after - before).total_seconds(), 1),
            "offset_ms": offset,
        }
        say(f"clock moved from {before:%Y-%m-%d %H:%M:%S} to {after:%Y-%m-%d %H:%M:%S} at {t:.0f} s")

    def drain(self, stall: float) -> float:
        """Wait until nothing is due or running (sampling on), for as long as the workers make
        progress: given up after ``stall`` seconds without any. The seconds it took."""
        from django.db import Error, connections

        from django_durable_scheduler import conf

        started = last_progress = last_said = time.monotonic()
        fewest: int | None = None
        while True:
            self.sample()
            try:
                left: int | None = left_to_drain(conf.now())
            except Error:
                connections.close_all()
                left = None
            now = time.monotonic()
            if left == 0:
                return now - started
            if left is not None and (fewest is None or left < fewest):
                fewest, last_progress = left, now
            self.events.setdefault("left_at_load_end", left)
            if now - last_progress > stall:
                say(f"no progress for {stall:.0f} s with {left} left: the audit will say what they are")
                return now - started
            if now - last_said >= 30:
                say(f"draining: {left} left after {now - started:.0f} s")
                last_said = now
            time.sleep(1.0)

    def stop(self) -> dict[str, int]:
        """SIGTERM every worker; then the connections left after they exited (none expected),
        looked at for up to 10 s while the server notices closed sockets."""
        self.fleet.stop()
        deadline = time.monotonic() + 10
        while True:
            left = {
                app: n
                for app, n in (connections_by_app() or {}).items()
                if app.startswith("soak-") and app != "soak-driver"
            }
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole soak and its audit; the audit's checks and the run's figures."""
    seconds = args.minutes * 60
    work = Path(tempfile.mkdtemp(prefix="dsch-soak-"))
    clock_file = work / "clock"
    say(f"fresh database {urlsplit(args.url).path.lstrip('/')}; worker logs in {work}")
    fresh_database(args.url)
    setup_django(args.url, clock_file)
    soak = Soak(args, clock_file, work)
    soak.midnight = start_clock(clock_file, CLOCK_JUMP_AT * seconds)
    return execute(soak, seconds, work)


def execute(soak: Soak, seconds: float, work: Path) -> dict[str, Any]:
    from bench import soak_audit
    from bench.soak_load import create_world
    from django_durable_scheduler import conf
    from django_durable_scheduler.housekeeping import partitions

    args = soak.args
    create_world()
    partitions.ensure_ahead("default", conf.now())
    try:
        soak.start_workers()
        started_at = conf.now()
        say(
            f"load for {args.minutes} min: {args.steady} steady and {args.victims} victim workers,"
            f" seed {args.seed}"
        )
        soak.load_phase(seconds)
        say(f"load stopped; {len(soak.load.enqueued)} occurrences enqueued; draining")
        drain_seconds = soak.drain(max(120.0, 6 * args.lease))
        stopped_at = conf.now()
        connections_left = soak.stop()
    finally:
        soak.fleet.kill_all()
    figures = {
        "started_at": started_at.isoformat(),
        "stopped_at": stopped_at.isoformat(),
        "drain_seconds": round(drain_seconds, 1),
        "enqueue_calls": dict(soak.load.counts),
        "enqueue_errors": dict(soak.load.errors),
        "limits_seen": soak.limits_seen,
        "connections_left": connections_left,
        **soak.events,
    }
    checks = soak_audit.audit(
        enqueued=soak.load.enqueued,
        stopped_at=stopped_at,
        midnight=soak.midnight,
        workers=soak.fleet.report(),
        figures=figures,
        restarted=not args.no_pg_restart,
    )
    return {
        "checks": [c.as_dict() for c in checks],
        "figures": figures,
        "workers": soak.fleet.report(),
        "logs": str(work),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load runs (default 30)")
    parser.add_argument(
        "--url", default=PG_URL, help="PostgreSQL database, dropped and created (a name with 'soak')"
    )
    parser.add_argument("--steady", type=int, default=2, help="workers never killed (default 2)")
    parser.add_argument("--victims", type=int, default=2, help="workers SIGKILLed and restarted (default 2)")
    parser.add_argument("--concurrency", type=int, default=4, help="handler threads per worker (default 4)")
    parser.add_argument("--lease", type=float, default=10.0, help="the workers' lease, seconds (default 10)")
    parser.add_argument(
        "--kill-every", type=float, default=5.0, help="mean seconds between kills (default 5)"
    )
    parser.add_argument(
        "--rate", type=float, default=1.0, help=f"load: {STEPS_PER_SECOND} x RATE operations/s"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a random one, printed)")
    parser.add_argument("--no-pg-restart", action="store_true", help="do not restart the PostgreSQL server")
    parser.add_argument("--json", default=None, help="write the checks and figures to this file")
    parser.add_argument("--drop", action="store_true", help="drop the database at the end")
    return parser


def main(argv: list[str]) -> int:
    from bench import soak_audit

    args = _parser().parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    if not args.no_pg_restart and not can_restart_pg():
        raise SystemExit(
            "no local cluster for pg_ctlcluster: pass --no-pg-restart to run without the restart"
        )
    result = run(args)
    soak_audit.print_report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    if args.drop:
        from django.db import connections

        connections.close_all()
        fresh_database(args.url, drop_only=True)
    return 0 if all(c["ok"] for c in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
