"""The admin, through Django's test client: every page renders, policy and
job edits go through the API with revision checks, bad input comes back as field errors,
permissions are Django's model permissions, actions go through the kernel, no N+1 lists."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_durable_scheduler import kernel
from django_durable_scheduler.admin.forms import describe_window, parse_capability_lines, split_window
from django_durable_scheduler.admin.policies import revision_diff
from django_durable_scheduler.kernel.authority import policies
from django_durable_scheduler.kernel.authority.reservations import reserve_authority
from django_durable_scheduler.models import (
    AuthorityPolicy,
    AuthorityPolicyRevision,
    AuthorityUsage,
    Event,
    Job,
    Occurrence,
    OccurrenceStatus,
    WorkerHeartbeat,
)
from django_durable_scheduler.rules.identity import derive_occurrence_identity
from django_durable_scheduler.rules.validation import to_ms

from ..conftest import AUTHORITY, authority_for

pytestmark = pytest.mark.django_db

ADMIN = "durable_scheduler"


def url(model: str, view: str, *args: object) -> str:
    return reverse(f"admin:{ADMIN}_{model}_{view}", args=[quote(a) for a in args])


@pytest.fixture
def policy(db, clock):
    return policies.set_policy(
        "user",
        "alice",
        capabilities=["reports.send", "reports.read"],
        window=timedelta(hours=1),
        max_runs=10,
        max_units=20,
        changed_by="setup",
    )


def policy_data(policy: AuthorityPolicy, **overrides: object) -> dict[str, object]:
    """The change form's POST data for ``policy`` as loaded, with ``overrides``."""
    amount, unit = split_window(policy.window_ms)
    data: dict[str, object] = {
        "capabilities": "\n".join(policy.capabilities),
        "window_value": amount,
        "window_unit": unit,
        "max_runs": policy.max_runs,
        "max_units": policy.max_units,
        "loaded_revision": policy.revision,
        "_save": "Save",
    }
    if policy.enabled:
        data["enabled"] = "on"
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def form_errors(response) -> dict[str, list[str]]:
    form = response.context["adminform"].form
    return {key: [str(m) for m in messages] for key, messages in form.errors.items()}


def staff_user(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label=ADMIN, codename__in=codenames)
    )
    return user


def page_messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


# --------------------------------------------------------------------------- every page


@pytest.fixture
def populated(policy, job, clock):
    occurrence, _ = kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="t1")
    claimed = kernel.claim(owner="w1", lease=30)
    assert claimed is not None
    reserve_authority(claimed.occurrence_id, policy_revision=policy.revision)
    WorkerHeartbeat.objects.create(
        worker_id="host:1",
        hostname="host",
        pid=1,
        concurrency=4,
        started_at=clock(),
        last_seen_at=clock(),
    )
    return occurrence


def test_every_page_renders(admin_client, populated):
    assert admin_client.get(reverse("admin:index")).status_code == 200
    assert admin_client.get(reverse("admin:app_list", args=[ADMIN])).status_code == 200
    objects = {
        "job": Job.objects.get(),
        "occurrence": Occurrence.objects.get(),
        "event": Event.objects.first(),
        "authoritypolicy": AuthorityPolicy.objects.get(),
        "authorityusage": AuthorityUsage.objects.get(),
        "authorityreservation": populated.reservation,
        "authoritypolicyrevision": AuthorityPolicyRevision.objects.first(),
        "workerheartbeat": WorkerHeartbeat.objects.get(),
    }
    for model, obj in objects.items():
        changelist = admin_client.get(url(model, "changelist"))
        assert changelist.status_code == 200, model
        assert admin_client.get(url(model, "changelist"), {"q": "alice"}).status_code == 200, model
        change = admin_client.get(url(model, "change", obj.pk))
        assert change.status_code == 200, model
    for model in ("job", "authoritypolicy"):
        assert admin_client.get(url(model, "add")).status_code == 200
    for model in ("occurrence", "event", "authorityusage", "authorityreservation", "workerheartbeat"):
        assert admin_client.get(url(model, "add")).status_code == 403, model
        assert admin_client.get(url(model, "delete", objects[model].pk)).status_code == 403, model
    # Deleting would bypass the API.
    assert admin_client.get(url("job", "delete", "job-a")).status_code == 403
    assert (
        admin_client.get(url("authoritypolicy", "delete", objects["authoritypolicy"].pk)).status_code == 403
    )


def test_list_filters_render(admin_client, populated):
    for params in (
        {"status__exact": "running"},
        {"job__kind": "reports.send"},
        {"job__job_id__exact": "job-a"},
    ):
        response = admin_client.get(url("occurrence", "changelist"), params)
        assert response.status_code == 200
        assert populated.occurrence_id in response.content.decode()
    response = admin_client.get(url("job", "changelist"))
    text = response.content.decode()
    assert "no schedule (enqueue only)" in text
    assert "Running" in text  # last outcome


# --------------------------------------------------------------------------- policy edits


