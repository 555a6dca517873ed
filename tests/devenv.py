"""Development virtualenvs shared by ``tests/run.py`` and ``example_project/run.py``.

Standard library only: both scripts must work on a machine that has nothing but Python 3.11+.
They load this file by path (not through ``sys.path``), so it never shadows an installed module.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
STAMP_NAME = ".durable-scheduler-stamp.json"
EXTRAS = ("postgres", "mysql")
MYSQL_SYSTEM_PACKAGES = ("libmariadb-dev", "pkg-config")


@dataclass(frozen=True)
class VenvSpec:
    """What one development virtualenv holds."""

    dirname: str
    django: str
    label: str


DEFAULT_VENV = VenvSpec(".venv", "django>=5.2,<6", "Django 5.2")
DJ6_VENV = VenvSpec(".venv-dj6", "django>=6,<7", "Django 6")
# Interpreters tried for the Django 6 venv, newest first (Django 6.0 needs Python 3.12+).
DJ6_PYTHONS = ((3, 13), (3, 12))


@dataclass
class Venv:
    """A ready virtualenv: its interpreter and what it ended up with."""

    path: Path
    python: Path
    python_version: str
    django_version: str
    mysql: bool
    mysql_error: str = ""


class SetupError(RuntimeError):
    """A virtualenv could not be created or filled."""


def say(message: str) -> None:
    print(f"[devenv] {message}", flush=True)


def run(cmd: list[str], *, env: dict[str, str] | None = None, quiet: bool = False) -> int:
    """Run a command from the repository root; with ``quiet`` its output is shown only on failure."""
    if not quiet:
        return subprocess.call(cmd, cwd=ROOT, env=env)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stdout.write(proc.stdout[-6000:])
        sys.stderr.write(proc.stderr[-6000:])
    return proc.returncode


def output(cmd: list[str], *, env: dict[str, str] | None = None) -> str | None:
    """The stripped stdout of a command, or None when it cannot run or fails."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def interpreter_version(python: str | Path) -> tuple[int, int] | None:
    """(major, minor) of an interpreter that runs and has the venv module, else None."""
    out = output([str(python), "-c", "import sys, venv; print(*sys.version_info[:2])"])
    if not out:
        return None
    major, minor = out.split()
    return int(major), int(minor)


def find_python(wanted: tuple[tuple[int, int], ...] = DJ6_PYTHONS) -> Path | None:
    """The first working interpreter of the wanted versions: on PATH, then in pyenv's versions."""
    pyenv_root = os.environ.get("PYENV_ROOT") or output(["pyenv", "root"]) or str(Path.home() / ".pyenv")
    for major, minor in wanted:
        candidates = [shutil.which(f"python{major}.{minor}")]
        # A pyenv shim on PATH fails unless that version is active, hence the direct paths too.
        candidates += sorted(glob.glob(f"{pyenv_root}/versions/{major}.{minor}.*/bin/python3"), reverse=True)
        for candidate in candidates:
            if candidate and interpreter_version(candidate) == (major, minor):
                return Path(candidate)
    return None


def _stamp_key(spec: VenvSpec, base_python: Path) -> str:
    digest = hashlib.sha256()
    for part in (PYPROJECT.read_bytes(), Path(__file__).read_bytes()):
        digest.update(part)
    version = output([str(base_python), "-c", "import sys; print(sys.version)"]) or ""
    digest.update(f"{spec}|{version}|{ROOT}".encode())
    return digest.hexdigest()


