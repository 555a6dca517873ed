"""The example project as a new user runs it: ``python3 example_project/run.py`` migrates, seeds,
prints the admin's address and password, and serves the admin beside the scheduler until Ctrl-C.
A browser logs in with what it printed and sees the demo jobs and their finished work."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from .browser import TIMEOUT_MS, skip_unless_browser
from .conftest import ROOT

pytestmark = [
    skip_unless_browser(),
    # The example runs on its own SQLite file whatever the leg's database: once is enough.
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the example project runs on SQLite"),
    pytest.mark.slow,
]

ADMIN_LINE = re.compile(
    r"The admin: (?P<url>http://\S+/admin/)\s+\(user (?P<user>\S+), password (?P<password>\S+)\)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Example:
    """``example_project/run.py`` in its own process group (as a terminal runs it), its output
    collected as it comes."""

    def __init__(self, tmp_path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")}
        env.update(
            EXAMPLE_PYTHON=sys.executable,  # this venv has what .venv-example would
            DATABASE_URL=f"sqlite:///{tmp_path / 'example.sqlite3'}",
            PORT=str(_free_port()),
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "example_project" / "run.py")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 120) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if match := pattern.search(self.output()):
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"run.py never printed {pattern.pattern!r}:\n{self.output()[-4000:]}")

    def ctrl_c(self) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=90)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def example(tmp_path: Path) -> Iterator[Example]:
    running = Example(tmp_path)
    yield running
    running.kill()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


def test_run_py_serves_the_admin_beside_the_scheduler(example, browser):
    admin = example.wait_for(ADMIN_LINE)
    url, user, password = admin["url"], admin["user"], admin["password"]
    deadline = time.monotonic() + 60
    while not _answers(url) and time.monotonic() < deadline:
        time.sleep(0.2)
    # The scheduler runs the seeded work: the flaky job succeeds on its retry.
    example.wait_for(re.compile(r"succeeded job=demo-flaky kind=demo.flaky attempt=2/"))
    # A view enqueues a Django task (docs/tasks.md); the scheduler runs it.
    greet = url.removesuffix("admin/") + "greet/"
    with urllib.request.urlopen(f"{greet}?name=Ada", timeout=10) as response:
        assert response.status == 202
        result_id = json.load(response)["id"]
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(f"{greet}?id={result_id}", timeout=10) as response:
            result = json.load(response)
        if result["status"] == "SUCCESSFUL" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert result == {"id": result_id, "status": "SUCCESSFUL", "return_value": {"greeted": "Ada"}}

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(f"{url}login/?next=/admin/")
        page.fill("#id_username", user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url(url)
        page.goto(f"{url}durable_scheduler/job/")
        jobs = page.locator("#result_list").inner_text()
        for job_id in (
            "demo-hello",
            "demo-flaky",
            "demo-fanout",
            "demo-berlin-minutely",
            "task-schedule:default:demo.tasks.tidy_up",  # a Django task's cron schedule
        ):
            assert job_id in jobs
        page.goto(f"{url}durable_scheduler/occurrence/?status__exact=succeeded")
        assert "demo-flaky" in page.locator("#result_list").inner_text()
    finally:
        context.close()

    # Ctrl-C stops both the scheduler and the admin's server.
    assert example.ctrl_c() in (0, 130), example.output()[-4000:]
    assert not _answers(url)