def test_policy_change_page_shows_usage_preview_and_history(admin_client, policy, job):
    response = admin_client.get(url("authoritypolicy", "change", policy.pk))
    text = response.content.decode()
    assert response.status_code == 200
    assert "Usage in the current window" in text
    assert "0 of 10" in text and "0 of 20" in text
    assert "2026-01-05 12:00:00 &ndash; 2026-01-05 13:00:00 UTC" in text
    assert 'name="loaded_revision" value="1"' in text
    form = response.context["adminform"].form
    assert form["capabilities"].value() == "reports.read\nreports.send"
    assert (form["window_value"].value(), form["window_unit"].value()) == (1, "hours")
    preview = response.context["policy_preview"]
    assert preview["available"] and preview["source"] == "the saved values"
    assert (preview["rebound_jobs"], preview["stale_jobs"]) == (1, 0)
    assert 'name="_preview"' in text


def test_policy_save_goes_through_set_policy(admin_client, policy):
    data = policy_data(policy, capabilities="reports.send\n\n  reports.archive  \nreports.send\r\n")
    data.update(window_value=2, window_unit="days", max_runs=50, max_units=60)
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), data)
    assert response.status_code == 302, form_errors(response)
    policy.refresh_from_db()
    assert policy.revision == 2
    assert policy.capabilities == ["reports.archive", "reports.send"]
    assert policy.window_ms == 2 * 86_400_000
    assert (policy.max_runs, policy.max_units, policy.enabled) == (50, 60, True)
    history = policies.policy_history("user", "alice")
    assert [h.revision for h in history] == [2, 1]
    assert history[0].changed_by == "admin"
    entry = LogEntry.objects.get(object_id=str(policy.pk))
    assert entry.action_flag == CHANGE
    assert "Capabilities" in entry.get_change_message()


def test_policy_history_shows_a_diff(admin_client, policy):
    policies.set_policy(
        "user",
        "alice",
        capabilities=["reports.send", "reports.archive"],
        window=timedelta(hours=1),
        max_runs=15,
        max_units=20,
        enabled=False,
        expected_revision=1,
        changed_by="bob",
    )
    policy.refresh_from_db()
    response = admin_client.get(url("authoritypolicy", "change", policy.pk))
    newest, first = response.context["policy_history"]
    assert newest["revision"] == 2 and newest["changed_by"] == "bob"
    assert newest["added"] == ["reports.archive"]
    assert newest["removed"] == ["reports.read"]
    assert ("max runs", "10", "15") in newest["changes"]
    assert ("enabled", "yes", "no") in newest["changes"]
    assert all(label not in ("window", "max units") for label, _, _ in newest["changes"])
    assert first["initial"] and first["added"] == ["reports.read", "reports.send"]
    text = response.content.decode()
    assert 'class="dsch-added">reports.archive<' in text
    assert 'class="dsch-removed">reports.read<' in text
    assert "max runs: 10 &rarr; 15" in text


def test_revision_diff_without_change():
    a = AuthorityPolicyRevision(revision=1, content={"capabilities": ["x"], "window_ms": 60_000})
    b = AuthorityPolicyRevision(revision=2, content={"capabilities": ["x"], "window_ms": 120_000})
    entry = revision_diff(b, a)
    assert entry["changes"] == [("window", "1 minute", "2 minutes")]
    assert entry["added"] == entry["removed"] == []


def test_stale_revision_is_refused_and_nothing_written(admin_client, policy):
    # Someone else saves first.
    policies.set_policy(
        "user",
        "alice",
        capabilities=["reports.send"],
        window=3600,
        max_runs=99,
        max_units=20,
        expected_revision=1,
        changed_by="bob",
    )
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), policy_data(policy, max_runs=5))
    assert response.status_code == 200
    text = response.content.decode()
    assert "This policy was changed by someone else (now revision 2) since you opened it" in text
    assert "reload to see their change" in text
    fresh = AuthorityPolicy.objects.get(pk=policy.pk)
    assert (fresh.revision, fresh.max_runs, fresh.capabilities) == (2, 99, ["reports.send"])
    assert AuthorityPolicyRevision.objects.filter(principal_id="alice").count() == 2
    assert not LogEntry.objects.exists()
    # The page keeps what the user typed and the revision they loaded.
    form = response.context["adminform"].form
    assert form["max_runs"].value() == "5"
    assert 'name="loaded_revision" value="1"' in text


@pytest.mark.parametrize(
    ("capabilities", "message"),
    [
        ("reports.send\n*", "Line 2: &#x27;*&#x27; is not allowed"),
        ("reports.send\nbad\x01cap", "Line 2: must not contain control characters (found U+0001)"),
        ("\n  \n", "Enter at least one capability"),
        ("", "Enter at least one capability"),
        ("ok\n\n" + "x" * 257, "Line 3: must be at most 256 characters (got 257)"),
        ("a\rb", "Line 1: must not contain control characters (found U+000D)"),
    ],
)
def test_invalid_capabilities_are_field_errors(admin_client, policy, capabilities, message):
    response = admin_client.post(
        url("authoritypolicy", "change", policy.pk), policy_data(policy, capabilities=capabilities)
    )
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == ["capabilities"], errors
    assert message in response.content.decode()
    assert AuthorityPolicy.objects.get(pk=policy.pk).revision == 1


