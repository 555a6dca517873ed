"""The example project's own tests, which use the testing toolkit as a project would
(docs/testing.md shows them): ``manage.py test demo`` (unittest style, Django's runner) and
pytest with pytest-django and this app's plugin, each in a process of its own on the
example's settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from .conftest import ROOT
from .tree import reads_the_tree

EXAMPLE = ROOT / "example_project"

pytestmark = [
    # The example runs on SQLite (a test database in memory) whatever the leg's database.
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the example project runs on SQLite"),
    pytest.mark.skipif(not EXAMPLE.is_dir(), reason="no example project beside these tests"),
]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_XDIST")}
    # A file of the test's own: the checks open the database the settings name, even for tests.
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'example.sqlite3'}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, *args], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_unittest_style_tests_pass_under_djangos_runner(tmp_path):
    ran = _run(tmp_path, "manage.py", "test", "demo", "-v", "2")
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output[-6000:]
    assert "Ran 8 tests" in output and "OK" in output


def test_the_pytest_style_tests_pass_with_the_plugin(tmp_path):
    plugin = "django_durable_scheduler.testing.plugin"
    ran = _run(
        tmp_path,
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", plugin,
        "--ds=example_project.settings", "--rootdir=.", "demo/test_with_pytest.py",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    assert "2 passed" in ran.stdout


FENCE = re.compile(r"^```python\n(?P<body>.*?)^```", re.S | re.M)


@reads_the_tree
def test_the_testing_page_shows_the_example_tests_word_for_word():
    """Each example of docs/testing.md is code of the example project's tests, which the
    tests above run: the page cannot show a test that does not pass."""
    page = (ROOT / "docs" / "testing.md").read_text()
    sources = "".join((EXAMPLE / "demo" / name).read_text() for name in ("tests.py", "test_with_pytest.py"))
    examples = [m["body"] for m in FENCE.finditer(page) if m["body"].startswith(("class ", "def "))]
    assert len(examples) == 7
    missing = [example.splitlines()[0] for example in examples if example not in sources]
    assert not missing, f"docs/testing.md shows code the example's tests do not have: {missing}"
