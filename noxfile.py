"""The test matrix, one nox session per leg (database x Django version), and the checks.

``python3 tests/run.py`` (the README's test command) installs nox and runs every session; with
nox at hand, ``nox -l`` lists them and ``nox -s sqlite -- -k kernel`` runs one with pytest
arguments. Inside a leg pytest-xdist spreads the test modules over the cores (``--dist
loadfile``: a module's tests share its fixtures and its worker's test database, test_dsch_gw0,
test_dsch_gw1, ...); the tests that stop the database server (marker
``restarts_database_server``) run after them, alone with the server.

A whole run of ``tests/run.py`` runs two lanes side by side, so that each fills the cores while
the other waits (installs, a leg's last module, mypy): ``lane-a``, the legs on PostgreSQL (tagged
``postgresql`` too: one test stops the server, so they run one after another) and dj6-sqlite,
which evens the lanes' lengths; ``lane-b``, the checks and the other legs.

A leg whose database server does not answer is skipped, or fails when every leg is required
(``DSCH_REQUIRE_ALL=1``, which ``tests/run.py --require-all`` sets, or ``CI=true``). Each leg
writes a JUnit report to ``.nox-reports/``, from which ``tests/run.py`` prints the closing line.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn
from xml.etree import ElementTree

import nox

ROOT = Path(__file__).resolve().parent
PACKAGE = "django_durable_scheduler"
REPORTS = ROOT / ".nox-reports"
DEV = nox.project.dependency_groups(nox.project.load_toml(ROOT / "pyproject.toml"), "dev")
DJANGO_52, DJANGO_6 = "django>=5.2,<6", "django>=6,<7"
PG = "postgres://postgres@127.0.0.1:5432"
PGBOUNCER_PORT = 6432
# The legs' databases are DB, DB6 and DBpool, their test databases test_DB_gw0... (another name
# keeps two checkouts apart on one server).
DB = os.environ.get("DSCH_DB_NAME", "dsch")
REQUIRE_ALL = os.environ.get("DSCH_REQUIRE_ALL") == "1" or os.environ.get("CI") == "true"
INSTALL_SYSTEM_DEPS = os.environ.get("DSCH_INSTALL_SYSTEM_DEPS") == "1"
# A leg keeps about a core busy per pytest worker, less while its tests wait on the processes
# they start: two workers on a two-core machine, more on a bigger one.
WORKERS = str(max(1, min(4, os.cpu_count() or 1)))

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = REQUIRE_ALL

# Django 6 on SQLite: what depends on SQLite and on the Django or Python version: migrations and
# schema changes (SQLite remakes tables as each Django version does), the admin in a browser,
# the README's quickstart, the example project, wake-ups, the worker, django.tasks, and the
# tests that run on SQLite only, and the testing toolkit (drain() in TestCase and pytest, the
# pytest plugin, django.tasks in the drain). The rest would repeat the sqlite leg with nothing new.
DJ6_SQLITE_MODULES = (
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
    "drain",
    "cases",
    "drain_tasks",
    "plugin",
    "example_tests",
)
# Django 6 on PostgreSQL, with server-side binding and prepared statements (DSCH_PG_PREPARED=1,
# what the README suggests without a pooler): where Django's version and PostgreSQL meet, not the
# whole suite again. Migrations and schema changes (the schema editor's SQL on each Django), the
# partitioned events table, the dialect's own SQL under prepared statements (claim plans and
# their EXPLAIN, claiming and authorizing in one transaction, the check constraints, the enqueue
# fast path's guarded insert, the budget usage rows), the system checks that read the
# connection's settings, LISTEN/NOTIFY and the wake-ups, the worker and runscheduler as
# processes (crash recovery with the server restart), and django.tasks, built into Django 6.
# Racing claimers send the statements that claim_authorized and claim_plan already run here,
# so the races stay on the Django 5.2 legs; the API's validation, the admin, the triggers and
# the policies do not depend on that meeting either: the postgres and dj6-sqlite legs cover them.
DJ6_POSTGRES_MODULES = (
    "migrations",
    "schema_change",
    "unmigrated",
    "partitions",
    "claim_plan",
    "claim_explain",
    "claim_authorized",
    "constraints",
    "enqueue_path",
    "budget_state",
    "checks",
    "notify",
    "wakeups",
    "runscheduler",
    "runscheduler_waits",
    "worker",
    "crash",
    "tasks_backend",
)
# Through PgBouncer in transaction mode: the worker's wake-ups, a drain by several processes
# and crash recovery, as most PostgreSQL deployments run them.
PGBOUNCER_MODULES = ("pooler", "crash")


def modules(names: tuple[str, ...], tests: Path) -> list[str]:
    """The paths of the test modules ``test_NAME.py`` under ``tests`` (in whichever folder),
    relative to the folder pytest runs in (``tests``'s parent)."""
    found = {path.stem.removeprefix("test_"): path for path in tests.rglob("test_*.py")}
    if missing := [name for name in names if name not in found]:
        raise ValueError(f"no test module for {missing} under {tests}")
    return [str(found[name].relative_to(tests.parent)) for name in names]


def dj6_python() -> str:
    """Python 3.13, else 3.12, for the Django 6 legs: on PATH or in pyenv's versions (a pyenv
    shim on PATH fails unless its version is active)."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    for version in ("3.13", "3.12"):
        candidates = [shutil.which(f"python{version}"), *sorted(pyenv.glob(f"{version}.*/bin/python3"))[::-1]]
        for candidate in filter(None, candidates):
            check = [str(candidate), "-c", f"import sys, venv; assert sys.version.startswith('{version}.')"]
            if subprocess.run(check, capture_output=True).returncode == 0:
                return str(candidate)
    return "3.13"  # not found: nox says so (and skips, or fails the leg under DSCH_REQUIRE_ALL)


DJ6_PYTHON = dj6_python()


def unavailable(session: nox.Session, why: str) -> NoReturn:
    """A leg that cannot run: skipped, or failed when every leg is required."""
    if REQUIRE_ALL:
        session.error(f"required, but {why}")
    session.skip(why)


def apt_install(session: nox.Session, *packages: str) -> None:
    """apt-get install ``packages`` when allowed (``tests/run.py --install-system-deps``, root)."""
    if INSTALL_SYSTEM_DEPS and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        apt = ("apt-get", "-q", "-o", "DPkg::Lock::Timeout=300")  # the other lane may be in apt too
        session.run(*apt, "update", external=True, env=env, silent=True)
        session.run(*apt, "install", "-y", *packages, external=True, env=env, silent=True)


PROBES = {
    "postgres": "import psycopg; psycopg.connect(host='127.0.0.1', port=5432, user='postgres',"
    " dbname='postgres', connect_timeout=5, autocommit=True){}",
    "mysql": "import MySQLdb; MySQLdb.connect(host='127.0.0.1', port=3306, user='root', passwd='',"
    " connect_timeout=5)",
}


def on_server(session: nox.Session, kind: str, then: str = "") -> bool:
    """Whether the local PostgreSQL or MariaDB answers (and runs ``then``, an ``.execute(...)``
    on PostgreSQL), asked from the session's Python."""
    try:
        session.run("python", "-c", PROBES[kind].format(then), silent=True)
    except nox.command.CommandFailed:
        return False
    return True


def test_env(url: str | None, **extra: str) -> dict[str, str | None]:
    """The environment of a leg's pytest runs: its database, nothing inherited that selects one."""
    return {
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONDONTWRITEBYTECODE": None,  # every worker process the tests start would compile again
        "DSCH_ARTIFACTS": os.environ.get("DSCH_ARTIFACTS", str(ROOT / ".ci" / "artifacts")),
        "DSCH_PG_PREPARED": None,
        "DSCH_POOLER": None,
        **extra,
    }


def pytest(session: nox.Session, env: dict[str, str | None], *args: str, parallel: bool = True) -> None:
    """pytest on ``args`` (the tests, or none for all), its JUnit report in REPORTS. ``parallel``:
    with pytest-xdist; on PostgreSQL, whose server the tests marked restarts_database_server
    stop (tests/worker/test_crash.py), those run after the rest, alone with the server."""
    report = REPORTS / session.name.replace("/", "-")
    run = ["python", "-m", "pytest", "-p", "no:cacheprovider", "--durations=10", *args, *session.posargs]
    if not parallel:
        session.run(*run, f"--junitxml={report}.xml", env=env)
        return
    xdist = ["-n", WORKERS, "--dist", "loadfile"]
    if not (env.get("DATABASE_URL") or "").startswith("postgres"):
        session.run(*run, *xdist, f"--junitxml={report}.xml", env=env)
        return
    # Either part may select nothing (exit 5, under -k), not both; the second runs whatever the first did.
    first, then, ok = f"{report}.xml", f"{report}-restarts.xml", [0, 5]
    try:
        xdist += ["-m", "not restarts_database_server", f"--junitxml={first}"]
        session.run(*run, *xdist, env=env, success_codes=ok)
    finally:
        session.run(*run, "-m", "restarts_database_server", f"--junitxml={then}", env=env, success_codes=ok)
    if all(ElementTree.parse(path).find(".//testcase") is None for path in (first, then)):
        session.error("no tests ran")


def install(session: nox.Session, django: str, *extras: str) -> None:
    """The package from the source (editable), ``django`` and the dev group."""
    session.install("-e", f".[{','.join(extras)}]" if extras else ".", django, *DEV)


# ------------------------------------------------------------------ the checks


@nox.session(python="3.11", tags=["checks", "lane-b"])
def lint(session: nox.Session) -> None:
    """ruff, ruff format, mypy, then the package: sdist and wheel built, ``twine check``, and the
    wheel holds every file of the package that git tracks."""
    install(session, DJANGO_52, "postgres")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # tests/typed_api_usage.py: what users' type checkers see of the lazily exported API.
    session.run(
        "mypy", PACKAGE, "noxfile.py", "tests/run.py", "example_project/run.py", "tests/typed_api_usage.py"
    )
    out = Path(tempfile.mkdtemp(prefix="dsch-dist-"))  # not session.create_tmp(): it sets TMPDIR
    session.run("python", "-m", "build", "--outdir", str(out), ".", silent=True)
    session.run("twine", "check", "--strict", *map(str, out.iterdir()))
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packed = set(archive.namelist())
    shutil.rmtree(out)
    tracked = subprocess.run(["git", "ls-files", PACKAGE], cwd=ROOT, capture_output=True, text=True).stdout
    if missing := sorted(set(tracked.split()) - packed):
        session.error(f"the wheel lacks {len(missing)} files of the package, e.g. {missing[0]}")


@nox.session(tags=["checks", "lane-b"])
@nox.parametrize("python,django", [("3.11", DJANGO_52), (DJ6_PYTHON, DJANGO_6)], ids=["dj52", "dj6"])
def migrations(session: nox.Session, django: str) -> None:
    """``makemigrations --check``: the models and the migrations agree, on each Django version."""
    session.install("-e", ".", django, "django-environ", "tzdata")
    session.run("python", "-m", "django", "makemigrations", "--check", "--dry-run", env=test_env(None))


# ------------------------------------------------------------------ Django 5.2, from the source


@nox.session(python="3.11", tags=["lane-b"])
def sqlite(session: nox.Session) -> None:
    """The whole suite on a SQLite file per pytest worker."""
    install(session, DJANGO_52, "postgres")
    pytest(session, test_env(None))


@nox.session(python="3.11", tags=["postgresql", "lane-a"])
def postgres(session: nox.Session) -> None:
    """The whole suite on PostgreSQL."""
    install(session, DJANGO_52, "postgres")
    if not on_server(session, "postgres"):
        unavailable(session, "PostgreSQL at 127.0.0.1:5432 does not answer")
    pytest(session, test_env(f"{PG}/{DB}"))


@nox.session(python="3.11", tags=["lane-b"])
def mariadb(session: nox.Session) -> None:
    """The whole suite on MariaDB (or MySQL)."""
    if not shutil.which("mariadb_config"):
        apt_install(session, "libmariadb-dev", "pkg-config")
    if not (shutil.which("mariadb_config") and shutil.which("pkg-config")):
        unavailable(session, "mysqlclient cannot build: apt-get install libmariadb-dev pkg-config")
    install(session, DJANGO_52, "mysql")
    if not on_server(session, "mysql"):
        unavailable(session, "MariaDB at 127.0.0.1:3306 does not answer")
    pytest(session, test_env(f"mysql://root@127.0.0.1:3306/{DB}"))


# ------------------------------------------------------------------ Django 6, from the wheel


def install_wheel(session: nox.Session) -> Path:
    """Build the wheel and install it (not the source) with Django 6 and the dev group, then
    move into a copy of the tests (``.wheel-tests/SESSION``) where no source can shadow it;
    returns that folder."""
    # Not in session.create_tmp(), which sets TMPDIR for the tests too: pytest's tmp_path under
    # .nox/ is too long for the SQLite wake-up sockets (AF_UNIX paths are 107 bytes at most).
    out = Path(tempfile.mkdtemp(prefix="dsch-dist-"))
    session.run("uv", "build", "--wheel", "--out-dir", str(out), str(ROOT), silent=True)
    (wheel,) = out.glob("*.whl")
    session.install("--reinstall-package", "django-durable-scheduler", f"{wheel}[postgres]", DJANGO_6, *DEV)
    shutil.rmtree(out)
    stage = ROOT / ".wheel-tests" / session.name
    shutil.rmtree(stage, ignore_errors=True)
    for tree in ("tests", "example_project"):
        shutil.copytree(ROOT / tree, stage / tree, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite3*"))
    # pytest's settings; the code blocks of the README and the tutorial, which the tests run.
    for name in ("pyproject.toml", "README.md", "docs/tutorial.md"):
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, stage / name)
    session.chdir(stage)
    where = session.run("python", "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)", silent=True)
    if "site-packages" not in str(where):
        session.error(f"the tests would import the source at {where}, not the wheel")
    return stage


@nox.session(name="dj6-sqlite", python=DJ6_PYTHON, tags=["lane-a"])
def dj6_sqlite(session: nox.Session) -> None:
    """The built wheel on Django 6 and SQLite: DJ6_SQLITE_MODULES."""
    stage = install_wheel(session)
    pytest(session, test_env(None), *modules(DJ6_SQLITE_MODULES, stage / "tests"))


@nox.session(name="dj6-postgres", python=DJ6_PYTHON, tags=["postgresql", "lane-a"])
def dj6_postgres(session: nox.Session) -> None:
    """The built wheel on Django 6 and PostgreSQL, with prepared statements: DJ6_POSTGRES_MODULES."""
    stage = install_wheel(session)
    if not on_server(session, "postgres"):
        unavailable(session, "PostgreSQL at 127.0.0.1:5432 does not answer")
    env = test_env(f"{PG}/{DB}6", DSCH_PG_PREPARED="1")
    pytest(session, env, *modules(DJ6_POSTGRES_MODULES, stage / "tests"))


# ------------------------------------------------------------------ through PgBouncer

PGBOUNCER_INI = """\
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/userlist.txt
pool_mode = transaction
max_client_conn = 400
default_pool_size = 40
ignore_startup_parameters = extra_float_digits,options
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


@contextmanager
def running_pgbouncer(session: nox.Session, binary: str) -> Iterator[None]:
    """PgBouncer in transaction mode on 127.0.0.1:PGBOUNCER_PORT in front of the local
    PostgreSQL (every database passed through, trust auth), until the block ends. As root it
    runs as ``postgres`` (PgBouncer refuses root)."""
    with tempfile.TemporaryDirectory(prefix="dsch-pgbouncer-") as tmp:
        (Path(tmp) / "userlist.txt").write_text('"postgres" ""\n')
        (Path(tmp) / "pgbouncer.ini").write_text(PGBOUNCER_INI.format(port=PGBOUNCER_PORT, dir=tmp))
        cmd = [binary, "-q", f"{tmp}/pgbouncer.ini"]
        if os.geteuid() == 0:
            for path in (Path(tmp), *Path(tmp).iterdir()):
                shutil.chown(path, "postgres")
            cmd[1:1] = ["-u", "postgres"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 15
            while socket.socket().connect_ex(("127.0.0.1", PGBOUNCER_PORT)) != 0:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = Path(tmp) / "pgbouncer.log"
                    why = log.read_text()[-500:] if log.exists() else f"exit {proc.poll()}"
                    unavailable(session, f"PgBouncer did not start on port {PGBOUNCER_PORT}: {why}")
                time.sleep(0.2)
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@nox.session(python="3.11", tags=["postgresql", "lane-a"])
def pgbouncer(session: nox.Session) -> None:
    """PGBOUNCER_MODULES through PgBouncer in transaction mode, started here. Its test database
    is dropped on PostgreSQL itself, before and after (the pooler's idle server connections
    would keep it open), and kept by pytest (``--reuse-db``) in between."""
    if not shutil.which("pgbouncer"):
        apt_install(session, "pgbouncer")
    binary = shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if binary is None:
        unavailable(session, "pgbouncer is not installed (apt-get install pgbouncer)")
    install(session, DJANGO_52, "postgres")
    drop = f".execute('DROP DATABASE IF EXISTS test_{DB}pool WITH (FORCE)')"
    if not on_server(session, "postgres", drop):
        unavailable(session, "PostgreSQL at 127.0.0.1:5432 does not answer")
    try:
        with running_pgbouncer(session, binary):
            url = f"postgres://postgres@127.0.0.1:{PGBOUNCER_PORT}/{DB}pool"
            env = test_env(url, DSCH_POOLER="pgbouncer")
            tests = modules(PGBOUNCER_MODULES, ROOT / "tests")
            pytest(session, env, "--reuse-db", "-m", "not restarts_database_server", *tests, parallel=False)
    finally:
        on_server(session, "postgres", drop)
