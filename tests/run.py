#!/usr/bin/env python3
"""Run the whole test matrix: ``python3 tests/run.py [options] [-- pytest arguments]``.

Standard library only. Builds ``.venv`` (this Python, Django 5.2) and ``.venv-dj6`` (Python 3.13 or
3.12, Django 6), runs the migration check and the linters, then pytest on each leg. On a machine
with two cores or more two pytest processes run side by side (``--jobs``), each leg in parts: two
shares of its test modules and, on PostgreSQL, the tests marked ``restarts_database_server``
apart, with the server to themselves (see ``leg_parts``). The legs:

    sqlite        Python 3.11 + Django 5.2 + SQLite file
    postgres      Python 3.11 + Django 5.2 + PostgreSQL  postgres://postgres@127.0.0.1:5432/dsch
    mariadb       Python 3.11 + Django 5.2 + MariaDB     mysql://root@127.0.0.1:3306/dsch
    dj6-sqlite    Python 3.13 + Django 6   + SQLite file (the modules where SQLite and the
                  Django or Python version meet: see LEGS)
    dj6-postgres  Python 3.13 + Django 6   + PostgreSQL  postgres://postgres@127.0.0.1:5432/dsch6
                  (with server-side binding and prepared statements: DSCH_PG_PREPARED=1)

The Django 6 legs test the package as users get it: the sdist and wheel are built
(``python -m build``) and checked (``twine check``, and that the wheel holds every file of the
package), the wheel replaces ``.venv-dj6``'s editable install, and pytest runs from a copy of
``tests/`` in ``.wheel-tests/``, where no source of the package can shadow it.

A leg whose database server does not answer is skipped (a failure with ``--require-all``).
The last line printed is ``N passed, M failed`` summed over the legs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any


def _load_devenv() -> ModuleType:
    path = Path(__file__).resolve().parent / "devenv.py"
    spec = importlib.util.spec_from_file_location("durable_scheduler_devenv", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


devenv = _load_devenv()
ROOT: Path = devenv.ROOT

PG_PROBE = (
    "import psycopg; psycopg.connect(host='127.0.0.1', port=5432, user='postgres', dbname='postgres',"
    " connect_timeout=5).close()"
)
MARIADB_PROBE = (
    "import MySQLdb; MySQLdb.connect(host='127.0.0.1', port=3306, user='root', passwd='',"
    " connect_timeout=5).close()"
)
LEG_TIMEOUT = 25 * 60
# A leg keeps about one core busy (pytest, the database server and the tests' worker processes
# together, mostly waiting on each other), so two legs side by side fit a two-core machine.
JOBS = max(1, min(2, os.cpu_count() or 1))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# pytest's closing line, e.g. "==== 1 failed, 12 passed, 1 skipped in 3.21s ====" (or without "=" under -q).
SUMMARY_LINE = re.compile(r"^=*\s*(?P<body>.*\bin [\d.]+s\b.*?)\s*=*$")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")


@dataclass(frozen=True)
class Leg:
    name: str
    venv: str  # "default" or "dj6"
    database: str  # "sqlite", "postgres" or "mariadb"
    url: str | None  # DATABASE_URL; None leaves tests/settings.py on its SQLite file
    env: tuple[tuple[str, str], ...] = ()  # more environment for its pytest runs
    wheel: bool = False  # runs against the built wheel, from devenv.WHEEL_STAGE
    tests: tuple[str, ...] = ()  # a leg of these pytest arguments only (test modules), in one part
    pooler: bool = False  # through devenv.pgbouncer(), in transaction mode


# Slowest first (as measured in CI): with legs side by side, the last to start is a short one.
LEG_ORDER = ("postgres", "mariadb", "dj6-postgres", "sqlite", "dj6-sqlite", "pgbouncer")
# With legs side by side, each leg runs in parts that tests/conftest.py selects from the
# environment: its share SHARD_ENV=1 or 2 of the test modules (tests/conftest.py's
# FIRST_SHARE and the rest, so that the lanes end
# together), and, on the servers in RESTARTED, the tests marked restarts_database_server
# (tests/test_crash.py stops PostgreSQL) apart, with the server to themselves, the rest of
# the leg beside other legs. Parts of one leg never run at once (one test database).
RESTARTED = frozenset({"postgres"})
RESTART_ENV = "DSCH_SERVER_RESTART_TESTS"
SHARD_ENV = "DSCH_TEST_SHARD"
RAN = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


@dataclass(frozen=True)
class Part:
    """One pytest run of a leg: all of it, or a share (``share``) selected by ``env``."""

    title: str = ""
    env: tuple[tuple[str, str], ...] = ()
    exclusive: bool = False  # needs the leg's database server to itself
    order: int = 0  # parts of a lower order start first

    @property
    def share(self) -> bool:
        return bool(self.env)


def leg_parts(leg: Leg, jobs: int) -> list[Part]:
    if jobs == 1 or leg.tests:
        return [Part()]
    parts: list[Part] = []
    shared: tuple[tuple[str, str], ...] = ()
    if leg.database in RESTARTED:
        parts.append(Part(" (server restart)", ((RESTART_ENV, "only"),), exclusive=True))
        shared = ((RESTART_ENV, "skip"),)
    for n in (1, 2):
        parts.append(Part(f" (part {n} of 2)", ((SHARD_ENV, str(n)), *shared), order=n))
    return parts


# The pytest processes running now, so that Ctrl-C can stop them all.
RUNNING: set[subprocess.Popen[bytes]] = set()

LEGS = (
    Leg("sqlite", "default", "sqlite", None),
    Leg("postgres", "default", "postgres", "postgres://postgres@127.0.0.1:5432/dsch"),
    Leg("mariadb", "default", "mariadb", "mysql://root@127.0.0.1:3306/dsch"),
    # Django 6 runs the whole suite on PostgreSQL (below); on SQLite, what depends on SQLite
    # and on the Django or Python version: migrations and schema changes (SQLite remakes
    # tables as each Django version does), the admin in a browser, the README's quickstart,
    # the example project, wake-ups, the worker, django.tasks, and the tests that run on
    # SQLite only. (The rest would repeat the dj6-postgres leg's work with nothing new.)
    Leg(
        "dj6-sqlite",
        "dj6",
        "sqlite",
        None,
        wheel=True,
        tests=tuple(
            f"tests/test_{name}.py"
            for name in (
                "migrations",
                "schema_change",
                "unmigrated",
                "admin",
                "admin_browser",
                "dashboard",
                "readme",
                "example_project",
                "triggers_property",
                "constraints",
                "notify",
                "wakeups",
                "runscheduler",
                "worker",
                "kernel",
                "tasks_backend",
            )
        ),
    ),
    # With the PostgreSQL OPTIONS the README suggests (server-side binding, prepared statements),
    # so that both ways of talking to PostgreSQL are tested.
    Leg(
        "dj6-postgres",
        "dj6",
        "postgres",
        "postgres://postgres@127.0.0.1:5432/dsch6",
        (("DSCH_PG_PREPARED", "1"),),
        wheel=True,
    ),
    # The worker through a real PgBouncer in transaction mode (what most PostgreSQL deployments
    # put in front): wake-ups, a drain by several processes, crash recovery. The test database
    # is created and dropped beside the pooler (see pooler_database), so pytest reuses it.
    Leg(
        "pgbouncer",
        "default",
        "postgres",
        f"postgres://postgres@127.0.0.1:{devenv.PGBOUNCER_PORT}/dschpool",
        (("DSCH_POOLER", "pgbouncer"), (RESTART_ENV, "skip")),
        tests=("--reuse-db", "tests/test_pooler.py", "tests/test_crash.py"),
        pooler=True,
    ),
)
POOLER_TEST_DATABASE = "test_dschpool"


@dataclass
class Result:
    name: str
    python: str = "-"
    django: str = "-"
    database: str = "-"
    status: str = "skipped"  # passed, failed or skipped
    why: str = ""
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def result_text(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts.items() if k != "deselected")
        details = "; ".join(text for text in (counts, self.why) if text)
        return f"{self.status} ({details})" if details else self.status


def banner(text: str) -> None:
    print(f"\n{'=' * 20} {text} {'=' * max(0, 58 - len(text))}", flush=True)


# PYTHONDONTWRITEBYTECODE would have every worker process the tests start compile the
# package again, and pytest rewrite every test module on each run.
DROPPED_ENV = ("DATABASE_URL", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")


def leg_env(url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env.setdefault("DSCH_ARTIFACTS", str(ROOT / ".ci" / "artifacts"))  # the browser tests' screenshots
    if url:
        env["DATABASE_URL"] = url
    return env


def timed_check(name: str, cmd: list[str], env: dict[str, str] | None = None) -> Result:
    banner(name)
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    start = time.monotonic()
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    return Result(
        name=name,
        status="passed" if code == 0 else "failed",
        why="" if code == 0 else f"exit {code}",
        seconds=time.monotonic() - start,
    )


def package_check(builder: Any, target: Any) -> Result:
    """Build the sdist and wheel with ``builder`` (a devenv.Venv), check them, and install the
    wheel into ``target`` (the Django 6 venv, if there is one) with the tests staged beside it."""
    banner("package: build, twine check, install the wheel")
    check = Result(name="package (build, twine check, wheel)", python=builder.python_version)
    check.django, check.database = builder.django_version, "-"
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as outdir:
            wheel = devenv.build_package(builder.python, Path(outdir))
            print(f"[run.py] built {wheel.name}", flush=True)
            if target is not None:
                devenv.install_wheel(target, wheel)
                print(f"[run.py] {target.path.name} now runs {wheel.name}", flush=True)
        stage = devenv.stage_tests()
        if target is not None:
            where = devenv.imported_from(target, stage)
            if where == ROOT / devenv.PACKAGE or where.is_relative_to(stage):
                raise devenv.SetupError(f"the tests would import the source at {where}, not the wheel")
            print(f"[run.py] the tests import {devenv.PACKAGE} from {where}", flush=True)
        check.status = "passed"
    except devenv.SetupError as exc:
        check.status, check.why = "failed", str(exc)
        print(f"[run.py] {exc}", flush=True)
    check.seconds = time.monotonic() - start
    return check


def probe(python: Path, script: str) -> str | None:
    """None when the server answers, else the last line of the error."""
    try:
        proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no answer within 30 s"
    if proc.returncode == 0:
        return None
    # The exception line of the traceback: the last one that is not indented (psycopg adds a hint below).
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line[:1].strip()]
    return lines[-1] if lines else f"exit {proc.returncode}"


def drop_pooler_database(python: Path) -> str | None:
    """Drop the pgbouncer leg's test database on PostgreSQL itself (not through the pooler,
    whose idle server connections would keep it open): before the leg, so that it starts
    afresh, and after the pooler has stopped. None when done, else why not."""
    script = (
        "import psycopg; psycopg.connect(host='127.0.0.1', port=5432, user='postgres', dbname='postgres',"
        " connect_timeout=5, autocommit=True)"
        f".execute('DROP DATABASE IF EXISTS {POOLER_TEST_DATABASE} WITH (FORCE)')"
    )
    return probe(python, script)


def run_pytest(
    python: Path, env: dict[str, str], args: list[str], timeout: float, *, echo: bool = True, cwd: Path = ROOT
) -> tuple[int, str, list[bytes]]:
    """Run pytest in its own process group; return (exit code, closing line, output).

    ``echo``: copy its output to ours as it comes (one leg at a time); otherwise keep it all and
    return it, for the caller to print whole when the leg is over (legs running side by side).
    """
    # The slowest tests of each part are listed, to keep the suite's time in view.
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "--durations=15"]
    if sys.stdout.isatty() and echo:
        cmd.append("--color=yes")
    cmd += args
    command_line = "$ " + " ".join(cmd)
    if echo:
        print(command_line, flush=True)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # so a timeout or Ctrl-C can end its worker subprocesses too
    )
    RUNNING.add(proc)
    output: list[bytes] = [] if echo else [(command_line + "\n").encode()]
    tail: deque[str] = deque(maxlen=50)

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            if echo:
                sys.stdout.buffer.write(raw)
                sys.stdout.flush()
            else:
                output.append(raw)
            tail.append(ANSI.sub("", raw.decode(errors="replace")).strip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        output.append(f"\n[run.py] leg exceeded {timeout / 60:.0f} min: stopping it\n".encode())
        if echo:
            print(output[-1].decode().strip(), flush=True)
        stop_group(proc)
        code = -1
    finally:
        RUNNING.discard(proc)
    reader.join(timeout=10)
    matches = (SUMMARY_LINE.match(line) for line in reversed(tail))
    return code, next((m["body"] for m in matches if m), ""), output


def record(result: Result, part: Part, code: int, closing: str, seconds: float, timeout_min: float) -> bool:
    """Add one pytest run (a whole leg, or one of its parts) to the leg's result; whether it passed."""
    result.seconds += seconds
    for key, number in parse_counts(closing).items():
        result.counts[key] = result.counts.get(key, 0) + number
    # A part may select nothing (-k, a leg without server-restart tests); the whole leg may not.
    passed = code == 0 or (code == 5 and part.share)
    if passed:
        why = ""
    elif code == -1:
        why = f"timed out after {timeout_min:.0f} min"
    else:
        why = "no tests collected" if code == 5 else f"pytest exit {code}"
    if why and closing:
        why = f"{why}; {closing}"
    if why:
        why = f"{part.title.strip(' ()')}: {why}" if part.share else why
        result.why = f"{result.why}; {why}" if result.why else why
    if result.status != "failed":
        result.status = "passed" if passed else "failed"
    return passed


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGINT, 10), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def parse_counts(closing: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for number, word in COUNT.findall(closing):
        key = "error" if word.startswith("error") else word
        counts[key] = counts.get(key, 0) + int(number)
    return counts


def print_table(rows: list[Result], title: str) -> None:
    headers = ("leg", "python", "django", "database", "result", "duration")
    table = [(r.name, r.python, r.django, r.database, r.result_text, f"{r.seconds:6.1f} s") for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print(f"\n{title}")
    for row in (headers, tuple("-" * w for w in widths), *table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python3 tests/run.py",
        description="Build the venvs, lint, and run pytest on every database and Django version.",
        epilog="Arguments after -- go to pytest, e.g.: python3 tests/run.py --legs sqlite -- -k identity",
    )
    parser.add_argument(
        "--legs",
        default=",".join(leg.name for leg in LEGS),
        help="comma-separated legs to run (default: all): " + ",".join(leg.name for leg in LEGS),
    )
    parser.add_argument(
        "--require-all", action="store_true", help="a leg that cannot run (no server, no Python) fails"
    )
    parser.add_argument(
        "--install-system-deps",
        action="store_true",
        help="apt-get install libmariadb-dev pkg-config when missing (root only)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=JOBS,
        help="legs run side by side (default %(default)s; 1 runs them one after another, output live)",
    )
    parser.add_argument("--no-lint", action="store_true", help="skip ruff and mypy")
    parser.add_argument(
        "--leg-timeout", type=float, default=LEG_TIMEOUT / 60, help="minutes per leg (default %(default)s)"
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.legs.split(",") if n.strip()]
    unknown = sorted(set(names) - {leg.name for leg in LEGS})
    if unknown or not names:
        parser.error(f"unknown legs {unknown}; choose from {', '.join(leg.name for leg in LEGS)}")
    args.legs = [leg for leg in LEGS if leg.name in names]
    return args, pytest_args


def main(argv: list[str]) -> int:
    args, pytest_args = parse_args(argv)
    started = time.monotonic()
    checks: list[Result] = []
    results: list[Result] = []
    venvs: dict[str, devenv.Venv] = {}
    unavailable: dict[str, tuple[str, str]] = {}  # venv key -> (leg status, why)

    banner("virtualenvs")
    # Both venvs are built side by side (a fresh clone spends most of a minute in pip for each).
    with ThreadPoolExecutor(max_workers=2) as pool:
        builds = {
            "default": pool.submit(devenv.ensure_default_venv, install_system_deps=args.install_system_deps)
        }
        if any(leg.venv == "dj6" for leg in args.legs):
            base = devenv.find_python()
            if base is None:
                wanted = " or ".join(f"{a}.{b}" for a, b in devenv.DJ6_PYTHONS)
                unavailable["dj6"] = ("skipped", f"no Python {wanted} found")
                print(f"[run.py] no Python {wanted} on PATH or in pyenv: no Django 6 legs", flush=True)
            else:
                builds["dj6"] = pool.submit(
                    devenv.ensure_venv, devenv.DJ6_VENV, base, install_system_deps=args.install_system_deps
                )
    for name, build in builds.items():
        try:
            venvs[name] = build.result()
        except devenv.SetupError as exc:
            unavailable[name] = ("failed", str(exc))
    for venv in venvs.values():
        print(f"[run.py] {venv.path.name}: Python {venv.python_version}, Django {venv.django_version}")
        cmd = [str(venv.python), "-m", "django", "makemigrations", "--check", "--dry-run"]
        check = timed_check(f"makemigrations --check (Django {venv.django_version})", cmd, leg_env(None))
        check.python, check.django, check.database = venv.python_version, venv.django_version, "sqlite"
        checks.append(check)
    if "default" in venvs and not args.no_lint:
        py = str(venvs["default"].python)
        for name, cmd in (
            ("ruff check", [py, "-m", "ruff", "check", "."]),
            ("ruff format --check", [py, "-m", "ruff", "format", "--check", "."]),
            ("mypy", [py, "-m", "mypy", "django_durable_scheduler"]),
        ):
            check = timed_check(name, cmd, leg_env(None))
            check.python, check.django = venvs["default"].python_version, venvs["default"].django_version
            checks.append(check)

    wheel_failed = ""
    if "default" in venvs and any(leg.wheel for leg in args.legs):
        check = package_check(venvs["default"], venvs.get("dj6"))
        checks.append(check)
        wheel_failed = check.why if check.status == "failed" else ""

    probes: dict[tuple[str, str], str | None] = {}
    runnable: list[tuple[Leg, Result, Any]] = []  # (leg, its result, its devenv.Venv)
    for leg in args.legs:
        result = Result(name=leg.name, database=leg.database)
        results.append(result)
        venv = venvs.get(leg.venv)
        if venv is None:
            result.status, result.why = unavailable[leg.venv]
            continue
        result.python, result.django = venv.python_version, venv.django_version
        if leg.wheel and wheel_failed:
            result.status, result.why = "failed", f"no wheel to test: {wheel_failed}"
            continue
        if leg.database == "mariadb" and not venv.mysql:
            result.why = venv.mysql_error
            continue
        if leg.database != "sqlite":
            script = PG_PROBE if leg.database == "postgres" else MARIADB_PROBE
            key = (leg.venv, leg.database)
            if key not in probes:
                probes[key] = probe(venv.python, script)
            if probes[key] is not None:
                result.why = f"{leg.database} at 127.0.0.1 does not answer: {probes[key]}"
                print(f"[run.py] skipping leg {leg.name}: {result.why}", flush=True)
                continue
        runnable.append((leg, result, venv))

    stack = contextlib.ExitStack()
    pooled = [(leg, result, venv) for leg, result, venv in runnable if leg.pooler]
    if pooled:
        if args.install_system_deps:
            devenv.install_pgbouncer()
        why = drop_pooler_database(pooled[0][2].python) or stack.enter_context(devenv.pgbouncer())
        if why:
            for item in pooled:
                item[1].why = f"no PgBouncer: {why}"
                print(f"[run.py] skipping leg {item[0].name}: {item[1].why}", flush=True)
                runnable.remove(item)
        else:
            stack.callback(drop_pooler_database, pooled[0][2].python)
    with stack:
        run_legs(args, runnable, pytest_args, started)
    return summarize(args, results, checks, started)


def run_legs(
    args: argparse.Namespace, runnable: list[tuple[Leg, Result, Any]], pytest_args: list[str], started: float
) -> None:
    """Run the legs' parts, ``args.jobs`` at a time."""
    jobs = max(1, min(args.jobs, len(runnable)))
    parts = [(leg, result, venv, part) for leg, result, venv in runnable for part in leg_parts(leg, jobs)]
    if jobs > 1:
        print(
            f"\n[run.py] {len(runnable)} legs in {len(parts)} parts, {jobs} at a time;"
            " each part's output follows when it ends",
            flush=True,
        )
    # The short server-restart parts first (they wait for nothing then), then the first shares
    # of the longest legs, so that the last to start are short ones.
    queue = sorted(parts, key=lambda item: (item[3].order, LEG_ORDER.index(item[0].name)))
    running: list[tuple[Leg, Part]] = []
    queue_lock = threading.Condition()

    def may_start(leg: Leg, part: Part) -> bool:
        # Two parts of one leg would share its test database.
        if any(other.name == leg.name for other, _ in running):
            return False
        if leg.database == "sqlite":
            return True
        now = [other for each, other in running if each.database == leg.database]
        return not now if part.exclusive else not any(other.exclusive for other in now)

    def next_part() -> tuple[Leg, Result, Any, Part] | None:
        with queue_lock:
            while queue:
                for item in queue:
                    if may_start(item[0], item[3]):
                        queue.remove(item)
                        running.append((item[0], item[3]))
                        return item
                queue_lock.wait()
            return None

    def part_done(leg: Leg, part: Part) -> None:
        with queue_lock:
            running.remove((leg, part))
            queue_lock.notify_all()

    print_lock = threading.Lock()

    def lane() -> None:
        while (item := next_part()) is not None:
            leg, result, venv, part = item
            title = f"leg {leg.name}{part.title}: Python {venv.python_version}"
            title += f", Django {venv.django_version}, {leg.database}"
            if jobs == 1:
                banner(title)
            else:
                with print_lock:
                    elapsed = time.monotonic() - started
                    print(f"[run.py] {elapsed:6.1f} s: leg {leg.name}{part.title} starts", flush=True)
            start = time.monotonic()
            try:
                code, closing, output = run_pytest(
                    venv.python,
                    {**leg_env(leg.url), **dict(leg.env), **dict(part.env)},
                    [*pytest_args, *leg.tests],
                    args.leg_timeout * 60,
                    echo=jobs == 1,
                    cwd=devenv.WHEEL_STAGE if leg.wheel else ROOT,
                )
            finally:
                part_done(leg, part)
            seconds = time.monotonic() - start
            with print_lock:
                passed = record(result, part, code, closing, seconds, args.leg_timeout)
                if jobs > 1:
                    banner(f"{title} ({'passed' if passed else 'failed'}, {seconds:.1f} s)")
                    sys.stdout.buffer.write(b"".join(output))
                    sys.stdout.flush()

    lanes = [threading.Thread(target=lane, name=f"lane-{n}", daemon=True) for n in range(jobs)]
    for thread in lanes:
        thread.start()
    try:
        for thread in lanes:
            while thread.is_alive():
                thread.join(timeout=1)
    except KeyboardInterrupt:
        with queue_lock:
            queue.clear()
        for proc in list(RUNNING):
            stop_group(proc)
        raise


def summarize(args: argparse.Namespace, results: list[Result], checks: list[Result], started: float) -> int:
    for result in results:
        if result.status == "passed" and not any(result.counts.get(k) for k in RAN):
            result.status = "failed"
            result.why = f"no tests collected; {result.why}" if result.why else "no tests collected"

    if args.require_all:
        for result in results:
            if result.status == "skipped":
                result.status = "failed"
                result.why = f"required: {result.why}"

    banner("summary")
    if checks:
        print_table(checks, "checks")
    print_table(results, "legs")
    print(f"\ntotal {time.monotonic() - started:.1f} s")
    ran = [r for r in results if r.status != "skipped"]
    failed = [r.name for r in checks + results if r.status == "failed"]
    if not ran:
        print("[run.py] no leg ran: that is a failure")
        failed.append("(no leg ran)")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    passed_tests = sum(r.counts.get("passed", 0) for r in results)
    failed_tests = sum(r.counts.get("failed", 0) + r.counts.get("error", 0) for r in results)
    print(f"{passed_tests} passed, {failed_tests} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("\n[run.py] interrupted", file=sys.stderr)
        sys.exit(130)
