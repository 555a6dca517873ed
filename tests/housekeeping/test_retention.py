"""Retention: the setting and its check, what the workers' runs delete and keep (budget
windows, the keys that dedupe enqueues), the lease that lets one worker at a time run it,
the archive written and verified before anything goes (and the restore command), and the
last run on the dashboard and in ``scheduler_status``."""

from __future__ import annotations

import gzip
import json
import logging
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.files.storage import FileSystemStorage
from django.core.management import CommandError, call_command
from django.urls import reverse

import django_durable_scheduler as scheduler
from django_durable_scheduler import checks, conf, kernel
from django_durable_scheduler.housekeeping import archive, maintenance
from django_durable_scheduler.housekeeping.retention import plan as retention_plan
from django_durable_scheduler.housekeeping.retention.rules import cutoffs, kept_occurrences
from django_durable_scheduler.housekeeping.retention.thread import run_once
from django_durable_scheduler.models import (
    AuthorityPolicy,
    AuthorityReservation,
    Event,
    Job,
    MaintenanceLease,
    Occurrence,
)

from ..admin.test_admin import staff_user
from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def settle(clock, key: str, outcome: str = "succeeded", job_id: str = "job-a") -> Occurrence:
    """An occurrence enqueued under ``key``, claimed and settled now as ``outcome``."""
    occ, _ = kernel.enqueue(job_id, scheduled_for=clock(), trigger_key=key)
    if outcome == "cancelled":
        kernel.cancel(occ.pk)
        return Occurrence.objects.get(pk=occ.pk)
    held = kernel.claim(owner="w", lease=60)
    assert held is not None and held.pk == occ.pk
    kernel.settle(held.pk, owner="w", fence=held.fence, outcome=outcome, retryable=False)
    return Occurrence.objects.get(pk=occ.pk)


def left() -> set[str]:
    return set(Occurrence.objects.values_list("trigger_key", flat=True))


@pytest.fixture
def keep_all_keys(settings):
    """Retention on with ages short enough for a test, caller keys going with their status."""
    settings.DURABLE_SCHEDULER_RETENTION = {"caller_keys": 1, "pause": 0}


# --------------------------------------------------------------------------- the setting


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("7d", "must be None or a dict"),
        ({"succeded": 5}, "unknown keys ['succeded']"),
        ({"succeeded": -1}, "['succeeded'] must be more than 0"),
        ({"dead_letter": "30d"}, "['dead_letter'] must be None, seconds or a timedelta"),
        ({"job_events": timedelta(days=40_000)}, "['job_events'] must be more than 0 and at most"),
        ({"batch_size": 0}, "['batch_size'] must be a whole number in [1, 10000]"),
        ({"batch_size": 2.5}, "['batch_size'] must be a whole number"),
        ({"pause": True}, "['pause'] must be seconds in [0, 60]"),
        ({"period": 0}, "['period'] must be seconds in [1, 86400]"),
        ({"lease": 1e9}, "['lease'] must be seconds in [1, 3600]"),
    ],
)
def test_bad_retention_settings_name_the_setting(settings, value, problem):
    settings.DURABLE_SCHEDULER_RETENTION = value
    (message,) = checks.check_settings()
    assert message.id == "durable_scheduler.E003"
    assert message.msg.startswith("DURABLE_SCHEDULER_RETENTION ")
    assert problem in message.msg


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("default", "must be None or a dict with 'storage'"),
        ({"prefix": "x"}, "must be None or a dict with 'storage'"),
        ({"storage": "nowhere"}, "['storage'] must name an entry of STORAGES, not 'nowhere'"),
        ({"storage": "default", "prefix": "../up"}, "['prefix'] must be a folder name"),
    ],
)
def test_bad_archive_settings_name_the_setting(settings, value, problem):
    settings.DURABLE_SCHEDULER_ARCHIVE = value
    (message,) = checks.check_settings()
    assert message.msg.startswith("DURABLE_SCHEDULER_ARCHIVE ") and problem in message.msg


