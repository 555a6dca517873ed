#!/usr/bin/env python3
"""Run the example project: ``python3 example_project/run.py [runscheduler arguments]``.

Standard library only. Creates (or reuses) ``.venv-example`` with the package, Django 5.2,
django-environ and the one database driver ``DATABASE_URL`` needs (none for the default SQLite
file ``example_project/db.sqlite3``); applies the migrations; creates the demo policy and jobs and
enqueues some work (``manage.py demo_seed``); makes the superuser ``admin`` with a new password
(``manage.py demo_admin``); then runs the admin (``runserver`` on 127.0.0.1, port ``PORT`` or the
first free one from 8000) and ``manage.py runscheduler`` with the given arguments, until Ctrl-C.
``EXAMPLE_PYTHON`` names an interpreter that already has all of that, instead of the venv.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = ROOT / ".venv-example"
# What the example needs: the package with its [tasks] extra (the demo's Django tasks: the
# django-tasks backport on Django 5.2), Django 5.2, django-environ (its settings read
# DATABASE_URL), and the one database driver DATABASE_URL needs.
REQUIREMENTS = ("django>=5.2,<6", "django-environ>=0.11", "tzdata")


def ensure_venv(database_url: str) -> str:
    """``.venv-example``'s Python, the venv made or brought up to date (quiet unless pip fails)."""
    scheme = database_url.split(":", 1)[0].lower()
    driver = ["postgres"] if scheme.startswith("postgres") else ["mysql"] if scheme == "mysql" else []
    target = f"{ROOT}[{','.join(['tasks', *driver])}]"
    stamp, python = VENV / "installed.txt", VENV / "bin" / "python"
    wanted = " ".join([target, *REQUIREMENTS, (ROOT / "pyproject.toml").read_text()])
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    if not python.exists():
        venv.create(VENV, with_pip=True)
    print(f"installing the package and {', '.join(REQUIREMENTS)} into {VENV.name} (once)", flush=True)
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", target]
    if subprocess.call([*cmd, *REQUIREMENTS]) != 0:
        raise SystemExit(f"example_project/run.py: pip install into {VENV.name} failed")
    stamp.write_text(wanted)
    return str(python)


def run_child(cmd: list[str]) -> int:
    """Run a command in the foreground and wait for it, even through Ctrl-C.

    The child is in our process group, so Ctrl-C reaches it directly; we only wait for it to
    finish its own shutdown (a second Ctrl-C is the child's to handle too).
    """
    proc = subprocess.Popen(cmd, cwd=HERE)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


def free_port() -> int:
    """``PORT`` if set, else the first port from 8000 that nothing listens on."""
    if os.environ.get("PORT"):
        return int(os.environ["PORT"])
    for port in range(8000, 8100):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise SystemExit("example_project/run.py: no free port in 8000-8099; set PORT")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the admin's server the way Ctrl-C does, if Ctrl-C has not already."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> int:
    python = os.environ.get("EXAMPLE_PYTHON") or ensure_venv(os.environ.get("DATABASE_URL") or "sqlite://")
    manage = [python, str(HERE / "manage.py")]
    password = secrets.token_urlsafe(9)
    for step in (["migrate", "--no-input"], ["demo_seed"], ["demo_admin", "--password", password]):
        print(f"$ manage.py {step[0]}", flush=True)
        if code := run_child([*manage, *step]):
            return code

    port = free_port()
    server = subprocess.Popen([*manage, "runserver", f"127.0.0.1:{port}", "--noreload"], cwd=HERE)
    try:
        print(f"\nThe admin: http://127.0.0.1:{port}/admin/  (user admin, password {password})", flush=True)
        args = argv or ["--verbosity", "1"]
        print(f"$ manage.py runscheduler {' '.join(args)}  (Ctrl-C stops both)\n", flush=True)
        return run_child([*manage, "runscheduler", *args])
    finally:
        stop(server)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # A child killed by SIGINT reports -2; exit as a shell would after Ctrl-C.
    sys.exit(130 if code < 0 else code)
