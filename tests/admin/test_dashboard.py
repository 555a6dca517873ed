"""The admin dashboard: what ran per kind over the last hour and day, the due lag, the workers
and what each runs, budget use, the last day's dead letters; view permission only; a number of
queries that does not grow with the rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.admin import dashboard
from django_durable_scheduler.models import Event, Occurrence, WorkerHeartbeat

from .test_admin import staff_user

pytestmark = pytest.mark.django_db

URL = "admin:durable_scheduler_schedulerdashboard_changelist"


def run(job_id: str, outcome: str, clock, n: int = 1, **settle) -> None:
    """``n`` occurrences of ``job_id`` claimed by worker w1 and settled as ``outcome``."""
    for _ in range(n):
        clock.advance(1)
        occ, _ = kernel.enqueue(job_id, scheduled_for=clock(), trigger_key=f"t{clock().timestamp()}")
        held = kernel.claim(owner="w1", lease=60)
        assert held is not None and held.pk == occ.pk
        policy = scheduler.get_policy("app", "durable_scheduler")
        scheduler.reserve_authority(held.pk, policy_revision=policy.revision)
        if outcome == "succeeded":
            kernel.settle(held.pk, owner="w1", fence=held.fence, outcome="succeeded", result={"ok": 1})
        else:
            kernel.settle(
                held.pk,
                owner="w1",
                fence=held.fence,
                outcome="failed",
                retryable=False,
                error={"type": "ValueError", "message": "the printer is on fire"},
            )


def budget(principal_id: str, max_runs: int) -> None:
    """Give the ``app`` principal a budget of ``max_runs`` a day (it has none by default)."""
    policy = scheduler.get_policy("app", principal_id)
    scheduler.set_policy(
        "app",
        principal_id,
        capabilities=policy.capabilities,
        window=86_400,
        max_runs=max_runs,
        expected_revision=policy.revision,
    )


@pytest.fixture
def world(clock):
    scheduler.create_job("mail", "mail.send")
    scheduler.create_job("sync", "crm.sync")
    budget("durable_scheduler", 100_000)
    clock.advance(hours=-30)
    run("mail", "succeeded", clock, n=2)  # more than a day ago: in neither chart
    clock.advance(hours=26)
    run("mail", "succeeded", clock, n=3)  # within the day, not the hour
    clock.advance(hours=3, minutes=30)
    run("mail", "succeeded", clock, n=4)
    run("sync", "failed", clock, n=2)
    clock.advance(1)
    kernel.enqueue("sync", scheduled_for=clock(), trigger_key="running")
    kernel.claim(owner="w1", lease=3600)
    WorkerHeartbeat.objects.create(
        worker_id="w1", hostname="host", pid=1, concurrency=4, started_at=clock(), last_seen_at=clock()
    )
    clock.advance(minutes=2)  # the oldest due: none; the running one still leased


def test_the_figures(world):
    board = dashboard.collect()
    hour, day = (dict((k.kind, k.counts) for k in kinds) for kinds in board.outcomes.values())
    assert hour == {"mail.send": {"succeeded": 4}, "crm.sync": {"dead_letter": 2}}
    assert day == {"mail.send": {"succeeded": 7}, "crm.sync": {"dead_letter": 2}}
    assert [kind.kind for kind in board.outcomes["last day"]] == ["mail.send", "crm.sync"]
    assert [(row.worker.worker_id, [run.kind for run in row.running]) for row in board.workers()] == [
        ("w1", ["crm.sync"])
    ]
    # The runs of the current window (a day, epoch-aligned) charged to the default principal.
    assert [(b.principal_id, b.runs) for b in board.budgets] == [("durable_scheduler", 9)]  # 3 + 4 + 2
    assert [o.job_id for o in board.dead_letters] == ["sync", "sync"]
    (chart, _) = board.charts()
    (mail, sync) = chart.rows
    # Bars are scaled to the longest: 4 runs fill the bar, 2 take half of it.
    assert mail["segments"] == [
        {"outcome": "succeeded", "n": 4, "x": dashboard.LABEL_WIDTH, "width": dashboard.BAR_WIDTH}
    ]
    assert sync["segments"][0]["width"] == dashboard.BAR_WIDTH / 2 and sync["y"] == dashboard.ROW_HEIGHT


def test_what_settled_this_instant_counts_everywhere(db, clock):
    # The clock stands still: the dead letters settled at "now" itself.
    scheduler.create_job("sync", "crm.sync")
    run("sync", "failed", clock, n=2)
    board = dashboard.collect()
    hour, day = (dict((k.kind, k.counts) for k in kinds) for kinds in board.outcomes.values())
    assert hour == day == {"crm.sync": {"dead_letter": 2}}
    assert board.status.counts["dead_letter"] == 2 == len(board.dead_letters)


def test_the_page_with_view_permission_only(client, world):
    client.force_login(staff_user("viewer", "view_occurrence"))
    page = client.get(reverse(URL))
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("Runs per kind, last hour", "mail.send", "crm.sync", "the printer is on fire", "w1"):
        assert text in html, text
    assert 'http-equiv="refresh"' in html
    timelines, per_kind = html.split('id="dsch-health"')
    assert per_kind.count('<rect class="dsch-succeeded"') == 2  # one bar per chart
    # Over the last day (the default range), an hourly bar: the runs of two hours succeeded.
    assert timelines.count('<rect class="dsch-succeeded"') == 2
    index = client.get(reverse("admin:index")).content.decode()
    assert reverse(URL) in index


def test_a_running_occurrence_can_be_cancelled_from_the_page(client, world):
    """A user who may change occurrences gets a cancel button per running one (it posts the
    occurrence admin's cancel action, whose confirmation page follows); once asked, it shows
    as stopping. A viewer gets no button."""
    (running,) = Occurrence.objects.filter(status="running")
    client.force_login(staff_user("viewer", "view_occurrence"))
    assert 'value="cancel_occurrences"' not in client.get(reverse(URL)).content.decode()
    client.force_login(staff_user("operator", "view_occurrence", "change_occurrence"))
    html = client.get(reverse(URL)).content.decode()
    assert 'value="cancel_occurrences"' in html and f'value="{running.pk}"' in html
    data = {"action": "cancel_occurrences", "_selected_action": [running.pk]}
    changelist = reverse("admin:durable_scheduler_occurrence_changelist")
    confirm = " ".join(client.post(changelist, data).content.decode().split())
    assert "<strong>1</strong> will be cancelled (a running one is asked to stop" in confirm
    client.post(changelist, {**data, "index": "0", "post": "yes"})
    (event,) = Event.objects.filter(occurrence_id=running.pk, event_type="occurrence_cancel_requested")
    assert event.data["requestedBy"] == "operator"
    html = client.get(reverse(URL)).content.decode()
    assert "(stopping)" in html and 'value="cancel_occurrences"' not in html
    assert [run.stopping for row in dashboard.collect().workers() for run in row.running] == [True]


def test_without_permission(client, world):
    client.force_login(staff_user("nobody"))
    assert client.get(reverse(URL)).status_code == 403


def test_the_queries_do_not_grow_with_the_rows(admin_client, world, clock):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(reverse(URL)).status_code == 200
        return len(queries)

    count()  # the first view counts the hours that are over (rollups): later ones read them
    before = count()
    run("mail", "succeeded", clock, n=20)
    run("sync", "failed", clock, n=10)
    assert count() == before


def test_an_unknown_range_or_kind_is_named_on_the_page(admin_client, world):
    """A ``?range=`` or ``?kind=`` the dashboard does not know shows the default instead, and
    a warning on the page says which value and what is shown."""
    page = admin_client.get(reverse(URL), {"range": "fortnight", "kind": "no.such"})
    assert page.status_code == 200
    assert (page.context["timeline"].range.name, page.context["timeline"].kind) == ("day", None)
    warnings = [str(m) for m in page.context["messages"] if m.level_tag == "warning"]
    assert warnings == [
        'Unknown range "fortnight" (hour, day or week): showing the last day.',
        'No job has the kind "no.such": showing every kind.',
    ]
    html = page.content.decode()
    assert 'class="warning"' in html and "Unknown range &quot;fortnight&quot;" in html
    page = admin_client.get(reverse(URL), {"range": "week", "kind": "crm.sync"})
    assert (page.context["timeline"].range.name, page.context["timeline"].kind) == ("week", "crm.sync")
    assert not list(page.context["messages"])


PAUSE = "admin:durable_scheduler_pausedkind_pause_or_resume"


def test_a_kind_is_paused_and_resumed_from_the_page(client, world, clock):
    """A user who may change paused kinds gets the pause control (the jobs' kinds) and a resume
    button per paused kind; the paused kind's due work shows as paused, not late. A viewer
    gets neither, and a post without the permission is refused."""
    kernel.enqueue("mail", scheduled_for=clock() - timedelta(minutes=30), trigger_key="late")
    client.force_login(staff_user("viewer", "view_occurrence"))
    html = client.get(reverse(URL)).content.decode()
    assert 'id="dsch-pause"' not in html and "None: every kind is claimed." in html
    assert client.post(reverse(PAUSE), {"change": "pause", "kind": "mail.send"}).status_code == 403
    assert scheduler.paused_kinds() == []
    client.force_login(staff_user("operator", "view_occurrence", "change_pausedkind"))
    html = client.get(reverse(URL)).content.decode()
    assert '<option value="mail.send">' in html.split('id="dsch-pause"')[1]
    page = client.post(reverse(PAUSE), {"change": "pause", "kind": "mail.send"}, follow=True)
    assert [str(m) for m in page.context["messages"]] == ["Paused 1 kind."]
    (paused,) = scheduler.paused_kinds()
    assert (paused.kind, paused.paused_by) == ("mail.send", "operator")
    board = page.context["board"]
    assert board.status.due == 0 and [(p.kind, p.due) for p in board.status.paused] == [("mail.send", 1)]
    html = page.content.decode()
    assert "Paused, not late" in html and 'name="change" value="resume"' in html
    assert '<option value="mail.send">' not in html.split('id="dsch-pause"')[1]
    page = client.post(reverse(PAUSE), {"change": "resume", "kind": "mail.send"}, follow=True)
    assert [str(m) for m in page.context["messages"]] == ["Resumed 1 kind."]
    assert scheduler.paused_kinds() == [] and page.context["board"].status.due == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"change": "pause", "kind": ""}, "1 failed: : kind: must not be empty"),
        ({"change": "pause", "kind": "no.such"}, "1 failed: no.such: kind 'no.such': no job has this kind"),
        ({"change": "stop", "kind": "mail.send"}, "change: must be pause or resume, not 'stop'"),
    ],
)
def test_a_bad_post_of_the_control_is_named_and_changes_nothing(admin_client, world, data, message):
    page = admin_client.post(reverse(PAUSE), data, follow=True)
    assert any(str(m).startswith(message) for m in page.context["messages"]), list(page.context["messages"])
    assert scheduler.paused_kinds() == [] and not Event.objects.filter(event_type="kind_paused").exists()
    assert admin_client.get(reverse(PAUSE)).status_code == 405


def test_the_jobs_and_paused_kinds_admins_pause_and_resume(admin_client, world):
    jobs = reverse("admin:durable_scheduler_job_changelist")
    admin_client.post(jobs, {"action": "pause_kinds", "_selected_action": ["mail", "sync"]})
    assert [p.kind for p in scheduler.paused_kinds()] == ["crm.sync", "mail.send"]
    page = admin_client.post(jobs, {"action": "pause_kinds", "_selected_action": ["mail"]}, follow=True)
    assert [str(m) for m in page.context["messages"]][-1] == "Paused 0 kinds. 1 skipped (already paused)."
    paused = reverse("admin:durable_scheduler_pausedkind_changelist")
    assert "mail.send" in admin_client.get(paused).content.decode()
    admin_client.post(paused, {"action": "resume_kinds", "_selected_action": ["mail.send"]})
    assert [p.kind for p in scheduler.paused_kinds()] == ["crm.sync"]
    admin_client.post(jobs, {"action": "resume_kinds", "_selected_action": ["sync"]})
    assert scheduler.paused_kinds() == []
    assert Event.objects.filter(event_type="kind_resumed", data__by="admin").count() == 2


def test_a_principal_held_at_its_budget_shows_until_when(admin_client, clock):
    scheduler.create_job("mail", "mail.send")
    budget("durable_scheduler", 2)
    run("mail", "succeeded", clock, n=2)
    board = dashboard.collect()
    (held,) = board.held
    assert (held.principal_id, held.runs, held.max_runs, held.max_units) == ("durable_scheduler", 2, 2, None)
    page = admin_client.get(reverse(URL)).content.decode()
    until = held.window_ends_at.strftime("%Y-%m-%d %H:%M:%S")
    assert f"app:durable_scheduler is held at its budget until {until} UTC" in page
    assert "2 (no limit)" in page  # the units, which have no limit


def test_no_principal_is_held_below_its_budget(admin_client, clock):
    scheduler.create_job("mail", "mail.send")
    budget("durable_scheduler", 3)
    run("mail", "succeeded", clock, n=2)
    assert dashboard.collect().held == []
    assert "held at its budget" not in admin_client.get(reverse(URL)).content.decode()