def test_policy_max_running_is_edited_with_the_other_fields(admin_client, policy):
    response = admin_client.post(
        url("authoritypolicy", "change", policy.pk), policy_data(policy, max_running=3)
    )
    assert response.status_code == 302, form_errors(response)
    policy.refresh_from_db()
    assert (policy.revision, policy.max_running) == (2, 3)
    assert policies.policy_history("user", "alice")[0].content["max_running"] == 3
    page = admin_client.get(url("authoritypolicy", "change", policy.pk)).content.decode()
    assert "Max running at once" in page
    # Emptied: no cap.
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), policy_data(policy))
    assert response.status_code == 302, form_errors(response)
    policy.refresh_from_db()
    assert (policy.revision, policy.max_running) == (3, None)


def test_too_many_capabilities(admin_client, policy):
    lines = "\n".join(f"cap.{i}" for i in range(257))
    response = admin_client.post(
        url("authoritypolicy", "change", policy.pk), policy_data(policy, capabilities=lines)
    )
    assert form_errors(response) == {"capabilities": ["At most 256 capabilities (got 257)."]}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_runs": 0}, "max_runs"),
        ({"max_runs": 1_000_001}, "max_runs"),
        ({"max_units": 0}, "max_units"),
        ({"max_units": "lots"}, "max_units"),
        ({"max_running": 0}, "max_running"),
        ({"max_running": 10_001}, "max_running"),
        ({"max_running": "many"}, "max_running"),
        ({"window_value": 0}, "window_value"),
        ({"window_value": 32, "window_unit": "days"}, "window_value"),
        ({"window_value": 31 * 24 * 60 + 1, "window_unit": "minutes"}, "window_value"),
        ({"window_unit": "fortnights"}, "window_unit"),
        ({"window_unit": "seconds"}, "window_unit"),
    ],
)
def test_out_of_range_budgets_and_window_are_field_errors(admin_client, policy, overrides, field):
    response = admin_client.post(
        url("authoritypolicy", "change", policy.pk), policy_data(policy, **overrides)
    )
    assert response.status_code == 200
    assert list(form_errors(response)) == [field]
    assert AuthorityPolicy.objects.get(pk=policy.pk).revision == 1


def test_window_bounds_are_inclusive(admin_client, policy):
    response = admin_client.post(
        url("authoritypolicy", "change", policy.pk), policy_data(policy, window_value=31, window_unit="days")
    )
    assert response.status_code == 302
    policy.refresh_from_db()
    response = admin_client.post(
        url("authoritypolicy", "change", policy.pk),
        policy_data(policy, window_value=1, window_unit="minutes"),
    )
    assert response.status_code == 302
    policy.refresh_from_db()
    assert (policy.revision, policy.window_ms) == (3, 60_000)


def test_window_set_through_the_api_in_seconds_round_trips(admin_client, policy):
    policies.set_policy(
        "user", "alice", capabilities=["a"], window=90, max_runs=1, max_units=1, expected_revision=1
    )
    policy.refresh_from_db()
    response = admin_client.get(url("authoritypolicy", "change", policy.pk))
    form = response.context["adminform"].form
    assert (form["window_value"].value(), form["window_unit"].value()) == (90, "seconds")
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), policy_data(policy, max_runs=2))
    assert response.status_code == 302
    policy.refresh_from_db()
    assert (policy.window_ms, policy.max_runs) == (90_000, 2)


def test_preview_shows_what_would_go_stale_without_saving(admin_client, policy, clock):
    kernel.create_job("job-b", "reports.read", authority=authority_for("alice", "reports.read"))
    kernel.enqueue("job-b", scheduled_for=clock(), trigger_key="t")
    data = policy_data(policy, capabilities="reports.send", _save=None, _preview="Preview change")
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), data)
    assert response.status_code == 200
    assert not form_errors(response)
    text = response.content.decode()
    assert "Please correct" not in text
    preview = response.context["policy_preview"]
    assert preview["source"] == "the values in the form"
    assert (preview["stale_jobs"], preview["stale_occurrences"]) == (1, 1)
    assert "1 job and\n      1 pending occurrence\n      would be left stale" in text
    assert AuthorityPolicy.objects.get(pk=policy.pk).revision == 1
    assert not LogEntry.objects.exists()
    # Disabling leaves everything stale.
    data = policy_data(policy, enabled=None, _save=None, _preview="Preview change")
    preview = admin_client.post(url("authoritypolicy", "change", policy.pk), data).context["policy_preview"]
    assert (preview["stale_jobs"], preview["rebound_jobs"]) == (1, 0)


