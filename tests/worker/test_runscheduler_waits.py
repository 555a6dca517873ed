"""runscheduler started before its database answers (a worker that boots before its
database server, as in a compose file): it waits, saying so in one WARNING line, stops at
once on SIGTERM or SIGINT, and starts working when the database answers.

"Does not answer" is a connection that cannot be opened: for PostgreSQL and MariaDB, a
port nobody listens on (the database comes up when a forwarder to the real server starts
listening there); for SQLite, a file in a directory that does not exist yet (it comes up
when the directory appears; the new database is empty, so it is refused as unmigrated).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import OperationalError, connection

import django_durable_scheduler as scheduler
from django_durable_scheduler.management.commands import runscheduler

from ..conftest import AUTHORITY, ROOT, database_url, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAITING = "waiting for database 'default' to answer"


# ``manage.py runscheduler``, its log lines showing their level.
MANAGE = """
import sys
from django.core.management import execute_from_command_line
from tests import settings
settings.LOGGING["formatters"] = {"level": {"format": "%(levelname)s %(message)s"}}
settings.LOGGING["handlers"]["console"]["formatter"] = "level"
execute_from_command_line(["manage.py", "runscheduler", *sys.argv[1:]])
"""


class Worker:
    """A runscheduler subprocess whose stderr lines are collected as they come."""

    def __init__(self, url: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", MANAGE, "--poll-interval", "0.05", *args],
            cwd=ROOT,
            env=subprocess_env(DATABASE_URL=url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            assert self.proc.poll() is None, "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} in:\n" + "\n".join(self.lines))

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def server_address() -> tuple[str, int]:
    parts = urlsplit(database_url())
    default = {"postgresql": 5432, "mysql": 3306}[connection.vendor]
    return parts.hostname or "127.0.0.1", parts.port or default


def url_on_port(port: int) -> str:
    """The test database's URL, but on 127.0.0.1:``port``."""
    parts = urlsplit(database_url())
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@127.0.0.1:{port}"))


class Forwarder:
    """Listens on 127.0.0.1:``port`` and forwards each connection to ``target``."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):  # either side closed
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def silent_database(tmp_path: Path) -> Iterator[tuple[str, Path | int]]:
    """A URL of the test database's kind that does not answer, and what makes it answer: a
    directory to create (SQLite) or a port to forward (servers)."""
    if connection.vendor == "sqlite":
        missing = tmp_path / "not-yet"
        yield f"sqlite:///{missing / 'db.sqlite3'}", missing
        shutil.rmtree(missing, ignore_errors=True)
    else:
        port = free_port()
        yield url_on_port(port), port


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_waits_for_a_silent_database_and_stops_at_once_on_a_signal(silent_database, signum):
    url, _ = silent_database
    worker = Worker(url)
    try:
        line = worker.wait_for_line(WAITING)
        assert line.startswith(f"WARNING runscheduler: {WAITING} (0 s so far, retrying every 1 s): "), line
        time.sleep(2.5)  # retries, each silent: the line comes again only after 30 s
        assert [line for line in worker.lines if WAITING in line] == [line]
        # The wait sees the signal within 0.05 s; the rest is the interpreter's exit, which
        # takes seconds on a loaded machine.
        worker.proc.send_signal(signum)
        assert worker.finish(timeout=15) == 0, "\n".join(worker.lines)
        assert not any("Traceback" in line for line in worker.lines), "\n".join(worker.lines)
    finally:
        worker.kill()


def test_starts_working_when_the_database_answers(silent_database):
    url, cure = silent_database
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: a database that appears is a new, empty one (the next test)")
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("test.ok", "test.ok", authority=AUTHORITY)
    occurrence, _ = scheduler.enqueue("test.ok", scheduled_for=1_700_000_000_000, trigger_key="t")
    worker = Worker(url, "--burst")
    forwarder = None
    try:
        worker.wait_for_line(WAITING)
        assert isinstance(cure, int)
        forwarder = Forwarder(cure, server_address())
        assert worker.finish(timeout=60) == 0, "\n".join(worker.lines)
        occurrence.refresh_from_db()
        assert occurrence.status == "succeeded"
    finally:
        worker.kill()
        if forwarder is not None:
            forwarder.close()


def test_a_database_that_answers_unmigrated_is_refused(silent_database):
    url, cure = silent_database
    if connection.vendor != "sqlite":
        pytest.skip("servers: test_unmigrated refuses an unmigrated database that answers")
    worker = Worker(url)
    try:
        worker.wait_for_line(WAITING)
        assert isinstance(cure, Path)
        cure.mkdir()
        assert worker.finish(timeout=30) == 1, "\n".join(worker.lines)
        assert any("lacks migrations" in line for line in worker.lines), "\n".join(worker.lines)
    finally:
        worker.kill()


class SilentThenAnswering:
    """A connection that fails to open ``failures`` times, then opens."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def ensure_connection(self) -> None:
        if self.failures:
            self.failures -= 1
            raise OperationalError(f"connection refused\n  ({self.failures} more)")


def test_the_warning_comes_again_only_now_and_then(monkeypatch, caplog):
    monkeypatch.setattr(runscheduler, "RETRY_SECONDS", 0.01)
    monkeypatch.setattr(runscheduler, "WARN_EVERY_SECONDS", 0.3)
    monkeypatch.setattr(runscheduler, "connections", {"db": SilentThenAnswering(failures=40)})
    with caplog.at_level(logging.WARNING, logger="django_durable_scheduler"):
        started = time.monotonic()
        assert runscheduler.wait_for_database("db", []) is True
    took = time.monotonic() - started
    lines = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    # 40 failures over ``took`` seconds: one line at the first, then one per 0.3 s at most.
    assert 1 <= len(lines) <= 1 + took / 0.3
    assert len(lines) < 40
    assert all("\n" not in line and line.endswith("connection refused (39 more)") for line in lines[:1])


@pytest.mark.parametrize("step", ["sync_declared_jobs", "install_signal_handlers"])
def test_a_stop_signal_while_starting_up_ends_the_command_cleanly(monkeypatch, caplog, step):
    """SIGTERM between the command's start and the worker's loop is recorded, not fatal: the
    command returns (exit 0), whichever step it came in; before the worker exists it claims
    nothing."""
    from django.core.management import call_command

    from django_durable_scheduler.handlers import declared
    from django_durable_scheduler.models import Occurrence
    from django_durable_scheduler.worker import Worker

    def signalled(original):
        def step_then_signal(*args, **kwargs):
            result = original(*args, **kwargs)
            signal.raise_signal(signal.SIGTERM)
            return result

        return step_then_signal

    if step == "sync_declared_jobs":
        monkeypatch.setattr(declared, step, signalled(declared.sync_declared_jobs))
    else:
        monkeypatch.setattr(Worker, step, signalled(Worker.install_signal_handlers))
    scheduler.create_job("waiting", "test.noop", authority=AUTHORITY)
    scheduler.enqueue("waiting", scheduled_for=0, trigger_key="t")
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        with caplog.at_level(logging.INFO, logger="django_durable_scheduler"):
            call_command("runscheduler", "--burst", "--worker-id", "early", "--lease", "5")
        if step == "sync_declared_jobs":
            assert "stopped by a signal before it started" in caplog.text
            assert Occurrence.objects.get().status == "queued"
            assert signal.getsignal(signal.SIGTERM) is previous[signal.SIGTERM]
        else:
            assert "signal SIGTERM: stopping" in caplog.text
    finally:
        for signum, handler in previous.items():  # the worker's handlers stay after it ran
            signal.signal(signum, handler)
