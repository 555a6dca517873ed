"""A maintainer's routine schema change: columns with defaults added to Occurrence, Job and
Event, Job.kind widened, an index added; ``makemigrations`` writes the migration, which is
applied to a database holding rows, and then rolled back. The scheduler's operations
(enqueue, the remembered job's enqueue, enqueue_many, claim_batch, claim, settle) must work
at each step: with the edited code after the migration, with the original code after the
rollback.

Each step is a subprocess (tests/procs/schema_steps.py, ``django-admin``) on a scratch
database of this leg's kind that the test creates and drops itself (a temporary SQLite file,
or a database named after this process on the leg's PostgreSQL or MariaDB server), with the
original package or an edited copy of it first on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from .conftest import ROOT
from .procs.scratch import scratch_database

pytestmark = pytest.mark.slow

APP = "durable_scheduler"
PACKAGE = "django_durable_scheduler"
SETTINGS = "tests.procs.schema_settings"
# (text in models.py, what replaces it): each must be there exactly once.
EDITS = (
    (
        "    kind = models.CharField(max_length=128, db_index=True)\n",
        "    kind = models.CharField(max_length=200, db_index=True)\n"
        '    team = models.CharField(max_length=64, default="")\n',
    ),
    (
        "    receipt = models.JSONField(null=True, blank=True, default=None)\n",
        "    receipt = models.JSONField(null=True, blank=True, default=None)\n"
        "    urgency = models.SmallIntegerField(default=0)\n"
        '    lane = models.CharField(max_length=16, db_default="main")\n',
    ),
    (
        '            models.Index(fields=["job", "trigger_key"], name="dsch_occurrences_job_trigger"),\n',
        '            models.Index(fields=["job", "trigger_key"], name="dsch_occurrences_job_trigger"),\n'
        '            models.Index(fields=["job", "created_at"], name="dsch_occ_job_created"),\n',
    ),
    (
        '            models.Index(fields=["occurrence", "event_id"], name="dsch_events_occurrence"),\n',
        '            models.Index(fields=["occurrence", "event_id"], name="dsch_events_occurrence"),\n'
        '            models.Index(fields=["event_type", "occurred_at"], name="dsch_events_type_time"),\n',
    ),
    (
        "    data = models.JSONField(default=dict)\n",
        "    data = models.JSONField(default=dict)\n"
        '    source = models.CharField(max_length=32, default="")\n',
    ),
)
OPERATIONS = {
    ("AddField", "job", "team"),
    ("AlterField", "job", "kind"),
    ("AddField", "occurrence", "urgency"),
    ("AddField", "occurrence", "lane"),
    ("AddIndex", "occurrence", "dsch_occ_job_created"),
    ("AddField", "event", "source"),
    ("AddIndex", "event", "dsch_events_type_time"),
}


@pytest.fixture
def scratch_url(tmp_path):
    """DATABASE_URL of an empty database of this leg's kind, dropped afterwards."""
    with scratch_database(tmp_path, "dsch_schema") as url:
        yield url


def package_source(code: Path) -> Path:
    """The package a run with ``code`` first on the path imports: ``code``'s own copy, or else
    the one this test imports (the checkout's, or an installed wheel's)."""
    own = code / PACKAGE
    return own if own.is_dir() else Path(importlib.import_module(PACKAGE).__file__ or "").parent


def edited_copy(where: Path) -> Path:
    """A copy of the package whose models.py has the maintainer's edits; returns the directory
    to put first on PYTHONPATH."""
    target = where / PACKAGE
    shutil.copytree(package_source(ROOT), target, ignore=shutil.ignore_patterns("__pycache__"))
    models = target / "models.py"
    text = models.read_text()
    for old, new in EDITS:
        assert text.count(old) == 1, f"models.py no longer has this line once: {old!r}"
        text = text.replace(old, new)
    models.write_text(text)
    return where