def test_preview_of_invalid_values_explains(admin_client, policy):
    data = policy_data(policy, capabilities="*", _save=None, _preview="Preview change")
    response = admin_client.post(url("authoritypolicy", "change", policy.pk), data)
    assert "capabilities" in form_errors(response)
    assert response.context["policy_preview"]["source"] == "the saved values"


def test_add_policy_creates_revision_one(admin_client, clock):
    data = {
        "principal_type": "service",
        "principal_id": "billing",
        "capabilities": "invoices.send",
        "window_value": 30,
        "window_unit": "minutes",
        "max_runs": 5,
        "max_units": 5,
        "enabled": "on",
        "loaded_revision": 0,
        "_save": "Save",
    }
    response = admin_client.post(url("authoritypolicy", "add"), data)
    assert response.status_code == 302, form_errors(response)
    created = policies.get_policy("service", "billing")
    assert created is not None
    assert (created.revision, created.window_ms, created.capabilities) == (1, 1_800_000, ["invoices.send"])
    assert policies.policy_history("service", "billing")[0].changed_by == "admin"
    assert LogEntry.objects.filter(object_id=str(created.pk)).exists()
    # Adding it again: the API's compare-and-set (expected revision 0) refuses.
    response = admin_client.post(url("authoritypolicy", "add"), data)
    assert response.status_code == 200
    assert "A policy for this principal already exists (revision 1)" in response.content.decode()
    # A bad principal is a field error from the API.
    response = admin_client.post(url("authoritypolicy", "add"), {**data, "principal_type": "x" * 64 + "y"})
    assert "principal_type" in form_errors(response)
    response = admin_client.post(url("authoritypolicy", "add"), {**data, "principal_id": "bad\x07id"})
    assert "principal_id" in form_errors(response)


def test_add_policy_preview(admin_client, job):
    data = {
        "principal_type": "user",
        "principal_id": "alice",
        "capabilities": "other.cap",
        "window_value": 1,
        "window_unit": "days",
        "max_runs": 5,
        "max_units": 5,
        "enabled": "on",
        "loaded_revision": 0,
        "_preview": "Preview change",
    }
    response = admin_client.post(url("authoritypolicy", "add"), data)
    assert response.context["policy_preview"]["stale_jobs"] == 1
    assert not AuthorityPolicy.objects.exists()


def test_view_only_user_cannot_change_a_policy(client, policy):
    client.force_login(staff_user("viewer", "view_authoritypolicy"))
    response = client.get(url("authoritypolicy", "change", policy.pk))
    assert response.status_code == 200
    text = response.content.decode()
    assert "reports.read<br>reports.send<br>" in text
    assert "1 hour" in text
    assert 'name="capabilities"' not in text and 'name="_save"' not in text and 'name="_preview"' not in text
    response = client.post(url("authoritypolicy", "change", policy.pk), policy_data(policy, max_runs=1))
    assert response.status_code == 403
    assert client.get(url("authoritypolicy", "add")).status_code == 403
    assert AuthorityPolicy.objects.get(pk=policy.pk).revision == 1


def test_user_without_permissions_sees_nothing(client, policy):
    client.force_login(staff_user("nobody"))
    assert client.get(url("authoritypolicy", "change", policy.pk)).status_code == 403
    assert client.get(url("authoritypolicy", "changelist")).status_code == 403


def test_policy_with_change_permission_only_can_save(client, policy):
    client.force_login(staff_user("editor", "change_authoritypolicy"))
    response = client.post(url("authoritypolicy", "change", policy.pk), policy_data(policy, max_runs=3))
    assert response.status_code == 302
    assert policies.policy_history("user", "alice")[0].changed_by == "editor"


def test_helpers():
    assert split_window(86_400_000) == (1, "days")
    assert split_window(90 * 60_000) == (90, "minutes")
    assert split_window(7_200_000) == (2, "hours")
    assert split_window(1500) == (2, "seconds")
    assert describe_window(60_000) == "1 minute"
    assert describe_window(3 * 86_400_000) == "3 days"
    assert parse_capability_lines("b\na\n\nb") == (["b", "a"], [1, 2])


# --------------------------------------------------------------------------- jobs


def job_data(job: Job, **overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "kind": job.kind,
        "trigger": json.dumps(job.trigger),
        "payload": json.dumps(job.payload),
        "authority": json.dumps(job.authority),
        "max_attempts": job.max_attempts,
        "retry_base_delay": job.retry_base_delay_ms / 1000,
        "retry_max_delay": job.retry_max_delay_ms / 1000,
        "loaded_revision": job.revision,
        "_save": "Save",
    }
    if job.enabled:
        data["enabled"] = "on"
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def test_job_change_page_and_save_through_update_job(admin_client, job):
    response = admin_client.get(url("job", "change", "job-a"))
    assert response.status_code == 200
    text = response.content.decode()
    assert "no schedule (enqueue only)" in text
    assert "&quot;principal&quot;" in text  # the authority as JSON text
    data = job_data(job, trigger='{"every": 300}', max_attempts=5)
    response = admin_client.post(url("job", "change", "job-a"), data)
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert (job.revision, job.trigger["every"], job.max_attempts) == (2, 300, 5)
    assert job.next_fire_at is not None
    event = Event.objects.filter(event_type="job_updated").get()
    assert event.data["changed"] == ["max_attempts", "trigger"]
    assert LogEntry.objects.filter(object_id="job-a", action_flag=CHANGE).exists()