def test_the_defaults_and_a_partial_setting(settings):
    assert checks.check_settings() == []
    ages = conf.settings.RETENTION.ages
    assert (ages["succeeded"], ages["cancelled"], ages["dead_letter"]) == (7 * DAY, 7 * DAY, 30 * DAY)
    settings.DURABLE_SCHEDULER_RETENTION = {"succeeded": 3600, "dead_letter": None}
    partial = conf.settings.RETENTION
    assert partial.ages["succeeded"] == timedelta(hours=1) and partial.ages["dead_letter"] is None
    assert partial.ages["cancelled"] == 7 * DAY and partial.batch_size == 500
    now = datetime(2026, 1, 5, tzinfo=UTC)
    assert cutoffs(now) == {
        "succeeded": now - timedelta(hours=1),
        "dead_letter": None,
        "cancelled": now - 7 * DAY,
    }
    settings.DURABLE_SCHEDULER_RETENTION = None
    assert cutoffs(now) == dict.fromkeys(("succeeded", "dead_letter", "cancelled"))
    assert run_once("w1") is None  # off: nothing runs, no lease row
    assert not MaintenanceLease.objects.exists()


# --------------------------------------------------------------------------- what goes


def test_a_run_deletes_each_status_at_its_own_age(job, clock, keep_all_keys, caplog):
    settle(clock, "old-ok")
    settle(clock, "old-dead", "failed")
    settle(clock, "old-cancelled", "cancelled")
    clock.advance(days=8)
    settle(clock, "new-ok")
    caplog.set_level(logging.INFO, logger="django_durable_scheduler")
    result = run_once("w1")
    assert result is not None
    assert left() == {"old-dead", "new-ok"}  # dead letters stay 30 days
    assert result.by_status == {"succeeded": 1, "cancelled": 1}
    assert (result.events, result.job_events) == (5, 0)  # 3 + 2; the job's event is 8 days old
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert line.startswith("retention by w1 removed 2 occurrences (cancelled 1, succeeded 1), 5 events")
    clock.advance(days=23)
    assert run_once("w1").by_status == {"succeeded": 1, "dead_letter": 1}
    assert left() == set()
    # The job's own events (30 days by default) went too; the job stays.
    assert not Event.objects.exists() and Job.objects.filter(pk="job-a").exists()


def test_batches_and_the_pause_between_them(job, clock, settings):
    settings.DURABLE_SCHEDULER_RETENTION = {"caller_keys": 1, "batch_size": 2, "pause": 0.001}
    for i in range(5):
        settle(clock, f"o{i}")
    clock.advance(days=8)
    result = run_once("w1")
    assert result.occurrences == 5 and not Occurrence.objects.exists()
    row = MaintenanceLease.objects.get(name="retention")
    assert (row.owner, row.expires_at, row.last_result["occurrences"]) == ("w1", None, 5)


def test_job_events_at_their_own_age_or_never(job, clock, settings):
    scheduler.update_job("job-a", expected_revision=1, payload={"n": 2})
    settings.DURABLE_SCHEDULER_RETENTION = {"job_events": None}
    clock.advance(days=365)
    run_once("w1")
    assert Event.objects.filter(occurrence__isnull=True).count() == 2
    settings.DURABLE_SCHEDULER_RETENTION = {"job_events": 3600, "period": 1}
    clock.advance(2)
    assert run_once("w1").job_events == 2


def test_kept_occurrences_are_those_whose_events_must_stay(job, clock, keep_all_keys):
    kernel.enqueue("job-a", scheduled_for=clock() + DAY, trigger_key="pending")
    settle(clock, "dead", "failed")
    old = settle(clock, "old")
    in_window = settle(clock, "in-window")
    AuthorityPolicy.objects.create(
        principal_type="user",
        principal_id="alice",
        capabilities=["reports.send"],
        window_ms=31 * 86_400_000,
        created_at=clock(),
        updated_at=clock(),
    )
    AuthorityReservation.objects.create(
        occurrence=in_window,
        job_id="job-a",
        principal_type="user",
        principal_id="alice",
        policy_revision=1,
        window_started_at=clock(),
        units=1,
        status="succeeded",
        outcome={"status": "succeeded"},
        created_at=clock(),
        settled_at=clock(),
    )
    clock.advance(days=8)
    kept = kept_occurrences("default", clock())
    assert set(kept.values_list("trigger_key", flat=True)) == {"pending", "dead", "in-window"}
    result = run_once("w1")
    assert (result.occurrences, result.kept) == (1, 1)
    assert left() == {"pending", "dead", "in-window"} and old.trigger_key not in left()


# --------------------------------------------------------------------------- the ledger


