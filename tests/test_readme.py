"""The README's quickstart, and the tutorial that goes on from it (docs/tutorial.md), followed to
the letter in a fresh ``django-admin startproject``.

Every fenced Python block of the README and the tutorial runs, in that order: a block whose
first line names a file (``# myapp/tasks.py``) becomes that file, the settings block is appended
to the project's settings, and every other block runs in ``manage.py shell`` once the database is
migrated. Every ``python manage.py`` command of their shell blocks and of the quickstart's steps runs
too (``runscheduler`` with ``--burst``, so that it ends). Nothing in either can go stale
unnoticed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.db import connection

from .conftest import ROOT

pytestmark = [
    # The quickstart's project is a fresh one on its own SQLite file: once per Django version.
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the quickstart project runs on SQLite"),
    pytest.mark.slow,
]

README = (ROOT / "README.md").read_text()
# The README's quickstart, then the tutorial's steps: one guide, read in that order.
GUIDE = README + "\n" + (ROOT / "docs" / "tutorial.md").read_text()
# Fenced blocks, also those indented under a list item.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
FILE_MARK = re.compile(r"^# (?P<path>[\w/]+\.py)\n")
QUICKSTART = README.split("## Quickstart", 1)[-1].split("\n## ", 1)[0]
QUICKSTART_BLOCKS = [textwrap.dedent(m["body"]) for m in FENCE.finditer(QUICKSTART)]
INLINE_MANAGE = re.compile(r"`(python manage\.py [^`]+)`")


def blocks(lang: str) -> list[str]:
    return [textwrap.dedent(m["body"]) for m in FENCE.finditer(GUIDE) if m["lang"] == lang]


def is_settings(block: str) -> bool:
    return "INSTALLED_APPS" in block or "DATABASES" in block


def manage_commands() -> list[str]:
    """The ``python manage.py`` commands of the README and the tutorial, in the order a reader
    meets them."""
    found: list[tuple[int, str]] = []
    for match in FENCE.finditer(GUIDE):
        if match["lang"] == "bash":
            offset = match.start()
            for line in match["body"].splitlines():
                if line.startswith("python manage.py "):
                    found.append((offset, line))
    start = GUIDE.index(QUICKSTART)
    found += [(start + m.start(), m[1]) for m in INLINE_MANAGE.finditer(QUICKSTART)]
    return [command for _, command in sorted(found)]


TRY_IT = "## Try it, develop it"


def try_it_commands() -> list[list[str]]:
    """The commands of the README's "Try it, develop it" part, without their comments."""
    part = README.split(TRY_IT, 1)[1].split("\n## ", 1)[0]
    lines = (line for m in FENCE.finditer(part) if m["lang"] == "bash" for line in m["body"].splitlines())
    return [line.split("#", 1)[0].split() for line in lines if line.strip()]


def test_the_readme_opens_with_what_the_app_is_then_how_to_try_it():
    # What the app is and who it is for, in prose; then the two commands; then the quickstart.
    title, opening = README.split("\n\n", 2)[:2]
    assert title == "# django-durable-scheduler"
    assert opening.startswith("A reusable Django app for ") and "```" not in opening
    assert README.index(TRY_IT) < README.index("## Quickstart")
    assert try_it_commands() == [["python3", "example_project/run.py"], ["python3", "tests/run.py"]]
    for _, script in try_it_commands():
        assert (ROOT / script).is_file(), script


@pytest.mark.skipif(not (ROOT / ".ci" / "run").exists(), reason="no .ci/run beside these tests")
def test_ci_runs_the_readme_test_command():
    (test_command,) = (command for command in try_it_commands() if command[1] == "tests/run.py")
    (ci_call,) = (
        line.split() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("exec ")
    )
    assert ci_call[1:] == [*test_command, "--require-all", "--install-system-deps"]


class Project:
    def __init__(self, where: Path) -> None:
        self.dir = where
        unset = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")
        self.env = {k: v for k, v in os.environ.items() if k not in unset}
        # The package this test run imports (a worktree's, or a wheel's when ROOT has none).
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
        where.mkdir()
        self.run("-m", "django", "startproject", "mysite", ".")
        self.manage("startapp", "myapp")

    def run(self, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=cwd or self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{output[-6000:]}"
        return output

    def manage(self, *args: str) -> str:
        return self.run("manage.py", *args)

    def shell(self, code: str) -> str:
        return self.manage("shell", "-c", code)


def test_the_readme_python_blocks_exist():
    # The quickstart's settings block, one handler file and code to run in the shell at least.
    python = blocks("python")
    assert any("INSTALLED_APPS" in block for block in python)
    assert any(FILE_MARK.match(block) for block in python)
    assert manage_commands()


def test_quickstart_in_a_fresh_project(tmp_path):
    project = Project(tmp_path / "mysite")
    settings = project.dir / "mysite" / "settings.py"
    # The reader's own app is installed as any app is; the README's block does the rest.
    settings.write_text(settings.read_text() + '\nINSTALLED_APPS += ["myapp"]\n')
    in_shell: list[str] = []
    other_database_settings: list[str] = []
    for block in blocks("python"):
        if mark := FILE_MARK.match(block):
            (project.dir / mark["path"]).write_text(block)
        elif is_settings(block) and block in QUICKSTART_BLOCKS:
            settings.write_text(settings.read_text() + "\n" + block)
        elif is_settings(block):
            other_database_settings.append(block)
        else:
            in_shell.append(block)

    outputs = []
    for command in manage_commands():
        args = shlex.split(command)[2:]
        if args[0] == "runscheduler":
            args.append("--burst")  # the quickstart's scheduler runs until Ctrl-C
        outputs.append(project.manage(*args))
    assert "durable_scheduler.W001" not in "".join(outputs)  # the settings block took effect
    # The README's test (docs/testing.md) ran in the project's TestCase, and passed.
    tested = [out for command, out in zip(manage_commands(), outputs, strict=True) if " test " in command]
    assert tested and all("Ran 1 test" in out and "\nOK" in out for out in tested), tested

    # The declared job exists with its next fire time, and it runs when due.
    project.shell(
        "import django_durable_scheduler as s; from django.utils import timezone;"
        "job = s.get_job('daily-report'); assert job.next_fire_at, job;"
        "s.enqueue('daily-report', scheduled_for=timezone.now(), trigger_key='readme')"
    )
    ran = project.manage("runscheduler", "--burst")
    assert "sending to team@example.com (attempt 1)" in ran, ran
    project.shell(
        "from django_durable_scheduler.models import Occurrence;"
        "o = Occurrence.objects.get(trigger_key='readme');"
        "assert o.status == 'succeeded' and o.result == {'sent': 12}, (o.status, o.last_error)"
    )

    for block in in_shell:
        project.shell(block)
    # Settings for another database than the quickstart's SQLite: they run against settings of
    # that shape, and leave OPTIONS that Django's backend takes.
    for block in other_database_settings:
        namespace = {"DATABASES": {"default": {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {}}}}
        exec(compile(block, "README.md", "exec"), namespace)
        assert isinstance(namespace["DATABASES"]["default"]["OPTIONS"], dict)

    # Step 8: the admin lists the job.
    project.shell(
        "from django.test.utils import setup_test_environment; setup_test_environment();"
        "from django.contrib.auth.models import User; from django.test import Client;"
        "User.objects.create_superuser('root', 'root@example.com', 'pw'); c = Client();"
        "assert c.login(username='root', password='pw');"
        "page = c.get('/admin/durable_scheduler/job/').content.decode();"
        "assert 'daily-report' in page and 'invoices' in page, page[:2000]"
    )
