"""``example_project/run.py`` owns its children: a signal to the launcher alone (``kill``, a
process manager, a closed session) stops the admin's server and the scheduler, frees the port and
ends the launcher; a child that dies takes the launcher and the other child down; a launcher
killed outright (SIGKILL) does not leave them running (Linux). Real processes throughout, started
as the README's first command does, with this venv's interpreter instead of ``.venv-example``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from .test_example_project import ADMIN_LINE, Example, _answers

pytestmark = [
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the example project runs on SQLite"),
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="reads process groups from /proc (Linux)"
    ),
    pytest.mark.slow,
]

SCHEDULER_STARTED = re.compile(r"worker \S+: concurrency \d+")


def _processes() -> Iterator[tuple[int, int, int, str]]:
    """(pid, parent pid, process group, command line) of every live process (zombies excluded)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # it ended while we looked
        # The command name (in parentheses) may hold spaces: the fields follow its last ")".
        state, ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if state != "Z":
            yield int(entry.name), int(ppid), int(pgrp), cmdline


def _group_members(pgids: set[int]) -> list[str]:
    return [f"{pid} {cmd}" for pid, _, pgrp, cmd in _processes() if pgrp in pgids]


class Launched(Example):
    """The launcher serving, with its two children found: ``groups`` maps each child's name to
    its process group (its own: the launcher starts each in a session of its own)."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.groups: dict[str, int] = {}

    def serve(self) -> str:
        """Wait until the admin answers and the scheduler runs; the admin's URL."""
        url = self.wait_for(ADMIN_LINE)["url"]
        self.wait_for(SCHEDULER_STARTED)
        deadline = time.monotonic() + 60
        while not _answers(url):
            assert time.monotonic() < deadline, f"the admin never answered:\n{self.output()[-4000:]}"
            time.sleep(0.2)
        for pid, ppid, pgrp, cmd in _processes():
            if ppid == self.proc.pid:
                name = "runserver" if " runserver " in cmd else "runscheduler"
                assert name in cmd and pgrp == pid, cmd
                self.groups[name] = pgrp
        assert set(self.groups) == {"runserver", "runscheduler"}, self.output()[-4000:]
        return url

    def signal_launcher(self, signum: int) -> None:
        """The launcher alone, not its group: as ``kill`` or a process manager sends it."""
        os.kill(self.proc.pid, signum)

    def left_behind(self, timeout: float = 0) -> list[str]:
        """The children's processes still alive after ``timeout`` seconds at most."""
        deadline = time.monotonic() + timeout
        while (alive := _group_members(set(self.groups.values()))) and time.monotonic() < deadline:
            time.sleep(0.2)
        return alive

    def kill(self) -> None:
        super().kill()
        for pgid in self.groups.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Launched]:
    running = Launched(tmp_path)
    yield running
    running.kill()


def _port_is_free(url: str) -> bool:
    port = urllib.parse.urlsplit(url).port
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as runserver binds it
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return not _answers(url)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_alone_stops_both_children(launched, signum):
    url = launched.serve()
    launched.signal_launcher(signum)
    code = launched.proc.wait(timeout=90)
    output = launched.output()
    assert code == 128 + signum, output[-4000:]
    assert f"run.py: {signal.Signals(signum).name}: stopping runserver and runscheduler" in output
    assert "signal SIGTERM: stopping (grace" in output  # runscheduler's graceful stop
    assert launched.left_behind() == []  # the launcher waited for them
    assert _port_is_free(url)


def test_a_child_that_dies_takes_the_launcher_and_the_other_child_down(launched):
    url = launched.serve()
    os.killpg(launched.groups["runserver"], signal.SIGKILL)
    code = launched.proc.wait(timeout=90)
    output = launched.output()
    assert code == 1, output[-4000:]
    assert "run.py: runserver was killed by SIGKILL; stopping runscheduler" in output
    assert launched.left_behind() == []
    assert _port_is_free(url)


def test_a_killed_launcher_leaves_no_child_running(launched):
    """SIGKILL gives the launcher no chance: Linux sends each child SIGTERM as it dies."""
    url = launched.serve()
    launched.signal_launcher(signal.SIGKILL)
    launched.proc.wait(timeout=10)
    assert launched.left_behind(timeout=60) == [], launched.output()[-4000:]
    assert _port_is_free(url)
