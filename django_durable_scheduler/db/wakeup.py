"""Wake-ups: telling idle workers that new work was enqueued, so they need not wait for
their next poll. PostgreSQL has LISTEN/NOTIFY (:class:`Listener`, :func:`notify_new_work`);
SQLite gets the datagram sockets described below; elsewhere workers poll.

SQLite has no LISTEN/NOTIFY.

A SQLite database is a file on one machine, so every process that writes to it runs there
too. Each ``runscheduler`` using a file-backed SQLite database binds a Unix datagram
socket in a directory named after the database (``<tmp>/dsch-wake-<hash of its path>/``);
whoever commits new work sends one byte to every socket there. A worker is woken within a
millisecond or so instead of at its next poll; the poll stays, as the fallback for anything
a wake-up misses (another user's process that cannot reach the directory, a full socket
buffer). A socket left behind by a killed worker refuses the datagram and is removed by the
sender that finds it.

Elsewhere (PostgreSQL has NOTIFY; MySQL/MariaDB may be on another machine; an in-memory
SQLite database is one process; a platform without ``AF_UNIX``) nothing is done here.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connections, transaction

logger = logging.getLogger("django_durable_scheduler")

SUFFIX = ".sock"
# PostgreSQL channel on which enqueues announce new work.
CHANNEL = "durable_scheduler"
# How long a new LISTEN connection waits for its own test notification (see Listener).
PROBE_TIMEOUT = 3.0


_DIRS: dict[str, Path | None] = {}


def wake_dir(alias: str) -> Path | None:
    """The wake-up directory of database ``alias``, or None when it has none (see above)."""
    connection = connections[alias]
    if connection.vendor != "sqlite" or not hasattr(socket, "AF_UNIX"):
        return None
    name = str(connection.settings_dict.get("NAME") or "")
    if name not in _DIRS:  # resolved once per database name (realpath walks the path)
        _DIRS[name] = _dir_for(name)
    return _DIRS[name]


def _dir_for(name: str) -> Path | None:
    if not name or name == ":memory:" or "mode=memory" in name or name.startswith("file::memory:"):
        return None
    if name.startswith("file:"):
        name = name[len("file:") :].split("?", 1)[0]
    digest = hashlib.sha256(os.path.realpath(name).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"dsch-wake-{digest}"


def announce(alias: str) -> int:
    """Wake every worker listening on database ``alias``; returns how many were reached.
    Call it after the new work is committed. Never raises: a wake-up is an optimization."""
    directory = wake_dir(alias)
    if directory is None:
        return 0
    entries = _sockets(directory)
    if not entries:
        return 0
    reached = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for path in entries:
            try:
                sock.sendto(b"w", path)
                reached += 1
            except BlockingIOError:
                reached += 1  # its buffer is full of wake-ups already
            except OSError as exc:
                _LISTINGS.pop(directory, None)
                if exc.errno in (errno.ECONNREFUSED, errno.ENOTSOCK):
                    _remove(path)  # left behind by a worker that is gone
    return reached


# Per wake-up directory: (its mtime in ns, the sockets listed in it then).
_LISTINGS: dict[Path, tuple[int, list[str]]] = {}
# A listing is reused only while the directory is unchanged and was last changed this long
# ago: file times advance in clock ticks (milliseconds), so a socket bound in the same tick
# as the listing would not change the mtime it is checked by.
SETTLED_NS = 1_000_000_000


def _sockets(directory: Path) -> list[str]:
    """The sockets in ``directory`` (none when it does not exist). Listed again only when
    the directory has changed: each enqueue announces, and most find the same workers."""
    try:
        mtime = os.stat(directory).st_mtime_ns
    except OSError:
        return []  # no directory: nobody listens
    known = _LISTINGS.get(directory)
    if known is not None and known[0] == mtime and time.time_ns() - mtime > SETTLED_NS:
        return known[1]
    try:
        entries = [entry.path for entry in os.scandir(directory) if entry.name.endswith(SUFFIX)]
    except OSError:
        return []
    _LISTINGS[directory] = (mtime, entries)
    return entries


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class SocketListener:
    """A worker's end: ``run()`` (in a thread of its own) calls ``wake()`` on every datagram
    until ``stop()``; ``supported`` is False where :func:`wake_dir` gives no directory."""

    def __init__(self, alias: str, wake: Callable[[], None], log: logging.Logger) -> None:
        self.wake = wake
        self.log = log
        self.directory = wake_dir(alias)
        self.supported = self.directory is not None
        self.path: str | None = None
        self._stop = False
        self._sock: socket.socket | None = None

    def open(self) -> bool:
        """Bind the socket (before the thread starts, so that no wake-up sent after the
        worker has started is lost). False, and the worker polls, if that fails."""
        if self.directory is None:
            return False
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            path = str(self.directory / f"{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(path)
            sock.settimeout(1.0)
        except OSError:
            self.log.warning("cannot listen for wake-ups in %s; polling only", self.directory, exc_info=True)
            return False
        self._sock, self.path = sock, path
        return True

    def stop(self) -> None:
        self._stop = True

    def run(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            while not self._stop:
                try:
                    sock.recv(64)
                except TimeoutError:
                    continue
                except OSError:
                    self.log.warning("wake-up socket failed; polling only", exc_info=True)
                    return
                self.wake()
        finally:
            sock.close()
            if self.path is not None:
                _remove(self.path)


def notify_new_work(alias: str) -> None:
    """Tell listening workers that work was enqueued. PostgreSQL: ``pg_notify``, sent
    inside the transaction, so PostgreSQL delivers it only if (and when) the transaction
    commits. SQLite: a datagram to each worker's wake-up socket (:mod:`.wakeup`), sent once
    the transaction has committed (at once in autocommit)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    elif connection.vendor == "sqlite":
        if not connection.in_atomic_block and connection.get_autocommit():
            announce(alias)  # what on_commit does here, without its machinery
        else:
            transaction.on_commit(lambda: announce(alias), using=alias)