def test_job_save_without_changes_keeps_the_revision(admin_client, job):
    response = admin_client.post(url("job", "change", "job-a"), job_data(job))
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.revision == 1


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"trigger": '{"cron": "61 * * * *"}'}, "trigger", "trigger.cron"),
        ({"trigger": '{"every": 0}'}, "trigger", "trigger.every"),
        ({"trigger": "[1]"}, "trigger", "trigger"),
        ({"trigger": "{not json"}, "trigger", "Enter a valid JSON"),
        ({"authority": '{"principal": {"type": "user"}}'}, "authority", "authority.principal"),
        (
            {"authority": '{"principal": {"type": "user", "id": "a"}, "bogus": 1}'},
            "authority",
            "authority.bogus",
        ),
        ({"payload": "NaN"}, "payload", "payload"),
        ({"kind": "bad\x01kind"}, "kind", "control characters"),
        ({"max_attempts": 33}, "max_attempts", "less than or equal to 32"),
        ({"retry_base_delay": 0}, "retry_base_delay", "retry_base_delay"),
        ({"retry_base_delay": 100, "retry_max_delay": 10}, "retry_max_delay", "retry_max_delay"),
    ],
)
def test_bad_job_input_is_a_field_error(admin_client, job, overrides, field, message):
    response = admin_client.post(url("job", "change", "job-a"), job_data(job, **overrides))
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == [field], errors
    assert message in errors[field][0]
    job.refresh_from_db()
    assert job.revision == 1


def test_stale_job_revision_is_refused(admin_client, job):
    kernel.update_job("job-a", expected_revision=1, payload={"n": 2})
    response = admin_client.post(url("job", "change", "job-a"), job_data(job, max_attempts=7))
    assert response.status_code == 200
    assert "This job was changed by someone else (now revision 2)" in response.content.decode()
    job.refresh_from_db()
    assert (job.revision, job.max_attempts, job.payload) == (2, 3, {"n": 2})


def test_add_job_through_create_job(admin_client, clock):
    data = {
        "job_id": "new-job",
        "kind": "reports.send",
        "trigger": '{"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}',
        "payload": '{"to": "ops"}',
        "authority": json.dumps(AUTHORITY),
        "enabled": "on",
        "max_attempts": 3,
        "loaded_revision": 0,
        "_save": "Save",
    }
    response = admin_client.post(url("job", "add"), data)
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(pk="new-job")
    assert job.revision == 1 and job.payload == {"to": "ops"}
    assert job.retry_base_delay_ms == 10_000  # the settings' default
    assert Event.objects.filter(job=job, event_type="job_created").exists()
    response = admin_client.post(url("job", "add"), data)
    assert form_errors(response) == {"job_id": ["A job with this id already exists."]}
    response = admin_client.post(url("job", "add"), {**data, "job_id": "x", "trigger": ""})
    assert response.status_code == 302
    assert Job.objects.get(pk="x").trigger == {}
    response = admin_client.post(url("job", "add"), {**data, "job_id": "  "})
    assert "job_id" in form_errors(response)
    response = admin_client.post(url("job", "add"), {**data, "job_id": "y", "authority": ""})
    assert "authority" in form_errors(response)


def test_view_only_user_cannot_change_a_job(client, job):
    client.force_login(staff_user("viewer", "view_job"))
    response = client.get(url("job", "change", "job-a"))
    assert response.status_code == 200
    assert 'name="trigger"' not in response.content.decode()
    assert client.post(url("job", "change", "job-a"), job_data(job, max_attempts=9)).status_code == 403
    # No actions for a viewer: Django reports no action selected.
    response = client.post(
        url("job", "changelist"), {"action": "disable_jobs", "_selected_action": ["job-a"]}, follow=True
    )
    job.refresh_from_db()
    assert job.enabled and job.revision == 1


def run_action(client, model: str, action: str, ids: list[str]):
    """The action on ``ids``, confirmed (the occurrence actions ask first; the confirmation
    page is tested apart)."""
    data = {"action": action, "_selected_action": ids, "post": "yes"}
    response = client.post(url(model, "changelist"), data, follow=True)
    assert response.status_code == 200
    return page_messages(response)