def test_retention_never_turns_a_deduplicated_enqueue_into_a_second_run(db, clock, settings):
    """Slots are refused by Job.last_slot_at; a key the caller chose keeps its row (and so
    dedupes) unless ``caller_keys`` says for how long; a retry keeps its row while its dead
    letter is kept; django.tasks' random keys go."""
    settings.DURABLE_SCHEDULER_RETENTION = {"pause": 0, "period": 1}
    clock.set(datetime(2026, 1, 5, 12, 0, 30, tzinfo=UTC))
    scheduler.create_job("every-minute", "reports.send", authority=AUTHORITY, trigger={"every": 60})
    scheduler.create_job("job-a", "reports.send", authority=AUTHORITY)
    clock.set(datetime(2026, 1, 5, 12, 1, 30, tzinfo=UTC))
    assert kernel.materialize_due() == 1
    slot = Occurrence.objects.get(job_id="every-minute")
    held = kernel.claim(owner="w", lease=60)
    kernel.settle(held.pk, owner="w", fence=held.fence, outcome="succeeded")
    Job.objects.filter(pk="every-minute").update(enabled=False)  # no new slots meanwhile
    settle(clock, "order:42")
    kernel.enqueue_once_per_trigger("job-a", scheduled_for=clock(), trigger_key="nightly")
    held = kernel.claim(owner="w", lease=60)
    kernel.settle(held.pk, owner="w", fence=held.fence, outcome="succeeded")
    settle(clock, "task:0f1e2d")
    dead = settle(clock, "poison", "failed")
    retry, _ = kernel.retry_dead_letter(dead.pk)
    held = kernel.claim(owner="w", lease=60)
    kernel.settle(held.pk, owner="w", fence=held.fence, outcome="succeeded")

    clock.advance(days=8)
    result = run_once("w1")
    assert result.by_status == {"succeeded": 2}  # the slot and the task
    assert result.kept_for_keys == 3
    assert left() == {"order:42", "nightly", "poison", f"retry:{dead.pk}"}
    assert not Event.objects.filter(occurrence_id=slot.pk).exists()

    # Everything enqueued again finds what it found before; the slot is not materialized again.
    Job.objects.filter(pk="every-minute").update(enabled=True, next_fire_at=slot.scheduled_for)
    kernel.materialize_due()
    assert not Occurrence.objects.filter(job_id="every-minute", scheduled_for=slot.scheduled_for).exists()
    order = Occurrence.objects.get(trigger_key="order:42")
    again, deduplicated = kernel.enqueue("job-a", scheduled_for=order.scheduled_for, trigger_key="order:42")
    assert deduplicated and again.status == "succeeded"
    assert kernel.enqueue_once_per_trigger("job-a", scheduled_for=clock(), trigger_key="nightly")[1]
    assert kernel.retry_dead_letter(dead.pk) == (Occurrence.objects.get(pk=retry.pk), True)

    # With an age for caller keys, they go once it has passed; the retry goes with its dead letter.
    settings.DURABLE_SCHEDULER_RETENTION = {"pause": 0, "period": 1, "caller_keys": 20 * 86_400}
    clock.advance(days=23)
    assert run_once("w1").by_status == {"succeeded": 2, "dead_letter": 1}
    assert not left() & {"order:42", "nightly", "poison"}
    clock.advance(2)
    assert run_once("w1").by_status == {"succeeded": 1}  # the retry, its dead letter gone
    assert f"retry:{dead.pk}" not in left()


# --------------------------------------------------------------------------- the lease


def test_one_worker_at_a_time_once_per_period(job, clock, keep_all_keys, settings):
    settle(clock, "a")
    clock.advance(days=8)
    assert run_once("w1").occurrences == 1
    assert run_once("w2") is None  # the period (300 s) has not passed
    clock.advance(301)
    assert run_once("w2") is not None
    assert MaintenanceLease.objects.get().owner == "w2"
    # A held lease (unexpired) refuses everyone, its holder's other runs included.
    period, lease = timedelta(seconds=300), timedelta(seconds=120)
    clock.advance(301)
    held = maintenance.take("retention", "w3", now=clock(), lease=lease, period=period, alias="default")
    assert held is not None
    assert (
        maintenance.take("retention", "w4", now=clock(), lease=lease, period=period, alias="default") is None
    )
    # Killed: its lease runs out, and the next worker takes it over once the period passed too.
    clock.advance(301)
    taken = maintenance.take("retention", "w4", now=clock(), lease=lease, period=period, alias="default")
    assert taken is not None
    assert not held.renew(clock(), lease) and not held.release(clock(), {"ok": True})
    assert taken.renew(clock(), lease) and taken.release(clock(), {"ok": True})


# --------------------------------------------------------------------------- the archive


@pytest.fixture
def archived(settings, tmp_path, clock):
    settings.STORAGES = {
        **settings.STORAGES,
        "archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": tmp_path},
        },
    }
    settings.DURABLE_SCHEDULER_ARCHIVE = {"storage": "archive", "prefix": "history/"}
    settings.DURABLE_SCHEDULER_RETENTION = {"caller_keys": 1, "pause": 0, "job_events": 3600}
    return tmp_path


