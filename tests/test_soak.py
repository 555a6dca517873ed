"""The soak of bench/soak.py, two minutes of it on PostgreSQL: the mixed load with workers
SIGKILLed every few seconds, one restart of the server and the clock moved across a UTC midnight,
then the audit. Only the audit's verdicts are asserted, never a timing (timings belong in
bench/, where the thirty-minute run is recorded)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from .conftest import ROOT, database_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.restarts_database_server,
    # The Django 6 legs run a copy of tests/ beside the installed wheel, without bench/.
    pytest.mark.skipif(not (ROOT / "bench" / "soak.py").is_file(), reason="no bench/ beside these tests"),
]


def test_a_two_minute_soak_passes_its_audit(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the soak runs on PostgreSQL (it restarts the server and rolls day partitions)")
    if not (shutil.which("pg_ctlcluster") and Path("/etc/postgresql").is_dir()):
        pytest.skip("needs a local PostgreSQL cluster managed by pg_ctlcluster")
    # A database of its own beside the test database's name (the soak drops only names with 'soak').
    url = f"{database_url()}_soak"
    out = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--minutes", "2", "--url", url, "--json", str(out), "--drop"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    report = proc.stdout[-8000:] + proc.stderr[-4000:]
    assert out.exists(), report
    failed = [check for check in json.loads(out.read_text())["checks"] if not check["ok"]]
    assert not failed, report
    assert proc.returncode == 0, report
