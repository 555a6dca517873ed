"""Chains and batches in the admin, through Django's test client: an occurrence's page links its
predecessor, its follow-ups and its batch; a batch's page shows its progress and callback; the
close and cancel actions go through the kernel and name the user; the job form edits a job's
follow-ups with the kernel's refusals on their field; the dashboard lists the batches in
progress; and ``history(follow=True)`` reads a chain's events."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.admin import chainview
from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.housekeeping.retention.plan import prune
from django_durable_scheduler.kernel import events
from django_durable_scheduler.models import Batch, BatchStatus, Event, Job, Occurrence, OccurrenceStatus

from ..conftest import CLOCK_START, authority_for, snapshot
from .test_admin import form_errors, job_data, page_messages, run_action, staff_user, url

pytestmark = pytest.mark.django_db
OWNER = "w-admin"
DASHBOARD = "admin:durable_scheduler_schedulerdashboard_changelist"


@pytest.fixture
def jobs(clock):
    kernel.create_job("export", "reports.export", authority=authority_for("alice", "reports.export"))
    kernel.create_job("report", "reports.send", authority=authority_for("bob", "reports.send"))
    kernel.create_job("alert", "ops.page", authority=authority_for("carol", "ops.page"))


def _run(outcome: str = "succeeded", kind: str | None = None, **settle) -> Occurrence:
    """Claim the next due occurrence (of ``kind``, if given) and settle it as ``outcome``."""
    kinds = None if kind is None else [kind]
    (row,) = kernel.claim_batch(owner=OWNER, lease=60, limit=1, kinds=kinds, sweep_expired=False)
    return kernel.settle(row.pk, owner=OWNER, fence=row.fence, outcome=outcome, **settle)


def _text(response) -> str:
    assert response.status_code == 200
    return " ".join(response.content.decode().split())


def _link(model: str, pk: str) -> str:
    return f'href="{url(model, "change", pk)}"'


# --------------------------------------------------------------------------- occurrence pages


@pytest.fixture
def chain(jobs, clock):
    """export (succeeded) -> report (queued), with alert declared on dead letter."""
    first, _ = kernel.enqueue(
        "export",
        scheduled_for=CLOCK_START,
        trigger_key="t1",
        then=[{"job_id": "report", "payload": {"to": "ops"}}],
        on_dead_letter="alert",
    )
    _run(result={"rows": 7})
    (follow,) = Occurrence.objects.filter(caused_by=first.pk)
    return first, follow


def test_the_predecessor_links_its_follow_ups_and_shows_what_it_declared(admin_client, chain):
    first, follow = chain
    text = _text(admin_client.get(url("occurrence", "change", first.pk)))
    assert "Chain and batch" in text
    # The declared follow-ups, per edge, each job linked, with its payload.
    assert "then (on success)" in text and "on dead letter" in text
    assert _link("job", "report") in text and _link("job", "alert") in text
    assert "payload <code>{&quot;to&quot;:&quot;ops&quot;}</code>" in text
    # The follow-up that was enqueued, linked, with its job, edge and status.
    assert _link("occurrence", follow.pk) in text
    assert f"<td>report</td><td>then (on success)</td><td>{OccurrenceStatus.QUEUED.label}</td>" in text


def test_a_follow_up_links_its_predecessor_and_shows_its_cause(admin_client, chain):
    first, follow = chain
    text = _text(admin_client.get(url("occurrence", "change", follow.pk)))
    assert f"<a {_link('occurrence', first.pk)}>{first.pk}</a> (job export, Succeeded)" in text
    assert "&quot;rows&quot;: 7" in text  # the cause: what the handler sees of its predecessor


def test_a_pruned_predecessor_is_named_in_plain_text(admin_client, chain, clock):
    first, follow = chain
    clock.advance(hours=2)
    prune(timedelta(hours=1))
    assert not Occurrence.objects.filter(pk=first.pk).exists()
    text = _text(admin_client.get(url("occurrence", "change", follow.pk)))
    assert f"{first.pk} (pruned; its outcome is in the cause below)" in text
    assert _link("occurrence", first.pk) not in text


def test_follow_ups_not_yet_enqueued_and_a_plain_occurrence(admin_client, jobs, clock):
    waiting, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="w", then="report")
    text = _text(admin_client.get(url("occurrence", "change", waiting.pk)))
    assert "none yet (they are enqueued when it ends)" in text
    plain, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="p")
    assert "Chain and batch" not in _text(admin_client.get(url("occurrence", "change", plain.pk)))


def test_a_member_links_its_batch_and_the_callback_the_batch_it_completes(admin_client, jobs, clock):
    _, results = kernel.enqueue_batch(
        "export",
        [{"scheduled_for": CLOCK_START, "trigger_key": "m1"}],
        callback="report",
        batch_id="nightly",
        description="the nightly export",
    )
    ((member, _),) = results
    text = _text(admin_client.get(url("occurrence", "change", member.pk)))
    assert f"<a {_link('batch', 'nightly')}>nightly</a> (Closed, the nightly export)" in text
    _run()
    assert kernel.complete_due_batches() == 1  # the test's transaction runs no on_commit
    callback = Occurrence.objects.get(job_id="report")
    text = _text(admin_client.get(url("occurrence", "change", callback.pk)))
    assert "Callback of batch:" in text
    assert f"<a {_link('batch', 'nightly')}>nightly</a> (Completed, the nightly export)" in text


def test_an_occurrence_page_reads_the_same_at_any_size(admin_client, chain, clock):
    first, _ = chain

    def statements() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(url("occurrence", "change", first.pk)).status_code == 200
        return len(ctx.captured_queries)

    before = statements()
    for n in range(30):  # other chains, and other follow-ups
        kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key=f"other{n}", then="report")
    for _ in range(30):
        _run(kind="reports.export")
    assert Occurrence.objects.filter(caused_by__isnull=False).count() == 31
    assert statements() == before


# --------------------------------------------------------------------------- batch pages


@pytest.fixture
def batch(jobs, clock):
    batch, _ = kernel.enqueue_batch(
        "export",
        [{"scheduled_for": CLOCK_START, "trigger_key": f"k{i}"} for i in range(3)],
        callback="report",
        callback_payload={"notify": "ops"},
        batch_id="b1",
        description="three exports",
        created_by="alice",
    )
    return batch


def test_the_batch_list_and_its_status_filter(admin_client, batch, clock):
    clock.advance(1)
    kernel.open_batch("alert", batch_id="b2")
    response = admin_client.get(url("batch", "changelist"))
    assert [b.pk for b in response.context["cl"].result_list] == ["b2", "b1"]
    text = _text(response)
    assert "three exports" in text and "alice" in text
    filtered = admin_client.get(url("batch", "changelist"), {"status__exact": "open"})
    assert [b.pk for b in filtered.context["cl"].result_list] == ["b2"]
    assert admin_client.get(url("batch", "changelist"), {"q": "b1"}).context["cl"].result_count == 1
    # No adding, editing or deleting: batches are made and ended through the API.
    assert admin_client.get(url("batch", "add")).status_code == 403
    assert admin_client.get(url("batch", "delete", "b1")).status_code == 403
    assert admin_client.post(url("batch", "change", "b1"), {"description": "x"}).status_code == 403


def test_the_batch_page_shows_progress_then_the_callback(admin_client, batch, clock):
    _run()
    _run("failed", error="disk full", retryable=False)
    text = _text(admin_client.get(url("batch", "change", "b1")))
    assert '<progress max="3" value="2"></progress> 2 of 3 terminal (66%)' in text
    assert "<td>Succeeded</td><td>1</td>" in text and "<td>Dead Letter</td><td>1</td>" in text
    assert "<td>Queued</td><td>1</td>" in text
    assert "enqueued when every member has ended" in text
    assert "<code>{&quot;notify&quot;:&quot;ops&quot;}</code>" in text
    _run()
    assert kernel.complete_due_batches() == 1
    callback = Occurrence.objects.get(job_id="report")
    text = _text(admin_client.get(url("batch", "change", "b1")))
    assert f"<a {_link('occurrence', callback.pk)}>{callback.pk}</a>" in text
    # The counts it completed with.
    assert '<progress max="3" value="3"></progress> 3 of 3 terminal (100%)' in text
    assert "<td>Succeeded</td><td>2</td>" in text and "<td>Queued</td>" not in text
    assert "Close batch" not in text and "Cancel batch" not in text  # completed: nothing to do


def test_close_from_the_batch_page_asks_then_closes(admin_client, jobs, clock):
    kernel.open_batch("report", batch_id="open-one")
    kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="m", batch="open-one")
    page = _text(admin_client.get(url("batch", "change", "open-one")))
    assert 'value="close_batches"' in page and 'value="cancel_batches"' in page
    data = {"action": "close_batches", "_selected_action": ["open-one"], "_back_to": "open-one"}
    confirm = _text(admin_client.post(url("batch", "changelist"), data))
    assert "<strong>1</strong> batch selected. <strong>1</strong> will be closed" in confirm
    assert Batch.objects.get().status == BatchStatus.OPEN  # nothing yet
    response = admin_client.post(url("batch", "changelist"), {**data, "index": "0", "post": "yes"})
    assert response.status_code == 302 and response["Location"] == url("batch", "change", "open-one")
    done = admin_client.get(response["Location"])
    assert page_messages(done) == [
        "Closed (each completes, and its callback is enqueued, once its members have ended): 1 batch."
    ]
    batch = Batch.objects.get()
    assert batch.status == BatchStatus.CLOSED and batch.closed_at == clock()
    assert Event.objects.filter(event_type="batch_closed", data__batchId="open-one").count() == 1
    # Closed: it can still be cancelled, not closed again.
    page = _text(done)
    assert 'value="close_batches"' not in page and 'value="cancel_batches"' in page
    assert run_action(admin_client, "batch", "close_batches", ["open-one"]) == [
        "Closed (each completes, and its callback is enqueued, once its members have ended): "
        "0 batches. 1 skipped (not open)."
    ]


def test_cancel_names_the_user_and_cancels_the_waiting_members(admin_client, batch, clock):
    running = kernel.claim(owner=OWNER, lease=60)
    assert running is not None
    messages = run_action(admin_client, "batch", "cancel_batches", ["b1"])
    assert messages == [
        "Cancelled (waiting members cancelled, running ones finish; then the callback runs): 1 batch."
    ]
    cancelled = Batch.objects.get()
    assert (cancelled.cancelled_by, cancelled.cancelled_at) == ("admin", clock())
    statuses = sorted(Occurrence.objects.filter(batch_id="b1").values_list("status", flat=True))
    assert statuses == ["cancelled", "cancelled", "running"]
    (event,) = Event.objects.filter(event_type="batch_cancelled")
    assert event.data["requestedBy"] == "admin" and event.data["cancelled"] == 2
    assert event.data["reason"] == "batch cancelled in the admin by admin"
    # Once the running member ends, the batch completes; cancelling it then fails, and says so.
    kernel.settle(running.pk, owner=OWNER, fence=running.fence, outcome="succeeded")
    assert kernel.complete_due_batches() == 1
    assert run_action(admin_client, "batch", "cancel_batches", ["b1"]) == [
        "Cancelled (waiting members cancelled, running ones finish; then the callback runs): "
        "0 batches. 1 skipped (not open or closed)."
    ]


def test_batch_actions_need_the_change_permission(client, batch):
    client.force_login(staff_user("viewer", "view_batch"))
    page = _text(client.get(url("batch", "change", "b1")))
    assert "close_batches" not in page and "cancel_batches" not in page
    assert "cancel_batches" not in _text(client.get(url("batch", "changelist")))
    run_action(client, "batch", "cancel_batches", ["b1"])
    assert Batch.objects.get().cancelled_at is None
    client.force_login(staff_user("operator", "view_batch", "change_batch"))
    assert 'value="cancel_batches"' in _text(client.get(url("batch", "change", "b1")))
    run_action(client, "batch", "cancel_batches", ["b1"])
    assert Batch.objects.get().cancelled_by == "operator"


# --------------------------------------------------------------------------- the job form


def test_the_job_form_saves_follow_ups_through_update_job(admin_client, jobs):
    job = Job.objects.get(pk="export")
    then = json.dumps(["report", {"job_id": "alert", "payload": {"level": 2}}])
    response = admin_client.post(url("job", "change", "export"), job_data(job, then=then))
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert job.revision == 2
    assert job.then == [{"job_id": "report"}, {"job_id": "alert", "payload": {"level": 2}}]
    assert job.on_dead_letter is None
    event = Event.objects.get(event_type="job_updated", job_id="export")
    assert event.data["changed"] == ["then"]
    # Shown back as JSON text; saving it unchanged writes nothing.
    text = _text(admin_client.get(url("job", "change", "export")))
    assert "&quot;level&quot;: 2" in text
    response = admin_client.post(url("job", "change", "export"), job_data(job, then=json.dumps(job.then)))
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.revision == 2


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"then": '["nope"]'}, "then", "then: job 'nope' does not exist"),
        ({"on_dead_letter": '[{"job_id": "nope"}]'}, "on_dead_letter", "on_dead_letter: job 'nope'"),
        ({"then": '[{"job_id": "report", "then": ["alert"]}]'}, "then", "then[0].then: is not a follow-up"),
        ({"then": "[1]"}, "then", "then[0]"),
        ({"then": "{not json"}, "then", "Enter a valid JSON"),
    ],
)
def test_bad_follow_ups_are_field_errors_and_nothing_is_saved(admin_client, jobs, overrides, field, message):
    job = Job.objects.get(pk="export")
    before = snapshot()
    response = admin_client.post(url("job", "change", "export"), job_data(job, **overrides))
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == [field], errors
    assert message in errors[field][0]
    assert snapshot() == before


def test_a_cycle_is_refused_on_the_then_field(admin_client, jobs):
    kernel.update_job("report", expected_revision=1, then=["alert"])
    kernel.update_job("alert", expected_revision=1, then=["export"])
    job = Job.objects.get(pk="export")
    before = snapshot()
    response = admin_client.post(url("job", "change", "export"), job_data(job, then='["report"]'))
    errors = form_errors(response)
    assert list(errors) == ["then"], errors
    assert "makes a cycle of follow-ups: export -> report -> alert -> export" in errors["then"][0]
    assert snapshot() == before


def test_adding_a_job_with_an_unknown_follow_up(admin_client, jobs):
    data = {
        "job_id": "new-job",
        "kind": "reports.send",
        "trigger": "{}",
        "payload": "null",
        "authority": json.dumps(authority_for("bob", "reports.send")),
        "then": '["missing"]',
        "max_attempts": 3,
        "loaded_revision": 0,
        "enabled": "on",
        "_save": "Save",
    }
    response = admin_client.post(url("job", "add"), data)
    errors = form_errors(response)
    assert list(errors) == ["then"] and "job 'missing' does not exist" in errors["then"][0]
    assert not Job.objects.filter(pk="new-job").exists()
    response = admin_client.post(url("job", "add"), {**data, "then": '["report"]'})
    assert response.status_code == 302, form_errors(response)
    assert Job.objects.get(pk="new-job").then == [{"job_id": "report"}]


# --------------------------------------------------------------------------- the dashboard


def test_the_dashboard_lists_the_batches_in_progress(admin_client, batch, clock):
    clock.advance(1)
    kernel.open_batch("alert", batch_id="later")
    kernel.enqueue_batch("export", [], callback="report", batch_id="empty")
    assert kernel.complete_due_batches() == 1  # no member: complete at once
    _run()
    clock.advance(minutes=90, seconds=-1)
    response = admin_client.get(reverse(DASHBOARD))
    assert [row.batch.pk for row in response.context["board"].batches] == ["later", "b1"]
    text = _text(response)
    assert f"<a {_link('batch', 'b1')}>b1</a>" in text and _link("batch", "empty") not in text
    assert "1 / 3 (33%)" in text and "0 / 0 (empty)" in text
    assert "1 hour, 30 minutes" in text
    assert f'href="{url("batch", "changelist")}"' in text


def test_a_batch_without_members_is_empty_not_done(admin_client, jobs):
    """An open batch nothing was added to yet reads as empty on the dashboard and its page,
    never as 100 %."""
    kernel.open_batch("alert", batch_id="later")
    (row,) = admin_client.get(reverse(DASHBOARD)).context["board"].batches
    assert row.progress == chainview.Terminal(0, True, 0) and row.progress.percent is None
    text = _text(admin_client.get(reverse(DASHBOARD)))
    assert "0 / 0 (empty)" in text and "%)" not in text.split('id="dsch-batches"')[1]
    text = _text(admin_client.get(url("batch", "change", "later")))
    assert '<progress max="1" value="0"></progress> 0 of 0 terminal (empty)' in text


def test_the_dashboard_counts_a_batch_with_bounded_reads(batch):
    for _ in range(2):
        _run()
    stored = Batch.objects.get()
    assert chainview.terminal_members(stored, "default") == chainview.Terminal(2, True, 3)
    # At most ``bound`` members read per count: with both counts at the bound, a lower bound.
    assert chainview.terminal_members(stored, "default", bound=1) == chainview.Terminal(1, False, 3)
    assert chainview.terminal_members(stored, "default", bound=2) == chainview.Terminal(2, True, 3)


# --------------------------------------------------------------------------- history(follow=True)


def test_history_follows_a_chain(jobs, clock):
    first, _ = kernel.enqueue(
        "export",
        scheduled_for=CLOCK_START,
        trigger_key="t1",
        then=[{"job_id": "report", "then": ["alert"]}],
    )
    unrelated, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t2")
    _run(kind="reports.export")
    _run(kind="reports.export")
    (second,) = Occurrence.objects.filter(caused_by=first.pk)
    _run(kind="reports.send")
    (third,) = Occurrence.objects.filter(caused_by=second.pk)
    _run(kind="ops.page")
    chain_ids = {first.pk, second.pk, third.pk}
    followed = scheduler.history(occurrence_id=first.pk, follow=True, limit=1000)
    expected = list(Event.objects.filter(occurrence_id__in=chain_ids).order_by("-event_id"))
    assert followed == expected and {e.occurrence_id for e in followed} == chain_ids
    assert unrelated.pk not in {e.occurrence_id for e in followed}
    # From the middle: that step and what follows; limited, newest first.
    middle = scheduler.history(occurrence_id=second.pk, follow=True)
    assert {e.occurrence_id for e in middle} == {second.pk, third.pk}
    assert scheduler.history(occurrence_id=first.pk, follow=True, limit=2) == expected[:2]
    # Without follow, as before: the occurrence's own events.
    assert {e.occurrence_id for e in scheduler.history(occurrence_id=first.pk)} == {first.pk}
    # A chain is followed to a bounded number of occurrences, nearest steps first.
    assert events.chain_of(first.pk, "default") == [first.pk, second.pk, third.pk]
    assert events.chain_of(first.pk, "default", limit=2) == [first.pk, second.pk]
    # With a job too: the chain's events of that job.
    of_report = scheduler.history(job_id="report", occurrence_id=first.pk, follow=True)
    assert {e.occurrence_id for e in of_report} == {second.pk}


def test_history_follows_a_chain_whose_head_is_pruned(jobs, clock):
    first, _ = kernel.enqueue("export", scheduled_for=CLOCK_START, trigger_key="t1", then="report")
    _run()
    clock.advance(hours=2)
    prune(timedelta(hours=1))
    (follow,) = Occurrence.objects.filter(caused_by=first.pk)
    found = scheduler.history(occurrence_id=first.pk, follow=True)
    assert found and {e.occurrence_id for e in found} == {follow.pk}


def test_history_follow_is_checked(jobs):
    with pytest.raises(InvalidArgument) as info:
        scheduler.history(follow=True)
    assert info.value.details["field"] == "follow" and "occurrence_id" in str(info.value)
    with pytest.raises(InvalidArgument) as info:
        scheduler.history(job_id="export", follow=True)
    assert info.value.details["field"] == "follow"
    with pytest.raises(InvalidArgument) as info:
        scheduler.history(occurrence_id="x", follow="yes")
    assert info.value.details["field"] == "follow"
