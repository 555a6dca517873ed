"""The operations commands: ``scheduler_status`` (health) and ``scheduler_prune``."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, transaction

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.housekeeping import ops
from django_durable_scheduler.housekeeping.retention import plan as retention_plan
from django_durable_scheduler.models import (
    AuthorityPolicy,
    AuthorityReservation,
    AuthorityUsage,
    Event,
    Job,
    Occurrence,
    WorkerHeartbeat,
)

from ..conftest import AUTHORITY, ROOT, subprocess_env

pytestmark = pytest.mark.django_db


def run(command: str, *args: str) -> tuple[int, str, str]:
    """call_command; returns (exit code, stdout, stderr)."""
    out, err = StringIO(), StringIO()
    try:
        call_command(command, *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def status_json(*args: str) -> tuple[int, dict, str]:
    code, out, err = run("scheduler_status", "--json", *args)
    return code, json.loads(out), err


def worker(worker_id: str, last_seen: datetime, kinds=("reports.send",), stopped: datetime | None = None):
    return WorkerHeartbeat.objects.create(
        worker_id=worker_id,
        hostname="host-1",
        pid=4321,
        concurrency=4,
        kinds=list(kinds),
        started_at=last_seen - timedelta(minutes=5),
        last_seen_at=last_seen,
        stopped_at=stopped,
    )


def enqueue(clock, key: str, *, ago: float = 0, job_id: str = "job-a") -> Occurrence:
    return scheduler.enqueue(job_id, scheduled_for=clock() - timedelta(seconds=ago), trigger_key=key)[0]


# --------------------------------------------------------------------------- status


def test_status_of_an_idle_scheduler_is_healthy(db, clock):
    code, out, err = run("scheduler_status")
    assert (code, err) == (0, "")
    assert "due now: 0" in out
    assert out.strip().endswith("healthy")


def test_status_counts_and_oldest_due_lag(job, clock):
    enqueue(clock, "a", ago=30)
    enqueue(clock, "b", ago=10)
    enqueue(clock, "later", ago=-600)  # queued, not due yet
    assert scheduler.claim(owner="w", lease=60) is not None  # takes "a"
    worker("w", clock())
    code, data, _ = status_json()
    assert code == 0
    assert data["counts"] == {
        "queued": 2,
        "running": 1,
        "retry_wait": 0,
        "succeeded": 0,
        "dead_letter": 0,
        "cancelled": 0,
    }
    assert data["due"] == 1
    assert data["oldest_due_lag_seconds"] == 10.0
    assert data["oldest_due_at"] == "2026-01-05T11:59:50.000Z"
    assert data["healthy"] is True and data["problems"] == []


def test_running_with_an_expired_lease_counts_as_due_from_its_expiry(job, clock):
    enqueue(clock, "a", ago=100)
    scheduler.claim(owner="w", lease=30)
    clock.advance(45)
    worker("w", clock())
    _, data, _ = status_json()
    assert data["due"] == 1
    assert data["oldest_due_lag_seconds"] == 15.0


def test_no_live_worker_with_due_work_is_unhealthy(job, clock):
    enqueue(clock, "a", ago=5)
    code, out, err = run("scheduler_status")
    assert code == 1
    assert err.strip() == "scheduler_status: unhealthy: no live worker while 1 occurrence(s) are due"
    assert "unhealthy: no live worker" in out


def test_no_live_worker_without_due_work_is_healthy(job, clock):
    enqueue(clock, "later", ago=-60)
    assert run("scheduler_status")[0] == 0


def test_live_stale_and_stopped_workers(job, clock):
    enqueue(clock, "a", ago=5)
    worker("live", clock() - timedelta(seconds=20))
    worker("silent", clock() - timedelta(seconds=200))
    worker("gone", clock() - timedelta(seconds=20), stopped=clock() - timedelta(seconds=20))
    code, data, _ = status_json()
    assert code == 0
    assert [w["worker_id"] for w in data["live_workers"]] == ["live"]
    assert [w["worker_id"] for w in data["stale_workers"]] == ["silent"]
    assert data["stopped_workers"] == 1
    live = data["live_workers"][0]
    assert (live["host"], live["pid"], live["kinds"], live["age_seconds"]) == (
        "host-1",
        4321,
        ["reports.send"],
        20.0,
    )
    _, out, _ = run("scheduler_status")
    assert "live workers: 1" in out and "stale workers: 1" in out and "stopped workers: 1" in out
    assert "live host=host-1 pid=4321" in out


def test_a_silent_worker_is_not_live(job, clock):
    enqueue(clock, "a", ago=5)
    worker("silent", clock() - timedelta(seconds=90))
    code, _, err = run("scheduler_status")
    assert code == 1 and "no live worker" in err
    # ... unless the caller allows a longer silence.
    assert run("scheduler_status", "--stale-after", "2m")[0] == 0


def test_lag_over_max_lag_is_unhealthy(job, clock):
    enqueue(clock, "a", ago=400)
    worker("w", clock())
    code, _, err = run("scheduler_status")
    assert code == 1
    assert err.strip() == (
        "scheduler_status: unhealthy: the oldest due occurrence has waited 400 s (limit 300 s)"
    )
    assert run("scheduler_status", "--max-lag", "10m")[0] == 0


def test_due_work_for_a_kind_no_live_worker_handles(job, clock):
    enqueue(clock, "a", ago=5)
    scheduler.create_job("job-b", "reports.archive", authority=AUTHORITY)
    enqueue(clock, "b", ago=-3600, job_id="job-b")  # waiting, not due
    worker("w", clock(), kinds=["other.kind"])
    code, data, err = status_json()
    assert code == 1
    assert err.strip() == (
        "scheduler_status: unhealthy: due work for kinds no live worker handles: reports.send (1 due)"
    )
    assert data["unhandled_kinds"] == [
        {"kind": "reports.archive", "waiting": 1, "due": 0},
        {"kind": "reports.send", "waiting": 1, "due": 1},
    ]
    _, out, _ = run("scheduler_status")
    assert "  reports.archive: 1 waiting, 0 due" in out


def test_waiting_work_of_an_unhandled_kind_that_is_not_due_is_healthy(job, clock):
    enqueue(clock, "later", ago=-600)
    worker("w", clock(), kinds=["other.kind"])
    code, data, _ = status_json()
    assert code == 0
    assert data["unhandled_kinds"] == [{"kind": "reports.send", "waiting": 1, "due": 0}]


def test_occurrences_of_disabled_jobs_wait_by_design(job, clock):
    enqueue(clock, "a", ago=900)
    scheduler.update_job("job-a", expected_revision=1, enabled=False)
    code, data, _ = status_json()
    assert code == 0
    assert (data["due"], data["disabled_waiting"]) == (0, 1)


def test_a_paused_kinds_work_is_shown_paused_not_late(job, clock):
    enqueue(clock, "a", ago=900)  # due 15 minutes ago: late, but for the pause
    enqueue(clock, "b", ago=-60)
    worker("w", clock(), kinds=["reports.send"])
    assert status_json()[0] == 1  # late
    scheduler.pause("reports.send", by="ops")
    code, data, err = status_json()
    assert code == 0, err
    assert (data["due"], data["oldest_due_at"], data["unhandled_kinds"]) == (0, None, [])
    assert data["paused_kinds"] == [
        {
            "kind": "reports.send",
            "paused_at": "2026-01-05T12:00:00.000Z",
            "paused_by": "ops",
            "waiting": 2,
            "due": 1,
        }
    ]
    _, out, _ = run("scheduler_status")
    assert "paused kinds (no worker claims them):" in out
    assert "  reports.send: 2 waiting, 1 due; paused at 2026-01-05T12:00:00.000Z by ops" in out
    scheduler.resume("reports.send")
    assert status_json()[1]["paused_kinds"] == []


def policy(max_runs=10, max_units=100, window_ms=3_600_000, revision=1, enabled=True, pid="alice"):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return AuthorityPolicy.objects.create(
        principal_type="user",
        principal_id=pid,
        revision=revision,
        enabled=enabled,
        capabilities=["reports.send"],
        window_ms=window_ms,
        max_runs=max_runs,
        max_units=max_units,
        created_at=now,
        updated_at=now,
    )


def usage(start: datetime, runs: int, units: int, revision=1, pid="alice"):
    return AuthorityUsage.objects.create(
        principal_type="user",
        principal_id=pid,
        policy_revision=revision,
        window_started_at=start,
        runs=runs,
        units=units,
        updated_at=start,
    )


def test_policies_near_their_budget(db, clock):
    clock.set(datetime(2026, 1, 5, 12, 34, 56, tzinfo=UTC))
    hour = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    policy(pid="alice")
    usage(hour, runs=8, units=8, pid="alice")  # 80 % of runs
    policy(pid="bob")
    usage(hour, runs=1, units=80, pid="bob")  # 80 % of units
    policy(pid="carol")
    usage(hour, runs=7, units=79, pid="carol")  # below both
    policy(pid="dave")
    usage(hour - timedelta(hours=1), runs=10, units=100, pid="dave")  # last window
    policy(pid="erin", revision=2)
    usage(hour, runs=10, units=100, pid="erin", revision=1)  # an older revision
    policy(pid="frank", enabled=False)
    usage(hour, runs=10, units=100, pid="frank")  # disabled policies deny anyway
    policy(pid="grace", window_ms=24 * 3_600_000)
    usage(datetime(2026, 1, 5, tzinfo=UTC), runs=9, units=0, pid="grace")  # a day window
    code, data, _ = status_json()
    assert code == 0  # near a budget is information, not ill health
    assert [b["principal"]["id"] for b in data["near_budget"]] == ["alice", "bob", "grace"]
    assert data["near_budget"][0] == {
        "principal": {"type": "user", "id": "alice"},
        "policy_revision": 1,
        "window_started_at": "2026-01-05T12:00:00.000Z",
        "window_ends_at": "2026-01-05T13:00:00.000Z",
        "runs": 8,
        "max_runs": 10,
        "units": 8,
        "max_units": 100,
    }
    _, out, _ = run("scheduler_status")
    assert "user:alice revision 1 window 2026-01-05T12:00:00.000Z..2026-01-05T13:00:00.000Z" in out


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--max-lag", "abc"], "--max-lag"),
        (["--max-lag", "-5"], "--max-lag"),
        (["--stale-after", "5x"], "--stale-after"),
        (["--stale-after", ""], "--stale-after"),
    ],
)
def test_status_bad_options(db, args, option):
    with pytest.raises(CommandError, match=f"argument {option}: expected a duration"):
        call_command("scheduler_status", *args, stdout=StringIO())


def test_status_database_error_is_one_unhealthy_line(db, monkeypatch):
    def broken(**kwargs):
        raise OperationalError("could not connect to server\nIs the server running?")

    monkeypatch.setattr(ops, "collect_status", broken)
    code, out, err = run("scheduler_status")
    assert (code, out) == (1, "")
    assert err == "scheduler_status: unhealthy: database error: could not connect to server\n"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_status_exit_code_from_the_command_line():
    scheduler.create_job("job-a", "reports.send", authority=AUTHORITY)
    scheduler.enqueue("job-a", scheduled_for=datetime(2026, 1, 1, tzinfo=UTC), trigger_key="old")
    proc = subprocess.run(
        [sys.executable, "-m", "django", "scheduler_status", "--max-lag", "36500d"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "scheduler_status: unhealthy: no live worker while 1 occurrence(s) are due"
    ]


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("3600s", timedelta(hours=1)),
        ("45", timedelta(seconds=45)),
        ("1.5h", timedelta(minutes=90)),
        (" 7D ", timedelta(days=7)),
        ("0", timedelta(0)),
    ],
)
def test_parse_duration(text, expected):
    assert ops.parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-5", "10x", "5d3h", "1e3", "36501d", "nan"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError):
        ops.parse_duration(text)


# --------------------------------------------------------------------------- prune


def settled(clock, key: str, *, outcome="succeeded", job_id="job-a") -> Occurrence:
    """An occurrence claimed and settled now (one attempt, so failed -> dead_letter)."""
    occ = enqueue(clock, key, ago=1, job_id=job_id)
    claimed = scheduler.claim(owner="w", lease=60)
    assert claimed is not None and claimed.pk == occ.pk
    scheduler.settle(claimed.pk, owner="w", fence=claimed.fence, outcome=outcome, retryable=False)
    return claimed


def test_prune_deletes_old_terminal_occurrences_and_their_events(job, clock):
    done = settled(clock, "done")
    dead = settled(clock, "dead", outcome="failed")
    cancelled = enqueue(clock, "cancelled")
    scheduler.cancel(cancelled.pk)
    clock.advance(days=2)
    recent = settled(clock, "recent")
    pending = enqueue(clock, "pending", ago=-60)
    running = enqueue(clock, "running", ago=2 * 86400)
    assert scheduler.claim(owner="w", lease=60).pk == running.pk
    code, out, _ = run("scheduler_prune", "--older-than", "1d")
    assert code == 0
    assert out.strip() == (
        "deleted 3 occurrences settled before 2026-01-06T12:00:00.000Z, 8 of their events, "
        "0 reservations, 0 job events"
    )
    left = set(Occurrence.objects.values_list("pk", flat=True))
    assert left == {recent.pk, pending.pk, running.pk}
    assert not Event.objects.filter(occurrence_id__in=[done.pk, dead.pk, cancelled.pk]).exists()
    assert Event.objects.filter(occurrence_id=recent.pk).count() == 3
    assert Job.objects.filter(pk="job-a").exists()  # jobs are never pruned
    assert Event.objects.filter(occurrence__isnull=True, event_type="job_created").exists()


def test_rows_are_deleted_in_statements_the_database_accepts(job, clock):
    """More ids than one statement may bind (SQLite's limit, 999 on old builds): each chunk
    goes, rows with other ids stay."""
    from django.db import connection

    from django_durable_scheduler.db import dialect
    from django_durable_scheduler.kernel.events import new_event

    dialect.insert(connection.alias, [new_event("job-a", "probe", clock()) for _ in range(2_500)])
    ids = sorted(Event.objects.filter(event_type="probe").values_list("pk", flat=True))
    doomed = [*ids[:2_400], max(ids) + 1_000]  # and one that does not exist
    assert dialect.delete_rows(connection.alias, Event, "event_id", doomed) == 2_400
    assert sorted(Event.objects.filter(event_type="probe").values_list("pk", flat=True)) == ids[2_400:]
    assert dialect.delete_rows(connection.alias, Event, "event_id", []) == 0


def test_prune_dry_run_counts_and_writes_nothing(job, clock):
    settled(clock, "a")
    settled(clock, "b")
    clock.advance(hours=2)
    before = (Occurrence.objects.count(), Event.objects.count())
    code, out, _ = run("scheduler_prune", "--older-than", "1h", "--dry-run", "--include-job-events")
    assert code == 0
    assert out.startswith("would delete 2 occurrences settled before 2026-01-05T13:00:00.000Z, 6 of their")
    assert "1 job events" in out
    assert (Occurrence.objects.count(), Event.objects.count()) == before


def test_prune_in_batches(job, clock):
    for i in range(7):
        settled(clock, f"o{i}")
    clock.advance(hours=1)
    result = ops.prune(timedelta(minutes=30), batch_size=2)
    assert (result.occurrences, result.events) == (7, 21)
    assert not Occurrence.objects.exists()


def test_prune_batches_are_separate_transactions(job, clock, monkeypatch):
    for i in range(5):
        settled(clock, f"o{i}")
    clock.advance(hours=1)
    entered = []
    real_atomic = transaction.atomic

    def counting_atomic(*args, **kwargs):
        entered.append(kwargs.get("using"))
        return real_atomic(*args, **kwargs)

    monkeypatch.setattr(retention_plan, "transaction", SimpleNamespace(atomic=counting_atomic))
    result = ops.prune(timedelta(minutes=30), batch_size=2)
    assert result.occurrences == 5
    assert len(entered) == 3  # 2 + 2 + 1


def reservation(occ: Occurrence, start: datetime, status="succeeded") -> AuthorityReservation:
    return AuthorityReservation.objects.create(
        occurrence=occ,
        job_id=occ.job_id,
        principal_type="user",
        principal_id="alice",
        policy_revision=1,
        window_started_at=start,
        units=1,
        status=status,
        outcome=None if status == "reserved" else {"status": status},
        created_at=start,
        settled_at=None if status == "reserved" else start,
    )


def test_prune_keeps_occurrences_whose_budget_window_is_open(job, clock):
    day = datetime(2026, 1, 5, tzinfo=UTC)
    policy(window_ms=24 * 3_600_000)
    occ = settled(clock, "a")
    reservation(occ, day)
    clock.advance(hours=3)  # still 2026-01-05: the day's window is open
    code, out, _ = run("scheduler_prune", "--older-than", "1h")
    assert code == 0
    assert out.strip().endswith("; kept 1 whose budget window is still open")
    assert Occurrence.objects.filter(pk=occ.pk).exists()
    assert AuthorityReservation.objects.filter(pk=occ.pk).exists()
    clock.set(datetime(2026, 1, 6, 0, 0, tzinfo=UTC))  # the window has ended
    result = ops.prune(timedelta(hours=1))
    assert (result.occurrences, result.reservations, result.kept) == (1, 1, 0)
    assert not AuthorityReservation.objects.exists()


def test_prune_treats_a_reservation_without_policy_as_ended(job, clock):
    occ = settled(clock, "a")
    reservation(occ, clock())
    clock.advance(hours=2)
    result = ops.prune(timedelta(hours=1))
    assert (result.occurrences, result.reservations) == (1, 1)


def test_prune_never_deletes_a_reserved_reservation(job, clock):
    # Cannot happen through the kernel (settling settles the reservation); be safe anyway.
    occ = settled(clock, "a")
    reservation(occ, datetime(2025, 1, 1, tzinfo=UTC), status="reserved")
    clock.advance(days=30)
    result = ops.prune(timedelta(days=1))
    assert (result.occurrences, result.kept) == (0, 1)


def test_prune_job_events_only_when_asked(job, clock):
    clock.advance(days=10)
    scheduler.update_job("job-a", expected_revision=1, payload={"n": 2})  # a recent job event
    run("scheduler_prune", "--older-than", "1d")
    assert Event.objects.filter(event_type="job_created").exists()
    code, out, _ = run("scheduler_prune", "--older-than", "1d", "--include-job-events")
    assert code == 0 and out.strip().endswith("1 job events")
    assert list(Event.objects.values_list("event_type", flat=True)) == ["job_updated"]


def test_pruning_a_materialized_slot_never_fires_it_again(db, clock):
    clock.set(datetime(2026, 1, 5, 12, 0, 30, tzinfo=UTC))
    scheduler.create_job("every-minute", "reports.send", authority=AUTHORITY, trigger={"every": 60})
    clock.set(datetime(2026, 1, 5, 12, 1, 30, tzinfo=UTC))
    assert kernel.materialize_due() == 1
    occ = Occurrence.objects.get()
    slot = occ.scheduled_for
    assert occ.trigger_key == "schedule:2026-01-05T12:01:30.000Z"
    claimed = scheduler.claim(owner="w", lease=30)
    scheduler.settle(claimed.pk, owner="w", fence=claimed.fence, outcome="succeeded")
    clock.advance(20)
    assert ops.prune(timedelta(seconds=10)).occurrences == 1
    assert not Occurrence.objects.exists()
    # Rewind the job to the pruned slot (as a clock jump or a bug might): the slot is
    # still within the misfire grace and the catch-up window, and its identity is gone with
    # the occurrence, so only Job.last_slot_at stands between it and a second firing.
    Job.objects.filter(pk="every-minute").update(next_fire_at=slot)
    assert kernel.materialize_due() == 0
    assert not Occurrence.objects.filter(scheduled_for=slot).exists()
    # ... and the schedule goes on with the next slot.
    clock.set(datetime(2026, 1, 5, 12, 2, 31, tzinfo=UTC))
    assert kernel.materialize_due() == 1
    assert Occurrence.objects.get().trigger_key == "schedule:2026-01-05T12:02:30.000Z"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --older-than"),
        (["--older-than", "abc"], "argument --older-than: expected a duration"),
        (["--older-than", "-1d"], "argument --older-than: expected"),
        (["--older-than", "1y"], "argument --older-than: expected a duration"),
        (["--older-than", "1d", "--batch-size", "0"], "argument --batch-size: must be between 1"),
        (["--older-than", "1d", "--batch-size", "many"], "argument --batch-size: must be a whole number"),
    ],
)
def test_prune_bad_options(db, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("scheduler_prune", *args, stdout=StringIO())


def test_prune_json_output(job, clock):
    settled(clock, "a")
    clock.advance(days=1)
    code, out, _ = run("scheduler_prune", "--older-than", "1h", "--json")
    assert code == 0
    assert json.loads(out) == {
        "cutoff": "2026-01-06T11:00:00.000Z",
        "dry_run": False,
        "occurrences": 1,
        "events": 3,
        "reservations": 0,
        "job_events": 0,
        "kept": 0,
    }


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_prune_bad_option_from_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "django", "scheduler_prune", "--older-than", "soon"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(
        "scheduler_prune: error: argument --older-than: expected a duration such as "
        "30d, 12h, 90m, 3600s or plain seconds, not 'soon'"
    )