def _read_stamp(venv_dir: Path) -> dict[str, object]:
    try:
        data = json.loads((venv_dir / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def mysql_build_deps_missing() -> list[str]:
    """Debian packages mysqlclient needs to compile that are not installed."""
    if not shutil.which("pkg-config"):
        return list(MYSQL_SYSTEM_PACKAGES)
    has_lib = any(
        run(["pkg-config", "--exists", name], quiet=True) == 0 for name in ("mysqlclient", "mariadb")
    )
    return [] if has_lib else ["libmariadb-dev"]


# tests/run.py builds its two venvs side by side: one apt-get at a time.
_APT_LOCK = threading.Lock()


def install_mysql_build_deps() -> None:
    """apt-get install the mysqlclient build dependencies when missing (root and apt only)."""
    with _APT_LOCK:
        _install_mysql_build_deps()


def _install_mysql_build_deps() -> None:
    missing = mysql_build_deps_missing()
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say(f"cannot install {' '.join(missing)}: needs root and apt-get")
        return
    say(f"apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if run(["apt-get", "update", "-q"], env=env, quiet=True) == 0:
        run(["apt-get", "install", "-y", "-q", *missing], env=env, quiet=True)


def _dev_group_args(python: Path) -> list[str]:
    """pip arguments for the ``dev`` dependency group: ``--group`` when pip knows it (pip >= 25.1)."""
    knows_groups = "import pip, sys; sys.exit([int(x) for x in pip.__version__.split('.')[:2]] < [25, 1])"
    if run([str(python), "-c", knows_groups], quiet=True) == 0:
        return ["--group", f"{PYPROJECT}:dev"]
    with PYPROJECT.open("rb") as f:
        return list(tomllib.load(f)["dependency-groups"]["dev"])


def _pip_install(python: Path, spec: VenvSpec, extras: tuple[str, ...]) -> bool:
    target = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    cmd = [str(python), "-m", "pip", "install", "-q", "-e", target, *_dev_group_args(python), spec.django]
    say(f"pip install -e .[{','.join(extras)}] + dev group + {spec.django!r} into {spec.dirname}")
    return run(cmd, quiet=True) == 0


def ensure_venv(spec: VenvSpec, base_python: Path | str, *, install_system_deps: bool = False) -> Venv:
    """Create or update the virtualenv ``spec`` with ``base_python``; reuse it when nothing changed.

    The mysql extra needs a C build (mysqlclient). If that fails the venv is filled without it and
    ``Venv.mysql`` is False, so that the MariaDB leg can say why it cannot run.
    """
    base_python = Path(base_python)
    venv_dir = ROOT / spec.dirname
    python = venv_python(venv_dir)
    key = _stamp_key(spec, base_python)
    stamp = _read_stamp(venv_dir)
    retry_mysql = install_system_deps and stamp.get("mysql") is False
    if stamp.get("key") == key and not retry_mysql and interpreter_version(python):
        say(f"{spec.dirname} is up to date")
    else:
        wanted = interpreter_version(base_python)
        if wanted is None:
            raise SetupError(f"{base_python} cannot run or has no venv module")
        if python.exists() and interpreter_version(python) != wanted:
            say(f"{spec.dirname} was made with another Python: recreating it")
            shutil.rmtree(venv_dir)
        if not python.exists():
            say(f"creating {spec.dirname} with {base_python} (Python {wanted[0]}.{wanted[1]})")
            if run([str(base_python), "-m", "venv", str(venv_dir)]) != 0:
                raise SetupError(f"{base_python} -m venv {venv_dir} failed")
        (venv_dir / STAMP_NAME).unlink(missing_ok=True)
        if run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip>=25.1"], quiet=True) != 0:
            say("could not upgrade pip; reading the dev group from pyproject.toml instead")
        if install_system_deps:
            install_mysql_build_deps()
        mysql = _pip_install(python, spec, EXTRAS)
        if not mysql:
            say("install with the mysql extra failed (mysqlclient needs libmariadb-dev and pkg-config);")
            say("retrying without it: the MariaDB leg will be unavailable")
            if not _pip_install(python, spec, tuple(e for e in EXTRAS if e != "mysql")):
                raise SetupError(f"pip install into {spec.dirname} failed (output above)")
        stamp = {"key": key, "mysql": mysql}
        (venv_dir / STAMP_NAME).write_text(json.dumps(stamp))
    facts = output(
        [
            str(python),
            "-c",
            "import platform, django; print(platform.python_version(), django.get_version())",
        ]
    )
    if not facts:
        raise SetupError(f"{spec.dirname} has no working Django")
    python_version, django_version = facts.split()
    mysql_ok = bool(stamp.get("mysql"))
    return Venv(
        path=venv_dir,
        python=python,
        python_version=python_version,
        django_version=django_version,
        mysql=mysql_ok,
        mysql_error="" if mysql_ok else "mysqlclient did not install (needs libmariadb-dev, pkg-config)",
    )


def ensure_default_venv(*, install_system_deps: bool = False) -> Venv:
    """The main development venv (``.venv``): this interpreter, Django 5.2, every extra."""
    return ensure_venv(DEFAULT_VENV, sys.executable, install_system_deps=install_system_deps)


EXAMPLE_VENV = VenvSpec(".venv-example", "django>=5.2,<6", "Django 5.2")
# What the example project needs besides the package: its settings read DATABASE_URL.
EXAMPLE_REQUIREMENTS = ("django-environ>=0.11", "tzdata")


def ensure_example_venv(database_url: str) -> Path:
    """The example project's venv (``.venv-example``): the package with its ``tasks`` extra,
    Django 5.2, django-environ and the driver ``database_url`` needs, nothing else (no compiler
    needed for SQLite).
    Quiet unless something fails; returns its Python."""
    scheme = database_url.split(":", 1)[0].lower()
    driver = ("postgres",) if scheme.startswith("postgres") else ("mysql",) if scheme == "mysql" else ()
    extras = ("tasks", *driver)  # the demo's Django tasks: the django-tasks backport on Django 5.2
    spec = EXAMPLE_VENV
    base_python = Path(sys.executable)
    venv_dir = ROOT / spec.dirname
    python = venv_python(venv_dir)
    key = _stamp_key(spec, base_python) + ",".join(extras)
    if _read_stamp(venv_dir).get("key") == key and interpreter_version(python):
        return python
    if not python.exists() and run([str(base_python), "-m", "venv", str(venv_dir)], quiet=True) != 0:
        raise SetupError(f"{base_python} -m venv {venv_dir} failed")
    (venv_dir / STAMP_NAME).unlink(missing_ok=True)
    target = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    say(f"installing the package, {spec.django!r} and django-environ into {spec.dirname} (once)")
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", target]
    if run([*cmd, spec.django, *EXAMPLE_REQUIREMENTS], quiet=True) != 0:
        raise SetupError(f"pip install into {spec.dirname} failed (output above)")
    (venv_dir / STAMP_NAME).write_text(json.dumps({"key": key}))
    return python


# ----------------------------------------------------------------------- the built package

PACKAGE = "django_durable_scheduler"
# Where the Django 6 legs run the suite from: a copy of the tests without the package's
# source, so that every import of the package, theirs and their subprocesses', is the wheel's.
WHEEL_STAGE = ROOT / ".wheel-tests"


def build_package(python: Path, outdir: Path) -> Path:
    """Build the sdist and the wheel into ``outdir`` (``python -m build``), check their metadata
    (``twine check``) and that the wheel holds every file of the package; returns the wheel."""
    if run([str(python), "-m", "build", "--outdir", str(outdir), str(ROOT)], quiet=True) != 0:
        raise SetupError("python -m build failed (output above)")
    built = sorted(outdir.iterdir())
    if run([str(python), "-m", "twine", "check", "--strict", *map(str, built)], quiet=True) != 0:
        raise SetupError("twine check failed (output above)")
    (wheel,) = (path for path in built if path.suffix == ".whl")
    missing = missing_from_wheel(wheel)
    if missing:
        raise SetupError(f"the wheel lacks {len(missing)} files of the package, e.g. {missing[0]}")
    return wheel


def missing_from_wheel(wheel: Path) -> list[str]:
    """The package's files (as git tracks them) that ``wheel`` lacks, sorted."""
    return sorted(_package_files() - _wheel_files(wheel))


def _package_files() -> set[str]:
    """The package's files that git tracks: what a user must get from the wheel."""
    listed = output(["git", "ls-files", "--cached", "--others", "--exclude-standard", PACKAGE])
    if listed is None:  # not a git checkout: take the tree as it is
        return {
            str(path.relative_to(ROOT))
            for path in (ROOT / PACKAGE).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }
    return set(listed.splitlines())


def _wheel_files(wheel: Path) -> set[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if name.startswith(PACKAGE + "/")}


def install_wheel(venv: Venv, wheel: Path) -> None:
    """Replace ``venv``'s install of the package (editable) by ``wheel``."""
    cmd = [str(venv.python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)]
    if run(cmd, quiet=True) != 0:
        raise SetupError(f"pip install {wheel.name} into {venv.path.name} failed (output above)")


def imported_from(venv: Venv, cwd: Path) -> Path:
    """The directory of the package that ``venv``'s Python imports when started in ``cwd``."""
    proc = subprocess.run(
        [str(venv.python), "-c", f"import {PACKAGE} as m; print(m.__file__)"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode:
        raise SetupError(f"{venv.path.name} cannot import {PACKAGE}: {proc.stderr.strip()[-500:]}")
    return Path(proc.stdout.strip()).parent


def stage_tests(stage: Path = WHEEL_STAGE) -> Path:
    """A fresh copy of ``tests/``, what tests run (``example_project/``, the README's blocks)
    and ``pyproject.toml`` (pytest's settings) in ``stage``."""
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.sqlite3*")
    for tree in ("tests", "example_project"):
        shutil.copytree(ROOT / tree, stage / tree, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, stage / name)
    return stage


# ----------------------------------------------------------------------- PgBouncer

PGBOUNCER = "/usr/sbin/pgbouncer"
PGBOUNCER_PORT = 6432
_PGBOUNCER_INI = """\
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


def install_pgbouncer() -> None:
    """apt-get install pgbouncer when missing (root and apt only)."""
    if shutil.which("pgbouncer") or os.path.exists(PGBOUNCER):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say("cannot install pgbouncer: needs root and apt-get")
        return
    with _APT_LOCK:
        say("apt-get install pgbouncer")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if run(["apt-get", "update", "-q"], env=env, quiet=True) == 0:
            run(["apt-get", "install", "-y", "-q", "pgbouncer"], env=env, quiet=True)


@contextmanager
def pgbouncer(port: int = PGBOUNCER_PORT) -> Iterator[str | None]:
    """A PgBouncer in transaction mode on 127.0.0.1:``port`` in front of the local PostgreSQL
    (every database name passed through, trust auth), for the ``pgbouncer`` leg. Yields None
    when it runs, else why it could not start; stopped on exit. As root it runs as the
    ``postgres`` user (PgBouncer refuses root)."""
    binary = shutil.which("pgbouncer") or (PGBOUNCER if os.path.exists(PGBOUNCER) else None)
    if binary is None:
        yield "pgbouncer is not installed (apt-get install pgbouncer)"
        return
    with tempfile.TemporaryDirectory(prefix="dsch-pgbouncer-") as tmp:
        directory = Path(tmp)
        (directory / "userlist.txt").write_text('"postgres" ""\n')
        ini = directory / "pgbouncer.ini"
        ini.write_text(_PGBOUNCER_INI.format(port=port, dir=directory))
        cmd = [binary, "-q", str(ini)]
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres")
            for path in directory.iterdir():
                shutil.chown(path, "postgres")
            cmd[1:1] = ["-u", "postgres"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            if not _port_answers(port, proc):
                log = directory / "pgbouncer.log"
                detail = log.read_text() if log.exists() else ""
                if proc.poll() is not None and proc.stderr is not None:
                    detail += proc.stderr.read()
                yield f"pgbouncer did not start on port {port}: {' '.join(detail.split())[-500:]}"
                return
            yield None
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _port_answers(port: int, proc: subprocess.Popen[str], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False
