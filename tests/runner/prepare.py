"""Before the legs: the venvs, the checks (migrations, linters, the package) and which legs can run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import devenv
from .legs import LEGS, POOLER_TEST_DATABASE, RESTART_ENV, SHARD_ENV, Leg
from .results import Result

ROOT = devenv.ROOT
PG_PROBE = (
    "import psycopg; psycopg.connect(host='127.0.0.1', port=5432, user='postgres', dbname='postgres',"
    " connect_timeout=5).close()"
)
MARIADB_PROBE = (
    "import MySQLdb; MySQLdb.connect(host='127.0.0.1', port=3306, user='root', passwd='',"
    " connect_timeout=5).close()"
)
# PYTHONDONTWRITEBYTECODE would have every worker process the tests start compile the
# package again, and pytest rewrite every test module on each run. What selects a leg's tests
# and options is the leg's to set, never inherited (a pytest run of the runner's own tests
# inside a share would otherwise run every leg it fakes as that share).
DROPPED_ENV = (
    "DATABASE_URL",
    "VIRTUAL_ENV",
    "PYTHONHOME",
    "PYTHONDONTWRITEBYTECODE",
    *{name for leg in LEGS for name, _ in leg.env},
    SHARD_ENV,
    RESTART_ENV,
)


def say(message: str) -> None:
    print(f"[run.py] {message}", flush=True)


def banner(text: str) -> None:
    print(f"\n{'=' * 20} {text} {'=' * max(0, 58 - len(text))}", flush=True)


def leg_env(url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env.setdefault("DSCH_ARTIFACTS", str(ROOT / ".ci" / "artifacts"))  # the browser tests' screenshots
    if url:
        env["DATABASE_URL"] = url
    return env


def build_venvs(
    legs: list[Leg], install_system_deps: bool
) -> tuple[dict[str, devenv.Venv], dict[str, tuple[str, str]]]:
    """The venvs the legs need, built side by side (a fresh clone spends most of a minute in pip
    for each): {key: venv}, and {key: (its legs' status, why)} for those that could not be."""
    venvs: dict[str, devenv.Venv] = {}
    unavailable: dict[str, tuple[str, str]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        builds = {"default": pool.submit(devenv.ensure_default_venv, install_system_deps=install_system_deps)}
        if any(leg.venv == "dj6" for leg in legs):
            base = devenv.find_python()
            if base is None:
                wanted = " or ".join(f"{a}.{b}" for a, b in devenv.DJ6_PYTHONS)
                unavailable["dj6"] = ("skipped", f"no Python {wanted} found")
                say(f"no Python {wanted} on PATH or in pyenv: no Django 6 legs")
            else:
                builds["dj6"] = pool.submit(
                    devenv.ensure_venv, devenv.DJ6_VENV, base, install_system_deps=install_system_deps
                )
    for name, build in builds.items():
        try:
            venvs[name] = build.result()
        except devenv.SetupError as exc:
            unavailable[name] = ("failed", str(exc))
    for venv in venvs.values():
        say(f"{venv.path.name}: Python {venv.python_version}, Django {venv.django_version}")
    return venvs, unavailable


def timed_check(name: str, venv: devenv.Venv, cmd: list[str], database: str = "-") -> Result:
    banner(name)
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    code = subprocess.call(cmd, cwd=ROOT, env=leg_env(None))
    return Result(
        name=name,
        python=venv.python_version,
        django=venv.django_version,
        database=database,
        status="passed" if code == 0 else "failed",
        why="" if code == 0 else f"exit {code}",
        seconds=time.monotonic() - start,
    )


def checks(venvs: dict[str, devenv.Venv], lint: bool) -> list[Result]:
    """``makemigrations --check`` in every venv, then (``lint``) ruff and mypy in the default one."""
    done = []
    for venv in venvs.values():
        cmd = [str(venv.python), "-m", "django", "makemigrations", "--check", "--dry-run"]
        name = f"makemigrations --check (Django {venv.django_version})"
        done.append(timed_check(name, venv, cmd, "sqlite"))
    if "default" in venvs and lint:
        venv = venvs["default"]
        py = str(venv.python)
        for name, cmd in (
            ("ruff check", [py, "-m", "ruff", "check", "."]),
            ("ruff format --check", [py, "-m", "ruff", "format", "--check", "."]),
            ("mypy", [py, "-m", "mypy", "django_durable_scheduler"]),
        ):
            done.append(timed_check(name, venv, cmd))
    return done


def package_check(builder: devenv.Venv, target: devenv.Venv | None) -> Result:
    """Build the sdist and wheel with ``builder``, check them, and install the wheel into
    ``target`` (the Django 6 venv, if there is one) with the tests staged beside it."""
    banner("package: build, twine check, install the wheel")
    check = Result("package (build, twine check, wheel)", builder.python_version, builder.django_version)
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as outdir:
            wheel = devenv.build_package(builder.python, Path(outdir))
            say(f"built {wheel.name}")
            if target is not None:
                devenv.install_wheel(target, wheel)
                say(f"{target.path.name} now runs {wheel.name}")
        stage = devenv.stage_tests()
        if target is not None:
            where = devenv.imported_from(target, stage)
            if where == ROOT / devenv.PACKAGE or where.is_relative_to(stage):
                raise devenv.SetupError(f"the tests would import the source at {where}, not the wheel")
            say(f"the tests import {devenv.PACKAGE} from {where}")
        check.status = "passed"
    except devenv.SetupError as exc:
        check.status, check.why = "failed", str(exc)
        say(str(exc))
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


def why_not(leg: Leg, venv: devenv.Venv, probes: dict[tuple[str, str], str | None]) -> str | None:
    """Why ``leg`` cannot run in ``venv`` (no driver, its server does not answer), else None.
    ``probes`` keeps each (venv, server) answer, asked once."""
    if leg.database == "mariadb" and not venv.mysql:
        return venv.mysql_error
    if leg.database == "sqlite":
        return None
    key = (leg.venv, leg.database)
    if key not in probes:
        probes[key] = probe(venv.python, PG_PROBE if leg.database == "postgres" else MARIADB_PROBE)
    if probes[key] is None:
        return None
    return f"{leg.database} at 127.0.0.1 does not answer: {probes[key]}"


def runnable(
    legs: list[Leg],
    venvs: dict[str, devenv.Venv],
    unavailable: dict[str, tuple[str, str]],
    wheel_failed: str,
) -> tuple[list[Result], list[tuple[Leg, Result, devenv.Venv]]]:
    """A result for every leg, and the legs that can run with theirs and their venv."""
    results: list[Result] = []
    ready: list[tuple[Leg, Result, devenv.Venv]] = []
    probes: dict[tuple[str, str], str | None] = {}
    for leg in legs:
        result = Result(name=leg.name, database=leg.database)
        results.append(result)
        venv = venvs.get(leg.venv)
        if venv is None:
            result.status, result.why = unavailable[leg.venv]
            continue
        result.python, result.django = venv.python_version, venv.django_version
        if leg.wheel and wheel_failed:
            result.status, result.why = "failed", f"no wheel to test: {wheel_failed}"
        elif why := why_not(leg, venv, probes):
            result.why = why
            say(f"skipping leg {leg.name}: {why}")
        else:
            ready.append((leg, result, venv))
    return results, ready


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


def pooler(
    ready: list[tuple[Leg, Result, devenv.Venv]], install_system_deps: bool, stack: contextlib.ExitStack
) -> None:
    """Start PgBouncer on ``stack`` for the pooled legs among ``ready``, or take them out of it
    (skipped, with why) when it cannot start."""
    pooled = [item for item in ready if item[0].pooler]
    if not pooled:
        return
    if install_system_deps:
        devenv.install_pgbouncer()
    python = pooled[0][2].python
    why = drop_pooler_database(python) or stack.enter_context(devenv.pgbouncer())
    if not why:
        stack.callback(drop_pooler_database, python)
        return
    for item in pooled:
        item[1].why = f"no PgBouncer: {why}"
        say(f"skipping leg {item[0].name}: {item[1].why}")
        ready.remove(item)
