"""Authority on by default and out of the way: a job created or declared without an envelope
runs as the app's default principal, whose policy is created on first use and grants the kinds
of such jobs. An explicit envelope whose principal has no policy is warned about (log, W003,
scheduler_status) and stays fail-closed."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.core.management import call_command

import django_durable_scheduler as scheduler
from django_durable_scheduler import checks
from django_durable_scheduler.handlers import declared
from django_durable_scheduler.kernel.authority.binding import jobs_without_policy
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.rules.authority import DEFAULT_MAX_RUNS, DEFAULT_MAX_UNITS, DEFAULT_WINDOW_MS
from django_durable_scheduler.worker import Worker

from ..conftest import authority_for

DEFAULT = {"type": "app", "id": "durable_scheduler"}


def default_policy():
    return scheduler.get_policy("app", "durable_scheduler")


def _burst() -> int:
    return Worker(worker_id="w-default", concurrency=1, poll_interval=0.05, burst=True).run()


@pytest.mark.django_db
def test_a_job_without_authority_runs_as_the_default_principal(clock):
    assert default_policy() is None
    job = scheduler.create_job("nightly", "reports.nightly", trigger={"every": 3600})
    assert job.authority["principal"] == DEFAULT
    assert job.authority["requestedCapabilities"] == ["reports.nightly"]
    policy = default_policy()
    assert policy is not None and policy.revision == 1 and policy.enabled
    assert policy.capabilities == ["reports.nightly"]
    assert (policy.window_ms, policy.max_runs, policy.max_units) == (
        DEFAULT_WINDOW_MS,
        DEFAULT_MAX_RUNS,
        DEFAULT_MAX_UNITS,
    )
    assert job.authority["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:1"
    (history,) = scheduler.policy_history("app", "durable_scheduler")
    assert history.changed_by == "durable_scheduler: job nightly has no authority envelope"


@pytest.mark.django_db
def test_each_new_kind_widens_the_default_policy_and_keeps_the_others_covered(clock):
    first = scheduler.create_job("a", "kind.a")
    scheduler.create_job("b", "kind.b")
    scheduler.create_job("a2", "kind.a")  # already granted: no new revision
    policy = default_policy()
    assert policy.capabilities == ["kind.a", "kind.b"] and policy.revision == 2
    first.refresh_from_db()
    assert first.authority["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:2"


@pytest.mark.django_db
def test_an_operator_edit_of_the_default_budget_is_kept(clock):
    scheduler.create_job("a", "kind.a")
    scheduler.set_policy(
        "app", "durable_scheduler", capabilities=["kind.a"], window=3600, max_runs=5, max_units=7
    )
    scheduler.create_job("b", "kind.b")
    policy = default_policy()
    assert policy.capabilities == ["kind.a", "kind.b"]
    assert (policy.window_ms, policy.max_runs, policy.max_units) == (3_600_000, 5, 7)


@pytest.mark.django_db(transaction=True)
def test_the_first_run_of_a_job_without_authority_succeeds(clock, registered):
    calls = registered("first.run")
    scheduler.create_job("first", "first.run")
    occ, _ = scheduler.enqueue("first", scheduled_for=clock(), trigger_key="t")
    assert _burst() == 0
    occ.refresh_from_db()
    assert occ.status == "succeeded" and calls == [occ.pk]


@pytest.mark.django_db(transaction=True)
def test_an_explicit_envelope_stays_fail_closed(clock, registered, caplog):
    calls = registered("explicit.run")
    with caplog.at_level(logging.WARNING, logger="django_durable_scheduler"):
        scheduler.create_job("strict", "explicit.run", authority=authority_for("erin", "x.run"))
    (line,) = [r.getMessage() for r in caplog.records if "strict" in r.getMessage()]
    assert "user:erin" in line and "no authority policy" in line and "policy_required" in line
    occ, _ = scheduler.enqueue("strict", scheduled_for=clock(), trigger_key="t")
    assert _burst() == 0
    occ.refresh_from_db()
    assert occ.status == "dead_letter" and occ.last_error["reason"] == "policy_required" and calls == []
    assert default_policy() is None  # an explicit envelope never touches the default principal


@pytest.mark.django_db
def test_jobs_without_a_policy_are_listed_by_w003_and_scheduler_status(clock):
    scheduler.create_job("s1", "x.one", authority=authority_for("erin", "x.run"))
    scheduler.create_job("s2", "x.two", authority=authority_for("erin", "x.run"))
    scheduler.create_job("off", "x.off", authority=authority_for("fred", "x.run"), enabled=False)
    scheduler.create_job("fine", "x.fine")
    assert jobs_without_policy() == {("user", "erin"): ["s1", "s2"]}
    (message,) = checks.check_jobs_have_policies(databases=["default"])
    assert message.id == "durable_scheduler.W003" and message.obj == "user:erin"
    assert "s1, s2" in message.msg
    out = StringIO()
    call_command("scheduler_status", "--json", stdout=out, stderr=StringIO())
    assert json.loads(out.getvalue())["jobs_without_policy"] == {"user:erin": ["s1", "s2"]}
    text = StringIO()
    call_command("scheduler_status", stdout=text, stderr=StringIO())
    assert "user:erin: s1, s2" in text.getvalue()
    scheduler.ensure_policy(authority_for("erin", "x.run"))
    assert checks.check_jobs_have_policies(databases=["default"]) == []


@pytest.mark.django_db
def test_update_job_to_no_authority_and_a_kind_change_follow_the_default(clock):
    job = scheduler.create_job("j", "kind.old", authority=authority_for("erin", "x.run"))
    job = scheduler.update_job("j", expected_revision=job.revision, authority=None)
    assert job.authority["principal"] == DEFAULT
    assert job.authority["requestedCapabilities"] == ["kind.old"]
    job = scheduler.update_job("j", expected_revision=job.revision, kind="kind.new")
    assert job.authority["requestedCapabilities"] == ["kind.new"]
    assert default_policy().capabilities == ["kind.new", "kind.old"]


@pytest.mark.django_db
def test_declared_jobs_without_authority(clock, monkeypatch):
    monkeypatch.setattr(declared, "_declared", {})
    scheduler.declare_job("decl", "decl.run", trigger={"every": 60})
    assert declared.sync_declared_jobs()["created"] == ["decl"]
    job = scheduler.get_job("decl")
    assert job.authority["principal"] == DEFAULT and default_policy().capabilities == ["decl.run"]
    assert declared.sync_declared_jobs()["unchanged"] == ["decl"]  # the binding is not a change
    monkeypatch.setattr(declared, "_declared", {})
    scheduler.declare_job("decl", "decl.run", trigger={"every": 60}, authority=authority_for("erin", "x.run"))
    assert declared.sync_declared_jobs()["updated"] == ["decl"]
    assert scheduler.get_job("decl").authority["principal"] == {"type": "user", "id": "erin"}
    monkeypatch.setattr(declared, "_declared", {})
    scheduler.declare_job("decl", "decl.run", trigger={"every": 60})
    assert declared.sync_declared_jobs()["updated"] == ["decl"]
    assert scheduler.get_job("decl").authority["principal"] == DEFAULT


@pytest.mark.django_db
def test_the_default_principal_is_a_setting(clock, settings):
    settings.DURABLE_SCHEDULER_DEFAULT_PRINCIPAL = {"type": "service", "id": "cron"}
    job = scheduler.create_job("j", "kind.a")
    assert job.authority["principal"] == {"type": "service", "id": "cron"}
    assert scheduler.get_policy("service", "cron").capabilities == ["kind.a"]
    assert Occurrence.objects.count() == 0


@pytest.mark.parametrize("value", [None, "app:x", {"type": "app"}, {"type": "app", "id": ""}])
def test_a_bad_default_principal_is_e003(settings, value):
    settings.DURABLE_SCHEDULER_DEFAULT_PRINCIPAL = value
    (error,) = [m for m in checks.check_settings() if m.obj == "DURABLE_SCHEDULER_DEFAULT_PRINCIPAL"]
    assert error.id == "durable_scheduler.E003"