def listener(alias: str, wake: Callable[[], None], log: logging.Logger) -> Listener | SocketListener:
    """The wake-up listener for database ``alias``: LISTEN on PostgreSQL, a datagram
    socket for a file-backed SQLite database; ``supported`` is False elsewhere."""
    if connections[alias].vendor == "sqlite":
        return SocketListener(alias, wake, log)
    return Listener(alias, wake, log)


class Listener:
    """A dedicated PostgreSQL connection that LISTENs for new work and calls ``wake()``.

    Elsewhere ``supported`` is False (see :func:`listener` for SQLite).
    """

    def __init__(self, alias: str, wake: Callable[[], None], log: logging.Logger) -> None:
        self.alias = alias
        self.wake = wake
        self.log = log
        self.supported = connections[alias].vendor == "postgresql"
        self._stop = False

    def open(self) -> bool:
        return self.supported

    def stop(self) -> None:
        self._stop = True

    def _params(self) -> dict[str, Any]:
        params = connections[self.alias].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        return params

    def run(self) -> None:
        import psycopg

        failures = 0
        tested = False
        while not self._stop:
            try:
                with psycopg.connect(**self._params(), autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    failures = 0
                    if not tested:
                        tested = True
                        if not self._delivered(conn):
                            return
                    self.wake()  # work may have arrived while we were not listening
                    while not self._stop:
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self.wake()
            except Exception as exc:
                failures += 1
                if failures == 1:  # most often ended by the server: a new connection serves at once
                    self.log.warning("LISTEN connection lost (%s); listening again", first_line(exc))
                    continue
                self.log.warning("LISTEN connection lost; polling until it is back", exc_info=True)
                time.sleep(min(30.0, 0.5 * 2 ** min(failures - 1, 6)))

    def _delivered(self, conn: Any) -> bool:
        """Whether a notification sent from another connection reaches this one. A
        transaction-mode pooler (PgBouncer) accepts LISTEN but hands the server connection
        to other clients between statements, so nothing would ever arrive: say so once and
        leave the worker to its poll, instead of waiting for wake-ups that never come."""
        import psycopg

        token = f"probe:{secrets.token_hex(8)}"
        with psycopg.connect(**self._params(), autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, %s)", [CHANNEL, token])
        deadline = time.monotonic() + PROBE_TIMEOUT
        while (left := deadline - time.monotonic()) > 0 and not self._stop:
            for notify in conn.notifies(timeout=left, stop_after=1):
                if notify.payload == token:
                    self.log.info("listening for wake-ups on database '%s'", self.alias)
                    return True
                self.wake()  # another process's wake-up, meanwhile
        if not self._stop:
            self.log.warning(
                "LISTEN on database '%s' did not deliver a test notification within %.0f s: is a "
                "transaction-mode pooler (PgBouncer) in between? Wake-ups are off, the worker polls; "
                "set DURABLE_SCHEDULER_LISTEN = False to skip LISTEN",
                self.alias,
                PROBE_TIMEOUT,
            )
        return False


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its class: a log line, not a traceback."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
