#!/usr/bin/env python3
"""Run the example project: ``python3 example_project/run.py [runscheduler arguments]``.

Standard library only (POSIX). Creates (or reuses) ``.venv-example`` with the package, Django 5.2,
django-environ and the one database driver ``DATABASE_URL`` needs (none for the default SQLite
file ``example_project/db.sqlite3``); applies the migrations; creates the demo policy and jobs and
enqueues some work (``manage.py demo_seed``); makes the superuser ``admin`` with a new password
(``manage.py demo_admin``); then runs the admin (``runserver`` on 127.0.0.1, port ``PORT`` or the
first free one from 8000) and ``manage.py runscheduler`` with the given arguments, until stopped.
``EXAMPLE_PYTHON`` names an interpreter that already has all of that, instead of the venv.

The launcher owns its children, so that whatever stops it stops them too and frees the port:

- Each ``manage.py`` child runs in its own session (its own process group), so that a signal
  meant for the launcher alone (``kill``, a process manager, a closed terminal) reaches the
  launcher, which then stops each child's whole group: SIGINT, SIGTERM or SIGHUP to the launcher
  (Ctrl-C included) sends SIGTERM to each group, on which runscheduler stops gracefully (running
  handlers get its ``--grace``); a second such signal sends SIGTERM again, on which runscheduler
  exits at once. What is still running ``--grace`` plus ``STOP_MARGIN`` seconds later is killed.
- If a child ends by itself, the launcher stops the other one the same way and says so in one line.
- On Linux each child also gets SIGTERM if the launcher dies without a chance to stop it
  (SIGKILL): ``prctl(PR_SET_PDEATHSIG)``. It covers the child itself, not processes the child
  starts; runserver runs with ``--noreload`` and runscheduler starts none. Elsewhere a launcher
  killed with SIGKILL leaves its children running.

Exit status: after a stop asked by a signal, 128 plus the signal's number (130 after Ctrl-C, 143
after ``kill``), what a shell reports for a program that signal ended, so that a script running
the launcher stops too; 0 when runscheduler finishes by itself (``--once``, ``--burst``,
``--max-occurrences``); otherwise non-zero: the failed setup step's or child's status, or 1 when
a child was killed by a signal or runserver exited by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import venv
from collections.abc import Callable
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
NAME = "example_project/run.py"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_MARGIN = 10.0  # seconds runscheduler may take after its grace to record outcomes and exit
POLL = 0.1  # seconds between looks at the children: how soon a signal or a child's end is acted on
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
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
        raise SystemExit(f"{NAME}: pip install into {VENV.name} failed")
    stamp.write_text(wanted)
    return str(python)


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to send the child SIGTERM when the launcher dies, or None
    where that is not available. libc is loaded here, before the fork, so the child only calls."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to the child's process group (the child and anything it started). The
    group outlives its leader while a member remains, and its id is not reused meanwhile."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(proc.pid, signum)


def _gone(proc: subprocess.Popen[bytes]) -> bool:
    """The child has exited and no process is left in its group."""
    if proc.poll() is None:
        return False
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):  # PermissionError: macOS, a group of zombies
        return True
    return False


def _say(line: str) -> None:
    """One line on stderr, if it can still be written: after SIGHUP the terminal may be gone, and a
    failed write must not keep the launcher from stopping its children."""
    with contextlib.suppress(OSError):
        print(f"{NAME}: {line}", file=sys.stderr, flush=True)


def _describe(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


class Launcher:
    """The ``manage.py`` children, each in its own session, and the stop signals received."""

    def __init__(self, manage: list[str], stop_timeout: float) -> None:
        self.manage = manage
        self.stop_timeout = stop_timeout
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.signals: list[int] = []  # appended by the handler; acted on by the main loop
        self._preexec = _die_with_parent()

    def install(self) -> None:
        """Stop signals only record themselves: the main loop forwards them between its looks at
        the children, never while one of them is being reaped."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    @property
    def exit_status(self) -> int:
        """128 plus the first stop signal's number, as a shell reports a program it ended."""
        return 128 + self.signals[0]

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [*self.manage, *args], cwd=HERE, start_new_session=True, preexec_fn=self._preexec
        )
        self.children[name] = proc
        return proc

    def wait_any(self) -> str | None:
        """Wait until a child ends (its name) or a stop signal comes (None)."""
        while not self.signals:
            for name, proc in self.children.items():
                if proc.poll() is not None:
                    return name
            time.sleep(POLL)
        return None

    def stop_all(self) -> None:
        """SIGTERM to every child's group (again for each further stop signal), wait up to
        ``stop_timeout`` for them, then kill what is left."""
        forwarded = len(self.signals)
        for proc in self.children.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        while not all(_gone(proc) for proc in self.children.values()):
            if time.monotonic() > deadline:
                self._kill_rest()
                break
            if len(self.signals) > forwarded:  # stop now: runscheduler exits on a second signal
                forwarded = len(self.signals)
                for proc in self.children.values():
                    _signal_group(proc, signal.SIGTERM)
            time.sleep(POLL)
        self.children.clear()

    def _kill_rest(self) -> None:
        for name, proc in self.children.items():
            if not _gone(proc):
                _say(f"{name} did not stop within {self.stop_timeout:g} s; killing it")
                _signal_group(proc, signal.SIGKILL)
                proc.wait()

    def run_step(self, *args: str) -> int:
        """Run one setup command to its end; a stop signal stops it and gives the exit status."""
        print(f"$ manage.py {args[0]}", flush=True)
        proc = self.start(args[0], *args)
        stopped = self.wait_any() is None
        if stopped:
            _say(f"{signal.Signals(self.signals[0]).name}: stopping manage.py {args[0]}")
        self.stop_all()
        if stopped:
            return self.exit_status
        if proc.returncode:
            _say(f"manage.py {args[0]} {_describe(proc.returncode)}")
        return 1 if proc.returncode < 0 else proc.returncode

    def serve(self, port: int, scheduler_args: list[str]) -> int:
        """Run the admin's server beside the scheduler until a stop signal or either one ends."""
        self.start("runserver", "runserver", f"127.0.0.1:{port}", "--noreload")
        self.start("runscheduler", "runscheduler", *scheduler_args)
        ended = self.wait_any()
        if ended is None:
            _say(f"{signal.Signals(self.signals[0]).name}: stopping {' and '.join(self.children)}")
            self.stop_all()
            return self.exit_status
        code = self.children[ended].returncode
        others = " and ".join(name for name in self.children if name != ended)
        _say(f"{ended} {_describe(code)}; stopping {others}")
        self.stop_all()  # the ended one's group too: whatever it started and left behind
        if self.signals:  # a stop signal came while the other one was stopping
            return self.exit_status
        if ended == "runscheduler" and code == 0:
            return 0  # --once, --burst or --max-occurrences: its work is done
        return code if code > 0 else 1