def latest_migration() -> str:
    (leaf,) = (name for app, name in MigrationLoader(None).graph.leaf_nodes() if app == APP)
    return leaf


def run(code: Path, url: str, *args: str) -> str:
    """``python <args>`` with ``code``'s package first on the path; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "VIRTUAL_ENV")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE=SETTINGS,
        PYTHONPATH=os.pathsep.join(filter(None, (str(code), str(ROOT), os.environ.get("PYTHONPATH")))),
    )
    # cwd is code's directory: ``python -m`` puts the working directory first on sys.path.
    proc = subprocess.run(
        [sys.executable, *args], cwd=code, env=env, capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} with {code} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc.stdout


def step(code: Path, url: str, name: str) -> dict:
    out = run(code, url, "-m", "tests.procs.schema_steps", name)
    (line,) = (line for line in out.splitlines() if line.startswith("RESULT "))
    facts = json.loads(line.removeprefix("RESULT "))
    if "module" in facts:
        assert Path(facts["module"]).is_relative_to(package_source(code)), facts["module"]
    return facts


def written_operations(path: Path) -> tuple[set[tuple[str, str, str]], list]:
    spec = importlib.util.spec_from_file_location(f"dsch_schema_change_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    migration = module.Migration
    ops = {
        (type(op).__name__, op.model_name, op.index.name if hasattr(op, "index") else op.name)
        for op in migration.operations
    }
    return ops, list(migration.dependencies)


def check_phase(facts: dict, tag: str, *, before: int, leased_by: str, leased: int) -> None:
    """What exercise(tag) in tests/procs/schema_steps.py must have done, whichever code ran."""
    assert facts["before"]["occurrences"] == before
    enqueue = facts["enqueue"]
    # A new row, a new row (on PostgreSQL and SQLite by the remembered job's one statement),
    # then the first one again.
    assert enqueue["deduplicated"] == [False, False, True] and enqueue["same_row"]
    assert enqueue["remembered"] == enqueue["guarded_insert"]
    # 50 items: 49 new, item 17 a row seeded before the migration.
    assert facts["enqueue_many"] == {"deduplicated": [17], "duplicate_is_seeded_row": True, "distinct": 50}
    assert facts["other_job_deduplicated"] is False
    assert facts["inserted"] == 52
    assert facts["enqueued_events"] == {"count": 52, "for_inserted_rows": True}
    assert facts["claimed"] == {"batch": 10, "single": True, "distinct": 11}
    assert facts["claimed_running"]
    assert facts["settled"] == ["succeeded", "dead_letter", "retry_wait", "succeeded"]
    assert facts["result"] == {"phase": tag}
    # Rows leased before the migration (forward or back) settle under their old lease.
    assert facts["leased_before"] == {"owners": [leased_by], "statuses": ["succeeded"], "count": leased}
    assert facts["after"]["occurrences"] == before + 52


def check_partitions(facts: dict, tag: str, *, with_index: bool) -> None:
    """PostgreSQL's partitioned events (tests/procs/schema_steps.py, partition_steps): the
    default partition and partitions made after the change hold rows of the changed model and
    read them back, and every partition has the model's indexes (the edited one only after the
    change). Nothing to check where events are a plain table."""
    found = facts["partitions"]
    if connection.vendor != "postgresql":
        assert found == {}
        return
    first = found["made"][0]
    day = first.removeprefix("durable_scheduler_events_p")
    assert day == {"new": "20320110", "old": "20320210"}[tag] and len(found["made"]) == 4
    assert found["where"] == {
        "caught": found["made"][1],  # caught by the default partition, moved to its new day
        "late": "durable_scheduler_events_pdefault",
        "new": first,
    }
    assert found["read"] == {"caught": "caught", "late": "late", "new": "new"}
    assert found["source"] == ([""] if with_index else [None])
    assert found["indexed"] == dict.fromkeys(found["indexed"], with_index)


def test_added_columns_widened_column_and_index_migrate_forward_and_back(tmp_path, scratch_url):
    original = ROOT
    copy = edited_copy(tmp_path / "edited")
    previous = latest_migration()
    url = scratch_url

    # The original code: its migrations, and rows in every state the change must carry.
    run(original, url, "-m", "django", "migrate", "--noinput", "-v", "0")
    seed = step(original, url, "seed")
    assert seed["statuses"] == ["succeeded", "dead_letter", "running"]
    original_schema = seed["schema"]
    assert original_schema["kind_size"] == 128
    for table, column in (("jobs", "team"), ("occurrences", "urgency"), ("events", "source")):
        assert column not in original_schema["columns"][f"durable_scheduler_{table}"]
    assert "dsch_occ_job_created" not in original_schema["indexes"]

    # The maintainer's makemigrations: one new file, these operations, after the latest.
    migrations_dir = copy / PACKAGE / "migrations"
    files = set(migrations_dir.glob("0*.py"))
    run(copy, url, "-m", "django", "makemigrations", APP, "--noinput", "--name", "maintainer_edit")
    (written,) = set(migrations_dir.glob("0*.py")) - files
    operations, dependencies = written_operations(written)
    assert operations == OPERATIONS
    assert dependencies == [(APP, previous)]
    # Django's sqlmigrate reads it against this database (on PostgreSQL, partitioned events).
    sql = run(copy, url, "-m", "django", "sqlmigrate", APP, written.stem)
    assert "source" in sql and "dsch_events_type_time" in sql

    # Forward, on the rows, then everything with the edited code.
    run(copy, url, "-m", "django", "migrate", "--noinput", "-v", "0")
    new = step(copy, url, "new")
    schema = new["schema"]
    assert schema["kind_size"] == 200
    assert "team" in schema["columns"]["durable_scheduler_jobs"]
    assert "urgency" in schema["columns"]["durable_scheduler_occurrences"]
    assert "lane" in schema["columns"]["durable_scheduler_occurrences"]
    assert "source" in schema["columns"]["durable_scheduler_events"]
    assert "dsch_occ_job_created" in schema["indexes"]
    check_phase(new, "new", before=6, leased_by="w-seed", leased=1)
    # 6 seeded (succeeded, dead_letter, the leased one now succeeded, 3 queued), 52 new, 11 claimed.
    assert new["after"]["statuses"] == {
        "succeeded": 4,
        "dead_letter": 2,
        "retry_wait": 1,
        "running": 7,
        "queued": 44,
    }
    assert new["after"]["jobs"] == 2
    # The defaults: in the rows written by the new code, and in the rows from before.
    events = new["after"]["events"] - new["before"]["events"]
    assert new["urgency"] == {"new_rows": [0], "new_count": 52, "all_rows": [0]}
    # A db_default column is left to the database by every insert.
    assert new["lane"] == {"new_rows": ["main"], "new_count": 52, "all_rows": ["main"]}
    assert new["team"] == {"new_rows": [""], "new_count": 1, "all_rows": [""]}
    assert new["source"] == {"new_rows": [""], "new_count": events, "all_rows": [""]}

    check_partitions(new, "new", with_index=True)

    # Backward to the previous latest migration, then everything with the original code.
    run(copy, url, "-m", "django", "migrate", APP, previous, "--noinput", "-v", "0")
    old = step(original, url, "old")
    assert old["schema"] == original_schema
    # Every event the edited code wrote is still there (on PostgreSQL, the partition steps' three too).
    assert old["before"]["events"] == new["after"]["events"] + (3 if new["partitions"] else 0)
    check_phase(old, "old", before=58, leased_by="w-new", leased=7)
    assert old["after"]["statuses"] == {
        "succeeded": 13,
        "dead_letter": 3,
        "retry_wait": 2,
        "running": 7,
        "queued": 85,
    }
    assert old["after"]["jobs"] == 3
    assert not {"urgency", "lane", "team", "source"} & set(old)
    check_partitions(old, "old", with_index=False)
