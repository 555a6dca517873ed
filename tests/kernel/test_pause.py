"""Pausing a kind (``pause``, ``resume``, ``paused_kinds``; docs/design.md, "Pausing a kind"):
no claim takes (or reclaims) a paused kind's occurrences, its running ones settle as ever,
each change is an event on every job of the kind, and bad input writes nothing."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.models import Event, Occurrence, PausedKind, WorkerHeartbeat

from ..conftest import AUTHORITY, snapshot

pytestmark = pytest.mark.django_db

OTHER = {**AUTHORITY, "requestedCapabilities": ["reports.other"]}


@pytest.fixture
def world(job, clock):
    """job-a and job-b of kind reports.send, job-c of reports.other, one due occurrence each."""
    scheduler.create_job("job-b", "reports.send", authority=AUTHORITY)
    scheduler.create_job("job-c", "reports.other", authority=OTHER)
    for job_id in ("job-a", "job-b", "job-c"):
        scheduler.enqueue(job_id, scheduled_for=clock(), trigger_key="t1")
    return clock


def claim_all(**options) -> list[Occurrence]:
    return kernel.claim_batch(owner="w", lease=60, limit=10, **options)


def test_a_paused_kind_is_not_claimed_and_is_again_once_resumed(world):
    assert scheduler.pause("reports.send", by="ops") is True
    assert [row.job_id for row in claim_all()] == ["job-c"]
    assert claim_all() == [] and not kernel.has_due()
    assert kernel.has_due(kinds=["reports.other", "reports.send"]) is False
    assert [(p.kind, p.paused_by) for p in scheduler.paused_kinds()] == [("reports.send", "ops")]
    assert scheduler.resume("reports.send") is True
    assert kernel.has_due(kinds=["reports.send"])
    assert sorted(row.job_id for row in claim_all()) == ["job-a", "job-b"]
    assert scheduler.paused_kinds() == []


def test_running_occurrences_of_a_paused_kind_finish(world):
    running = claim_all(kinds=["reports.send"])
    assert len(running) == 2
    scheduler.pause("reports.send")
    for row in running:
        scheduler.settle(row.pk, owner="w", fence=row.fence, outcome="succeeded")
    assert Occurrence.objects.filter(status="succeeded").count() == 2


def test_an_expired_lease_of_a_paused_kind_is_not_reclaimed_until_resumed(world):
    (row,) = kernel.claim_batch(owner="w", lease=1, limit=1, kinds=["reports.other"])
    scheduler.pause("reports.other")
    world.advance(5)
    assert claim_all(kinds=["reports.other"]) == []
    scheduler.resume("reports.other")
    (again,) = claim_all(kinds=["reports.other"])
    assert again.pk == row.pk and again.fence == row.fence + 1


def test_each_change_is_an_event_on_every_job_of_the_kind(world):
    scheduler.pause("reports.send", by="alice")
    paused = Event.objects.filter(event_type="kind_paused").order_by("job_id")
    assert [(e.job_id, e.data) for e in paused] == [
        ("job-a", {"kind": "reports.send", "by": "alice"}),
        ("job-b", {"kind": "reports.send", "by": "alice"}),
    ]
    assert all(e.occurred_at == world() and e.occurrence_id is None for e in paused)
    assert [e.event_type for e in scheduler.history("job-a", limit=1)] == ["kind_paused"]
    scheduler.resume("reports.send")
    resumed = Event.objects.filter(event_type="kind_resumed")
    assert sorted(e.job_id for e in resumed) == ["job-a", "job-b"]
    assert resumed.first().data == {"kind": "reports.send", "by": ""}


def test_pausing_what_is_paused_or_resuming_what_is_not_changes_nothing(world):
    assert scheduler.resume("reports.send") is False
    scheduler.pause("reports.send", by="first")
    before = snapshot()
    world.advance(10)
    assert scheduler.pause("reports.send", by="second") is False
    assert snapshot() == before
    assert PausedKind.objects.get().paused_by == "first"


def test_a_kind_a_worker_runs_but_no_job_has_yet_can_be_paused(db, clock):
    with pytest.raises(scheduler.NotFound):
        scheduler.pause("reports.later")
    heartbeat = {"hostname": "h", "pid": 1, "concurrency": 1, "started_at": clock(), "last_seen_at": clock()}
    WorkerHeartbeat.objects.create(worker_id="gone", kinds=["reports.later"], stopped_at=clock(), **heartbeat)
    with pytest.raises(scheduler.NotFound):
        scheduler.pause("reports.later")  # a stopped worker runs nothing
    WorkerHeartbeat.objects.create(worker_id="w", kinds=["reports.later"], **heartbeat)
    assert scheduler.pause("reports.later") is True
    assert not Event.objects.exists()  # no job of the kind to record it on
    scheduler.create_job("job-l", "reports.later", authority={**AUTHORITY, "requestedCapabilities": ["x"]})
    scheduler.enqueue("job-l", scheduled_for=clock(), trigger_key="t")
    assert claim_all() == []


def test_a_paused_kind_whose_jobs_are_gone_can_still_be_resumed(world):
    scheduler.pause("reports.other")
    Event.objects.filter(job_id="job-c").delete()
    Occurrence.objects.filter(job_id="job-c").delete()
    scheduler.get_job("job-c").delete()
    assert scheduler.resume("reports.other") is True
    with pytest.raises(scheduler.NotFound):
        scheduler.resume("reports.other")


@pytest.mark.parametrize("operation", ["pause", "resume"])
@pytest.mark.parametrize(
    ("kind", "by", "field", "error"),
    [
        ("", None, "kind", scheduler.InvalidArgument),
        ("   ", None, "kind", scheduler.InvalidArgument),
        (None, None, "kind", scheduler.InvalidArgument),
        (["reports.send"], None, "kind", scheduler.InvalidArgument),
        ("k" * 129, None, "kind", scheduler.InvalidArgument),
        ("a\x00b", None, "kind", scheduler.InvalidArgument),
        ("no.such.kind", None, "kind", scheduler.NotFound),
        ("reports.send", 5, "by", scheduler.InvalidArgument),
        ("reports.send", "", "by", scheduler.InvalidArgument),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_written(world, operation, kind, by, field, error):
    if operation == "resume":
        scheduler.pause("reports.send")
    before = snapshot()
    with pytest.raises(error) as caught:
        getattr(scheduler, operation)(kind, by=by)
    assert caught.value.details["field"] == field and field in str(caught.value)
    assert snapshot() == before


def test_the_claim_reads_the_pause_inside_its_own_statements(world):
    """Pausing adds no statement to a claim: the paused kinds are read by the arms."""
    claim_all(kinds=["reports.other"])
    scheduler.enqueue("job-c", scheduled_for=world(), trigger_key="t2")
    world.advance(1)
    with CaptureQueriesContext(connection) as plain:
        assert len(claim_all()) == 3
    scheduler.enqueue("job-c", scheduled_for=world(), trigger_key="t3")
    scheduler.enqueue("job-a", scheduled_for=world(), trigger_key="t3")
    scheduler.pause("reports.send")
    with CaptureQueriesContext(connection) as paused:
        assert [row.job_id for row in claim_all()] == ["job-c"]
    assert len(paused.captured_queries) == len(plain.captured_queries)


# --------------------------------------------------------------------------- manage.py scheduler_pause


def command(*args: str) -> str:
    out = StringIO()
    call_command("scheduler_pause", *args, stdout=out)
    return out.getvalue()


def test_the_command_pauses_lists_and_resumes(world):
    assert command("reports.send", "reports.other", "--by", "bob") == (
        "reports.send: paused\nreports.other: paused\npaused kinds: 2\n"
        "  reports.other since 2026-01-05T12:00:00.000Z by bob\n"
        "  reports.send since 2026-01-05T12:00:00.000Z by bob\n"
    )
    assert claim_all() == []
    assert command("reports.send").startswith("reports.send: already paused, unchanged\n")
    assert json.loads(command("--json")) == {
        "changed": {},
        "paused": [
            {"kind": "reports.other", "paused_at": "2026-01-05T12:00:00.000Z", "paused_by": "bob"},
            {"kind": "reports.send", "paused_at": "2026-01-05T12:00:00.000Z", "paused_by": "bob"},
        ],
    }
    assert command("--resume", "reports.send").startswith("reports.send: resumed\npaused kinds: 1\n")
    assert sorted(row.job_id for row in claim_all()) == ["job-a", "job-b"]
    assert Event.objects.filter(event_type="kind_resumed").first().data["by"] == "manage.py scheduler_pause"


def test_the_command_takes_queue_names(world):
    scheduler.create_job(
        "task-job", "django.tasks:emails", authority={**AUTHORITY, "requestedCapabilities": ["x"]}
    )
    assert command("--queue", "emails").startswith("django.tasks:emails: paused\n")
    assert [p.kind for p in scheduler.paused_kinds()] == ["django.tasks:emails"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("reports.send", "no.such.kind"), "scheduler_pause: kind 'no.such.kind': no job has this kind"),
        (("reports.send", " "), "scheduler_pause: kind: must not be empty"),
        (("reports.send", "--by", " "), "scheduler_pause: by: must not be empty"),
    ],
)
def test_the_command_refuses_bad_input_and_changes_nothing(world, args, message):
    before = snapshot()
    with pytest.raises(CommandError) as caught:
        command(*args)
    assert str(caught.value).startswith(message)
    assert snapshot() == before