def snapshot(model) -> dict:
    fields = [f.attname for f in model._meta.concrete_fields]
    return {row[0]: row for row in model.objects.order_by("pk").values_list(*fields)}


def reserve(occ: Occurrence, clock) -> None:
    """A settled reservation of ``occ`` in a one-hour window of alice's policy."""
    AuthorityPolicy.objects.get_or_create(
        principal_type="user",
        principal_id="alice",
        defaults={"window_ms": 3_600_000, "created_at": clock(), "updated_at": clock()},
    )
    AuthorityReservation.objects.create(
        occurrence=occ,
        job_id=occ.job_id,
        principal_type="user",
        principal_id="alice",
        policy_revision=1,
        window_started_at=clock(),
        units=2,
        status="succeeded",
        outcome={"status": "succeeded"},
        created_at=clock(),
        settled_at=clock(),
    )


def test_archive_and_restore_round_trip(job, clock, archived):
    for i in range(3):
        reserve(settle(clock, f"o{i}"), clock)
    settle(clock, "dead", "failed")
    Occurrence.objects.filter(trigger_key="o0").update(metadata={"note": "ünïcode", "at": "2026"})
    before = {model: snapshot(model) for model in (Occurrence, Event, AuthorityReservation)}
    clock.advance(days=40)
    result = run_once("w1")
    assert (result.occurrences, result.reservations, result.job_events) == (4, 3, 1)
    assert not Occurrence.objects.exists() and not Event.objects.exists()
    names = MaintenanceLease.objects.get().last_result["archived"]
    # Per status and day: occurrences, reservations (succeeded only), events; then job events.
    assert len(names) == 6
    assert all(name.startswith("history/durable_scheduler_") and name.endswith(".jsonl.gz") for name in names)
    with gzip.open(archived / names[0]) as raw:
        header = json.loads(raw.readline())
    assert header["model"] == "durable_scheduler.Occurrence" and "metadata" in header["fields"]

    out = StringIO()
    call_command("scheduler_restore_archive", *reversed(names), stdout=out)
    assert {model: snapshot(model) for model in before} == before
    text = out.getvalue()
    # Occurrences first, whatever order the names came in.
    assert text.index("occurrences (2026-01-05") < text.index("reservations") < text.index("events (")
    again = StringIO()
    call_command("scheduler_restore_archive", *names, "--dry-run", stdout=again)
    assert "would restore 0 occurrences" in again.getvalue()
    assert "skipped 3 already present" in again.getvalue()


def test_a_sink_writes_any_model_and_verifies(job, clock, archived):
    sink = archive.sink("default")
    period = (datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 6, tzinfo=UTC))
    name = sink.write(Job, period, Job.objects.all())
    assert name == f"history/durable_scheduler_jobs/2026-01-05/{name.rsplit('/', 1)[1]}"
    contents = archive.read(FileSystemStorage(location=archived), name)
    assert [job.pk for job in contents.rows] == ["job-a"] and contents.model is Job


class BrokenStorage(FileSystemStorage):
    """Refuses to save, as a full disk or a missing bucket would."""

    def _save(self, name, content):
        raise OSError("no space left on device")


class LyingStorage(FileSystemStorage):
    """Saves, but reads back a file with a line missing."""

    def open(self, name, mode="rb"):
        stored = super().open(name, mode)
        lines = gzip.decompress(stored.read()).splitlines(keepends=True)
        stored.close()
        from django.core.files.base import ContentFile

        return ContentFile(gzip.compress(b"".join(lines[:-1])), name=name)


@pytest.mark.parametrize(
    ("backend", "reason"),
    [("BrokenStorage", "no space left on device"), ("LyingStorage", "reads back as 0 rows")],
)
def test_a_failed_archive_deletes_nothing(job, clock, archived, settings, caplog, backend, reason):
    settings.STORAGES = {
        **settings.STORAGES,
        "archive": {
            "BACKEND": f"tests.housekeeping.test_retention.{backend}",
            "OPTIONS": {"location": archived},
        },
    }
    settle(clock, "a")
    before = (snapshot(Occurrence), snapshot(Event))
    clock.advance(days=8)
    assert run_once("w1") is None
    assert (snapshot(Occurrence), snapshot(Event)) == before
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "retention by w1 failed" in warning and reason in warning
    row = MaintenanceLease.objects.get()
    assert row.last_result["ok"] is False and reason in row.last_result["error"] and row.expires_at is None
    assert not list(archived.rglob("*.gz"))  # the unverified file was removed
    with pytest.raises(CommandError, match="archive failed, its rows were kept"):
        call_command("scheduler_prune", "--older-than", "1d", stdout=StringIO())
    assert snapshot(Occurrence) == before[0]