def test_job_actions(admin_client, job, clock):
    kernel.create_job("job-b", "reports.send", authority=AUTHORITY, enabled=False)
    assert run_action(admin_client, "job", "disable_jobs", ["job-a", "job-b"]) == [
        "Disabled 1 job. 1 skipped (already disabled)."
    ]
    assert Job.objects.get(pk="job-a").enabled is False
    assert Job.objects.get(pk="job-a").revision == 2
    assert run_action(admin_client, "job", "enable_jobs", ["job-a", "job-b"]) == ["Enabled 2 jobs."]
    assert set(Job.objects.values_list("enabled", "revision")) == {(True, 3), (True, 2)}

    assert run_action(admin_client, "job", "run_now", ["job-a"]) == ["Enqueued 1 occurrence."]
    occurrence = Occurrence.objects.get()
    assert occurrence.trigger_key == "admin-run:2026-01-05T12:00:00.000Z:admin"
    assert occurrence.scheduled_for == clock()
    assert occurrence.payload == {"n": 1}

    kernel.update_job("job-b", expected_revision=2, enabled=False)
    messages = run_action(admin_client, "job", "run_now", ["job-b"])
    assert messages[0] == "Enqueued 0 occurrences."
    assert messages[1].startswith("1 failed: job-b: job 'job-b' is disabled")


def test_job_list_shows_latest_outcome(admin_client, job, clock):
    first, _ = kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="a")
    kernel.cancel(first.occurrence_id)
    clock.advance(1)
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="b")
    response = admin_client.get(url("job", "changelist"))
    (row,) = response.context["cl"].result_list
    assert row.latest_status == OccurrenceStatus.QUEUED
    assert admin_client.get(url("job", "changelist"), {"o": "7"}).status_code == 200


# --------------------------------------------------------------------------- occurrences


def dead_letter(clock, key: str) -> Occurrence:
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key=key)
    claimed = kernel.claim(owner="w", lease=30)
    assert claimed is not None
    return kernel.settle(
        claimed.occurrence_id, owner="w", fence=claimed.fence, outcome="failed", error="boom", retryable=False
    )


def test_occurrences_are_read_only(admin_client, job, clock):
    occurrence, _ = kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="t")
    response = admin_client.get(url("occurrence", "change", occurrence.pk))
    assert response.status_code == 200
    assert 'name="_save"' not in response.content.decode()
    assert (
        admin_client.post(url("occurrence", "change", occurrence.pk), {"status": "succeeded"}).status_code
        == 403
    )
    assert Occurrence.objects.get().status == OccurrenceStatus.QUEUED


def test_cancel_action(admin_client, job, clock):
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="q")
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="r")
    running = kernel.claim(owner="w", lease=30)
    assert running is not None
    other = Occurrence.objects.exclude(pk=running.pk).get()
    messages = run_action(admin_client, "occurrence", "cancel_occurrences", [other.pk, running.pk])
    assert messages == ["Cancelled or asked to stop: 2 occurrences."]
    other.refresh_from_db()
    assert other.status == OccurrenceStatus.CANCELLED
    assert other.last_error == {"code": "SCHEDULER_CANCELLED", "message": "cancelled in the admin by admin"}
    # The running one is asked to stop: its worker ends it; the event names who asked.
    asked = Occurrence.objects.get(pk=running.pk)
    assert asked.status == OccurrenceStatus.RUNNING and asked.cancel_requested_fence == running.fence
    (event,) = Event.objects.filter(occurrence_id=running.pk, event_type="occurrence_cancel_requested")
    assert event.data["requestedBy"] == "admin" and event.fence == running.fence
    assert event.data["reason"] == "cancelled in the admin by admin"
    kernel.settle(running.pk, owner="w", fence=running.fence, outcome="succeeded", result=1)
    messages = run_action(admin_client, "occurrence", "cancel_occurrences", [running.pk])
    skipped = "1 skipped (not queued or running or retry_wait)."
    assert messages == [f"Cancelled or asked to stop: 0 occurrences. {skipped}"]


def test_retry_dead_lettered_action(admin_client, job, clock):
    dead = dead_letter(clock, "d1")
    assert dead.status == OccurrenceStatus.DEAD_LETTER
    queued, _ = kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="q", payload={"other": 1})
    clock.advance(5)
    messages = run_action(admin_client, "occurrence", "retry_dead_lettered", [dead.pk, queued.pk])
    assert messages == ["Enqueued a retry of 1 dead-lettered occurrence. 1 skipped (not dead-lettered)."]
    retry = Occurrence.objects.get(trigger_key=f"retry:{dead.pk}")
    assert retry.status == OccurrenceStatus.QUEUED
    assert retry.payload == dead.payload
    assert retry.available_at == clock()
    assert Occurrence.objects.get(pk=dead.pk).status == OccurrenceStatus.DEAD_LETTER  # history kept
    # Again: the same retry is found, not a second one.
    messages = run_action(admin_client, "occurrence", "retry_dead_lettered", [dead.pk])
    assert messages[-1] == "1 had already been retried (the existing retry was kept)."
    assert Occurrence.objects.filter(trigger_key=f"retry:{dead.pk}").count() == 1
    # A disabled job cannot be retried: reported, not raised.
    kernel.update_job("job-a", expected_revision=1, enabled=False)
    other = dead_letter_disabled(clock)
    messages = run_action(admin_client, "occurrence", "retry_dead_lettered", [other.pk])
    assert "1 failed" in messages[-1] and "disabled" in messages[-1]


