"""An idle worker wakes on enqueue, not at its next poll: PostgreSQL LISTEN/NOTIFY, and on
SQLite a datagram to each worker's wake-up socket (django_durable_scheduler.db.wakeup)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

import django_durable_scheduler as scheduler
from django_durable_scheduler.db import wakeup
from django_durable_scheduler.models import Occurrence, WorkerHeartbeat

from ..conftest import AUTHORITY, ROOT, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor not in ("postgresql", "sqlite"), reason="MySQL/MariaDB workers poll"
    ),
]


@contextmanager
def idle_worker(worker_id: str) -> Iterator[subprocess.Popen[str]]:
    """A runscheduler whose next poll is a minute away, once it has started; stopped with
    SIGTERM (and required to exit 0) at the end."""
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("job", "test.ok", authority=AUTHORITY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "runscheduler", "--poll-interval", "60", "--worker-id", worker_id],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not WorkerHeartbeat.objects.filter(pk=worker_id).exists():
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_enqueue_wakes_an_idle_worker():
    with idle_worker("listener"):
        time.sleep(1.5)  # let it go idle (its next poll is a minute away)
        # The first enqueue of a job reads it; the second takes the path for a job this
        # process has enqueued before (on SQLite, its own transaction): both wake.
        for key in ("t", "t2"):
            occ, _ = scheduler.enqueue("job", scheduled_for=1_700_000_000_000, trigger_key=key)
            started = time.monotonic()
            while not Occurrence.objects.filter(pk=occ.pk, status="succeeded").exists():
                assert time.monotonic() - started < 10, f"the enqueue of {key!r} did not wake the worker"
                time.sleep(0.02)
            time.sleep(0.5)  # idle again


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the wake-up sockets are SQLite's")
def test_wakeup_sockets_come_and_go_with_workers_and_stale_ones_are_removed():
    directory = wakeup.wake_dir("default")
    assert directory is not None
    assert wakeup.wake_dir("default") == directory  # one directory per database file
    directory.mkdir(mode=0o700, exist_ok=True)
    # A socket file whose worker was killed (nobody reads it): the next announce removes it.
    stale = str(directory / f"999999-dead{wakeup.SUFFIX}")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(stale)
    dead.close()
    wakeup.announce("default")
    assert not os.path.exists(stale)
    with idle_worker("sock") as proc:
        mine = [p for p in directory.iterdir() if p.name.startswith(f"{proc.pid}-")]
        assert len(mine) == 1, "the worker listens on one socket"
        assert wakeup.announce("default") >= 1
    assert not mine[0].exists(), "a worker that stops removes its socket"


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the wake-up sockets are SQLite's")
def test_wakeup_listing_is_reused_only_while_the_directory_is_settled(tmp_path, monkeypatch):
    """announce lists the directory again whenever it changed, and whenever it changed
    within the last second (file times move in clock ticks: a socket bound in the tick of
    the last listing would leave the time as it was)."""
    listed = []
    scandir = os.scandir
    monkeypatch.setattr(wakeup.os, "scandir", lambda path: listed.append(path) or scandir(path))
    directory = tmp_path / "wake"
    assert wakeup._sockets(directory) == []  # no directory: nobody listens
    directory.mkdir()
    assert wakeup._sockets(directory) == [] and len(listed) == 1
    assert wakeup._sockets(directory) == [] and len(listed) == 2, "changed within the second"
    settled = time.time_ns() - 2 * wakeup.SETTLED_NS
    os.utime(directory, ns=(settled, settled))
    assert wakeup._sockets(directory) == [] and len(listed) == 3
    assert wakeup._sockets(directory) == [] and len(listed) == 3, "settled and unchanged: reused"
    path = str(directory / f"1-w{wakeup.SUFFIX}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        assert wakeup._sockets(directory) == [path] and len(listed) == 4
        os.utime(directory, ns=(settled, settled))  # as if bound in the listing's tick
        wakeup._sockets(directory)
        os.unlink(path)
        os.utime(directory, ns=(settled, settled))
        assert wakeup._sockets(directory) == [path], "the listing of the same settled time"
        # A send that fails drops the listing: the next announce lists again.
        monkeypatch.setattr(wakeup, "wake_dir", lambda alias: directory)
        assert wakeup.announce("default") == 0
        assert wakeup._sockets(directory) == [] and len(listed) == 6


def test_no_wakeup_directory_where_there_is_nothing_to_wake():
    if connection.vendor != "sqlite":
        assert wakeup.wake_dir("default") is None
        assert wakeup.announce("default") == 0
        return
    from django.db import connections

    conn = connections["default"]
    saved = conn.settings_dict["NAME"]
    try:
        conn.settings_dict["NAME"] = ":memory:"
        assert wakeup.wake_dir("default") is None
        conn.settings_dict["NAME"] = "file:memdb1?mode=memory&cache=shared"
        assert wakeup.wake_dir("default") is None
    finally:
        conn.settings_dict["NAME"] = saved


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's wake-up is sent by the enqueuing process")
@pytest.mark.parametrize("remembered", [False, True], ids=["first enqueue", "remembered job"])
def test_sqlite_wakeup_is_sent_once_the_enqueue_has_committed(monkeypatch, remembered):
    """Outside a transaction the wake-up follows the enqueue's own commit at once; inside
    the caller's it waits for that commit, and a rollback sends none."""
    from django.db import transaction

    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("job", "test.ok", authority=AUTHORITY)
    if remembered:
        scheduler.enqueue("job", scheduled_for=0, trigger_key="first")
    sent: list[bool] = []
    monkeypatch.setattr(wakeup, "announce", lambda alias: sent.append(connection.in_atomic_block) or 0)
    scheduler.enqueue("job", scheduled_for=0, trigger_key="alone")
    assert sent == [False]
    with transaction.atomic():
        scheduler.enqueue("job", scheduled_for=0, trigger_key="inside")
        assert sent == [False]
    assert sent == [False, False]
    with pytest.raises(RuntimeError), transaction.atomic():
        scheduler.enqueue("job", scheduled_for=0, trigger_key="undone")
        raise RuntimeError
    assert sent == [False, False]
    assert not Occurrence.objects.filter(trigger_key="undone").exists()