def test_restore_bad_input(job, clock, archived):
    (archived / "plain.jsonl.gz").write_bytes(b"not gzip")
    (archived / "other.jsonl.gz").write_bytes(gzip.compress(b'{"hello": 1}\n'))
    for args, message in [
        (["nothing.jsonl.gz"], "no archive file 'nothing.jsonl.gz' in that storage"),
        (["plain.jsonl.gz"], "plain.jsonl.gz is not a gzip file of JSON lines"),
        (["other.jsonl.gz"], "other.jsonl.gz is not a scheduler archive"),
        (["x", "--storage", "s3"], "--storage: 's3' is not in STORAGES"),
    ]:
        with pytest.raises(CommandError, match=message):
            call_command("scheduler_restore_archive", *args, stdout=StringIO())


def test_restore_reports_rows_whose_job_is_gone(db, clock, archived):
    scheduler.create_job("gone", "reports.send", authority=AUTHORITY)
    settle(clock, "a", job_id="gone")
    clock.advance(days=40)
    run_once("w1")
    names = MaintenanceLease.objects.get().last_result["archived"]
    Job.objects.filter(pk="gone").delete()
    out = StringIO()
    call_command("scheduler_restore_archive", *names, stdout=out)
    assert "restored 0 occurrences" in out.getvalue()
    assert "skipped 1 of job 'gone', which no longer exists" in out.getvalue()
    assert not Occurrence.objects.exists()


# --------------------------------------------------------------------------- shown


def test_status_and_dashboard_show_the_last_run(job, clock, archived, client):
    code_json = StringIO()
    call_command("scheduler_status", "--json", stdout=code_json)
    assert json.loads(code_json.getvalue())["retention"]["started_at"] is None
    settle(clock, "a")
    clock.advance(days=8)
    run_once("worker-7")
    status = StringIO()
    call_command("scheduler_status", stdout=status)
    (line,) = [line for line in status.getvalue().splitlines() if line.startswith("retention:")]
    assert line.startswith("retention: last run 2026-01-13T12:00:00.000Z by worker-7 (")
    assert "removed 1 occurrences (succeeded 1), 3 events, 0 reservations, 1 job events" in line
    assert "archived to 3 files" in line
    data = StringIO()
    call_command("scheduler_status", "--json", stdout=data)
    shown = json.loads(data.getvalue())["retention"]
    assert (shown["worker"], shown["result"]["occurrences"], shown["result"]["archived_files"]) == (
        "worker-7",
        1,
        3,
    )
    client.force_login(staff_user("viewer", "view_occurrence"))
    html = client.get(reverse("admin:durable_scheduler_schedulerdashboard_changelist")).content.decode()
    assert 'id="dsch-retention"' in html and "worker-7" in html
    assert shown["result"]["archived"][0] in html


def test_chunks_of_one_day_each_in_files_of_their_own(job, clock, archived, monkeypatch):
    monkeypatch.setattr(retention_plan, "CHUNK", 2)
    for day in range(3):
        for i in range(3):
            settle(clock, f"d{day}-{i}")
        clock.advance(days=1)
    before = snapshot(Occurrence)
    clock.advance(days=8)
    result = run_once("w1")
    assert result.occurrences == 9 and not Occurrence.objects.exists()
    occurrence_files = [name for name in result.archived if "/durable_scheduler_occurrences/" in name]
    # Two chunks a day (2 + 1 rows), never a chunk across midnight.
    assert len(occurrence_files) == 6
    assert {name.split("/")[2] for name in occurrence_files} == {"2026-01-05", "2026-01-06", "2026-01-07"}
    call_command("scheduler_restore_archive", *result.archived, stdout=StringIO())
    assert snapshot(Occurrence) == before


def test_a_bad_setting_read_at_run_time_names_itself(settings):
    settings.DURABLE_SCHEDULER_RETENTION = {"period": -1}
    with pytest.raises(ValueError, match=r"^DURABLE_SCHEDULER_RETENTION \['period'\] must be seconds"):
        run_once("w1")
    settings.DURABLE_SCHEDULER_ARCHIVE = {"storage": 3}
    with pytest.raises(ValueError, match=r"^DURABLE_SCHEDULER_ARCHIVE \['storage'\] must name"):
        archive.sink("default")