def dead_letter_disabled(clock) -> Occurrence:
    kernel.update_job("job-a", expected_revision=2, enabled=True)
    dead = dead_letter(clock, "d2")
    kernel.update_job("job-a", expected_revision=3, enabled=False)
    return dead


def test_occurrence_actions_need_change_permission(client, job, clock):
    occurrence, _ = kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="t")
    client.force_login(staff_user("viewer", "view_occurrence"))
    response = client.get(url("occurrence", "changelist"))
    assert "cancel_occurrences" not in response.content.decode()
    run_action(client, "occurrence", "cancel_occurrences", [occurrence.pk])
    assert Occurrence.objects.get().status == OccurrenceStatus.QUEUED

    client.force_login(staff_user("operator", "view_occurrence", "change_occurrence"))
    response = client.get(url("occurrence", "changelist"))
    text = response.content.decode()
    assert "cancel_occurrences" in text and "retry_dead_lettered" in text
    assert client.get(url("occurrence", "change", occurrence.pk)).status_code == 200
    assert client.post(url("occurrence", "change", occurrence.pk), {}).status_code == 403
    run_action(client, "occurrence", "cancel_occurrences", [occurrence.pk])
    assert Occurrence.objects.get().status == OccurrenceStatus.CANCELLED


def test_occurrence_actions_ask_first(admin_client, job, clock):
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="q")
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="r")
    running = kernel.claim(owner="w", lease=30)
    assert running is not None
    queued = Occurrence.objects.get(status=OccurrenceStatus.QUEUED)
    data = {"action": "cancel_occurrences", "_selected_action": [queued.pk, running.pk]}
    page = admin_client.post(url("occurrence", "changelist"), data)
    text = " ".join(page.content.decode().split())
    assert page.status_code == 200 and page_messages(page) == []
    assert "<strong>2</strong> occurrences selected" in text
    assert "<strong>2</strong> will be cancelled (a running one is asked to stop" in text
    assert Occurrence.objects.get(pk=queued.pk).status == OccurrenceStatus.QUEUED  # nothing yet
    for pk in (queued.pk, running.pk):
        assert f'name="_selected_action" value="{pk}"' in text
    response = admin_client.post(
        url("occurrence", "changelist"), {**data, "index": "0", "post": "yes"}, follow=True
    )
    assert page_messages(response) == ["Cancelled or asked to stop: 2 occurrences."]
    assert Occurrence.objects.get(pk=queued.pk).status == OccurrenceStatus.CANCELLED
    assert Occurrence.objects.get(pk=running.pk).cancel_requested_at is not None


def test_an_action_on_everything_a_filter_matches(admin_client, job, clock):
    for n in range(5):
        kernel.enqueue("job-a", scheduled_for=clock(), trigger_key=f"q{n}")
    running = kernel.claim(owner="w", lease=30)
    assert running is not None
    filtered = url("occurrence", "changelist") + "?status__exact=queued"
    one = Occurrence.objects.filter(status="queued").values_list("pk", flat=True)[0]
    data = {"action": "cancel_occurrences", "select_across": "1", "index": "0", "_selected_action": [one]}
    text = " ".join(admin_client.post(filtered, data).content.decode().split())
    assert "Every occurrence the list's filters match: <strong>4</strong> occurrences selected" in text
    # The rows checked on the page go back too: Django wants some, even for all that match.
    assert 'name="select_across" value="1"' in text and f'name="_selected_action" value="{one}"' in text
    response = admin_client.post(filtered, {**data, "post": "yes"}, follow=True)
    assert page_messages(response) == ["Cancelled or asked to stop: 4 occurrences."]
    assert Occurrence.objects.get(pk=running.pk).status == OccurrenceStatus.RUNNING
    assert Occurrence.objects.filter(status="cancelled").count() == 4


def test_run_now_action(admin_client, job, clock):
    later, _ = kernel.enqueue(
        "job-a", scheduled_for=clock(), trigger_key="later", available_at=clock() + timedelta(hours=1)
    )
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="due")
    running = kernel.claim(owner="w", lease=30)  # takes "due"
    assert running is not None and running.pk != later.pk
    clock.advance(5)
    messages = run_action(admin_client, "occurrence", "run_now", [later.pk, running.pk])
    assert messages == ["Made due now: 1 occurrence. 1 skipped (not queued or retry_wait)."]
    later.refresh_from_db()
    assert later.available_at == clock() and later.status == OccurrenceStatus.QUEUED
    (event,) = Event.objects.filter(occurrence_id=later.pk, event_type="occurrence_made_due")
    assert event.data["reason"] == "run now in the admin by admin"
    assert kernel.claim(owner="w", lease=30).pk == later.pk