def free_port() -> int:
    """``PORT`` if set, else the first port from 8000 that nothing listens on."""
    if os.environ.get("PORT"):
        return int(os.environ["PORT"])
    for port in range(8000, 8100):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise SystemExit(f"{NAME}: no free port in 8000-8099; set PORT")


def stop_timeout(scheduler_args: list[str]) -> float:
    """runscheduler's ``--grace`` (30 s unless given) plus ``STOP_MARGIN``."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--grace", type=float, default=30.0)
    try:
        grace = float(parser.parse_known_args(scheduler_args)[0].grace)
    except argparse.ArgumentError:
        grace = 30.0  # runscheduler itself will reject the value
    return max(0.0, grace) + STOP_MARGIN


def main(argv: list[str]) -> int:
    python = os.environ.get("EXAMPLE_PYTHON") or ensure_venv(os.environ.get("DATABASE_URL") or "sqlite://")
    scheduler_args = argv or ["--verbosity", "1"]
    launcher = Launcher([python, str(HERE / "manage.py")], stop_timeout(scheduler_args))
    launcher.install()
    try:
        return launch(launcher, scheduler_args)
    finally:
        launcher.stop_all()  # after an error in the launcher itself: its children go with it


def launch(launcher: Launcher, scheduler_args: list[str]) -> int:
    """Migrate, seed and make the admin user; then serve the admin beside the scheduler."""
    password = secrets.token_urlsafe(9)
    # --password=...: a password may begin with "-", which would read as an option on its own.
    for step in (["migrate", "--no-input"], ["demo_seed"], ["demo_admin", f"--password={password}"]):
        if code := launcher.run_step(*step):
            return code
    port = free_port()
    print(f"\nThe admin: http://127.0.0.1:{port}/admin/  (user admin, password {password})", flush=True)
    print(
        f"$ manage.py runscheduler {' '.join(scheduler_args)}  (Ctrl-C, or kill {os.getpid()}, stops both)\n",
        flush=True,
    )
    return launcher.serve(port, scheduler_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