def test_job_page_lists_recent_occurrences(admin_client, job, clock):
    dead = dead_letter(clock, "d1")
    clock.advance(1)
    kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="q")
    text = admin_client.get(url("job", "change", "job-a")).content.decode()
    assert "Recent occurrences" in text
    assert url("occurrence", "change", dead.pk) in text
    assert "Dead Letter" in text and "boom" in text and "Queued" in text


def test_links_to_an_occurrence_whose_id_the_admin_must_quote(admin_client, job, clock):
    # An id with "_40" reads as "@" to the admin's unquote: unquoted links would lead nowhere.
    revision = kernel.get_job("job-a").revision
    at = to_ms(clock(), "at")
    key = next(
        f"k{i}"
        for i in range(100_000)
        if derive_occurrence_identity("job-a", revision, at, f"k{i}").occurrence_id.startswith("occ_40")
    )
    dead = dead_letter(clock, key)
    assert dead.pk.startswith("occ_40")
    pages = (url("job", "change", "job-a"), reverse("admin:durable_scheduler_schedulerdashboard_changelist"))
    for page in pages:
        text = admin_client.get(page).content.decode()
        assert url("occurrence", "change", dead.pk) in text, page
    response = admin_client.get(url("occurrence", "change", dead.pk))
    assert response.status_code == 200 and dead.pk in response.content.decode()


def test_search_by_kind_and_error_text(admin_client, job, clock):
    dead = dead_letter(clock, "d1")
    kernel.create_job("job-b", "mail.send", authority=AUTHORITY)
    other, _ = kernel.enqueue("job-b", scheduled_for=clock(), trigger_key="m")

    def found(q: str) -> set[str]:
        response = admin_client.get(url("occurrence", "changelist"), {"q": q})
        return {o.pk for o in response.context["cl"].result_list}

    assert found("mail.send") == {other.pk}
    assert found("boo") == {dead.pk}  # error text, by substring
    assert found(dead.pk) == {dead.pk}
    assert found("job-b") == {other.pk}


# --------------------------------------------------------------------------- no N+1


@pytest.fixture
def many(clock):
    for i in range(30):
        policies.set_policy("svc", f"p{i}", capabilities=["a"], window=60, max_runs=5, max_units=5)
    for i in range(30):
        authority = authority_for(f"p{i % 10}", "a", ptype="svc")
        kernel.create_job(f"job-{i:02d}", f"kind.{i % 3}", authority=authority, trigger={"every": 60 + i})
        kernel.enqueue(f"job-{i:02d}", scheduled_for=clock(), trigger_key="t")
    for _ in range(10):
        claimed = kernel.claim(owner="w", lease=30)
        assert claimed is not None
        reserve_authority(claimed.occurrence_id, policy_revision=1)


@pytest.mark.parametrize(
    "model",
    [
        "job",
        "occurrence",
        "event",
        "authoritypolicy",
        "authoritypolicyrevision",
        "authorityreservation",
        "authorityusage",
    ],
)
def test_changelists_have_no_n_plus_1(admin_client, many, model, django_assert_max_num_queries):
    admin_client.get(url(model, "changelist"))  # warm caches (content types, session)
    with django_assert_max_num_queries(8):
        response = admin_client.get(url(model, "changelist"))
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) >= 5


def test_a_jobs_limit_timeout_and_key_through_the_form(admin_client, clock):
    data = {
        "job_id": "limited",
        "kind": "reports.send",
        "trigger": "{}",
        "payload": "null",
        "authority": json.dumps(AUTHORITY),
        "enabled": "on",
        "max_attempts": 3,
        "timeout": "90",
        "concurrency": "2",
        "concurrency_key": "{customer}",
        "loaded_revision": 0,
        "_save": "Save",
    }
    response = admin_client.post(url("job", "add"), data)
    assert response.status_code == 302, form_errors(response)
    job = Job.objects.get(pk="limited")
    assert (job.timeout_ms, job.concurrency, job.concurrency_key) == (90_000, 2, "{customer}")
    page = admin_client.get(url("job", "change", "limited")).content.decode()
    assert 'name="concurrency" value="2"' in page and 'value="{customer}"' in page
    # Emptied: no cap, no key, the handler's timeout (a new revision).
    response = admin_client.post(
        url("job", "change", "limited"),
        {**data, "timeout": "", "concurrency": "", "concurrency_key": "", "loaded_revision": 1},
    )
    assert response.status_code == 302, form_errors(response)
    job.refresh_from_db()
    assert (job.revision, job.timeout_ms, job.concurrency, job.concurrency_key) == (2, None, None, None)
    # Refused on its field, nothing written.
    for field, value in (("concurrency", "0"), ("concurrency_key", "{a.b}"), ("timeout", "0")):
        changed = {**data, field: value, "loaded_revision": 2}
        response = admin_client.post(url("job", "change", "limited"), changed)
        assert field in form_errors(response), form_errors(response)
    job.refresh_from_db()
    assert job.revision == 2
