"""Jobs declared in code (``@handler(kind, job=...)``, ``declare_job``) and ``scheduler_sync``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.handlers import declared, registry
from django_durable_scheduler.models import Event, Job, Occurrence

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db

DAILY = {"cron": "0 9 * * *", "timezone": "Europe/Berlin"}


@pytest.fixture(autouse=True)
def isolated(clock):
    """Each test starts with no declarations and forgets the kinds it registered."""
    saved = dict(declared._declared)
    declared._declared.clear()
    kinds: list[str] = []
    yield kinds
    for kind in kinds:
        registry.unregister(kind)
    declared._declared.clear()
    declared._declared.update(saved)


def register(isolated, kind: str, **job):
    """Register a no-op handler for ``kind`` declaring ``job`` (unregistered after the test)."""
    isolated.append(kind)

    def handle(ctx):
        return None

    return scheduler.handler(kind, job=job or None)(handle)


def sync():
    return declared.sync_declared_jobs()


def test_handler_job_is_created_once(isolated):
    register(isolated, "reports.daily", trigger=DAILY, authority=AUTHORITY, payload={"to": "team"})
    assert sync() == {"created": ["reports.daily"], "updated": [], "unchanged": [], "disabled": []}
    job = Job.objects.get()
    assert (job.job_id, job.kind, job.revision, job.payload) == (
        "reports.daily",
        "reports.daily",
        1,
        {"to": "team"},
    )
    assert job.trigger["cron"] == "0 9 * * *" and job.next_fire_at is not None
    assert job.retry_base_delay_ms == 10_000 and job.retry_max_delay_ms == 3_600_000
    assert sync() == {"created": [], "updated": [], "unchanged": ["reports.daily"], "disabled": []}
    assert Job.objects.get().revision == 1


def test_job_id_given_in_the_handler_declaration(isolated):
    register(isolated, "reports.weekly", job_id="weekly-report", authority=AUTHORITY)
    assert sync()["created"] == ["weekly-report"]
    assert Job.objects.get(pk="weekly-report").kind == "reports.weekly"


def test_several_jobs_per_kind_with_declare_job(isolated):
    register(isolated, "reports.region")
    scheduler.declare_job("region-eu", "reports.region", authority=AUTHORITY, payload={"region": "eu"})
    scheduler.declare_job(
        "region-us", "reports.region", authority=AUTHORITY, payload={"region": "us"}, trigger={"every": 3600}
    )
    assert sync() == {"created": ["region-eu", "region-us"], "updated": [], "unchanged": [], "disabled": []}
    assert dict(Job.objects.values_list("job_id", "payload")) == {
        "region-eu": {"region": "eu"},
        "region-us": {"region": "us"},
    }


def test_a_changed_declaration_updates_only_what_changed(isolated):
    register(isolated, "reports.daily", trigger=DAILY, authority=AUTHORITY, payload={"to": "team"})
    sync()
    registry.unregister("reports.daily")
    register(isolated, "reports.daily", trigger={"every": 600}, authority=AUTHORITY, payload={"to": "team"})
    assert sync() == {"created": [], "updated": ["reports.daily"], "unchanged": [], "disabled": []}
    job = Job.objects.get()
    assert job.revision == 2 and job.trigger["every"] == 600
    update = Event.objects.get(event_type="job_updated")
    assert update.data["changed"] == ["trigger"]
    assert sync()["unchanged"] == ["reports.daily"]
    assert Job.objects.get().revision == 2


@pytest.mark.parametrize(
    ("field", "stored", "declared_value"),
    [
        ("max_attempts", 3, 5),
        ("enabled", True, False),
        ("payload", {"a": 1}, {"a": 2}),
        ("retry_base_delay", 10, 20),
        ("retry_max_delay", 3600, 7200),
        ("timeout", 30, 60),
        ("authority", AUTHORITY, {**AUTHORITY, "tenantId": "acme"}),
    ],
)
def test_each_field_is_compared(isolated, field, stored, declared_value):
    scheduler.declare_job(
        "j", "k.any", authority=AUTHORITY, **({field: stored} if field != "authority" else {})
    )
    sync()
    declared.undeclare("j")
    fields = {"authority": AUTHORITY, field: declared_value}
    scheduler.declare_job("j", "k.any", **fields)
    assert sync()["updated"] == ["j"]
    update = Event.objects.get(event_type="job_updated")
    expected = {
        "retry_base_delay": "retry_base_delay_ms",
        "retry_max_delay": "retry_max_delay_ms",
        "timeout": "timeout_ms",
    }
    assert expected.get(field, field) in update.data["changed"]
    assert sync()["unchanged"] == ["j"]


def test_equivalent_spellings_are_unchanged(isolated):
    scheduler.declare_job(
        "j",
        "k.any",
        authority={"principal": {"id": "alice", "type": "user"}, "requestedCapabilities": ["b", "a", "a"]},
        trigger={"cron": "0  9 * * *"},
        payload={"b": 1, "a": [1, 2]},
        retry_base_delay=timedelta(seconds=10),
        retry_max_delay=3600.0,
    )
    sync()
    declared.undeclare("j")
    scheduler.declare_job(
        "j",
        "k.any",
        authority={
            "schemaVersion": 1,
            "principal": {"type": "user", "id": "alice"},
            "requestedCapabilities": ["a", "b"],
            "authorizationRefs": {"grantIds": []},
        },
        trigger={"cron": "0 9 * * *", "timezone": "UTC", "misfire": "run_latest"},
        payload={"a": [1, 2], "b": 1.0},
        retry_base_delay=10,
        retry_max_delay=timedelta(hours=1),
    )
    assert sync() == {"created": [], "updated": [], "unchanged": ["j"], "disabled": []}


def test_retry_delays_left_out_follow_the_settings(isolated, settings):
    scheduler.declare_job("j", "k.any", authority=AUTHORITY)
    sync()
    settings.DURABLE_SCHEDULER_RETRY_BASE_DELAY = 30
    assert sync()["updated"] == ["j"]
    job = Job.objects.get()
    assert (job.retry_base_delay_ms, job.retry_max_delay_ms) == (30_000, 3_600_000)


def test_a_policy_binding_made_elsewhere_is_kept(isolated):
    scheduler.declare_job("j", "k.any", authority=AUTHORITY)
    sync()
    bound = {**AUTHORITY, "authorizationRefs": {"schedulerPolicyRevision": "scheduler-authority:4"}}
    kernel.update_job("j", expected_revision=1, authority=bound)  # as set_policy's rebinding would
    assert sync()["unchanged"] == ["j"]
    assert (
        Job.objects.get().authority["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:4"
    )
    # A declaration that names a binding is compared with it like any other field.
    declared.undeclare("j")
    scheduler.declare_job(
        "j",
        "k.any",
        authority={**AUTHORITY, "authorizationRefs": {"schedulerPolicyRevision": "scheduler-authority:5"}},
    )
    assert sync()["updated"] == ["j"]
    assert (
        Job.objects.get().authority["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:5"
    )


def test_a_change_made_elsewhere_is_undone(isolated):
    # The declaration is the source of truth: disabling a declared job in the admin lasts
    # until the next sync (declare enabled=False to keep it off).
    scheduler.declare_job("j", "k.any", authority=AUTHORITY)
    sync()
    kernel.update_job("j", expected_revision=1, enabled=False)
    assert sync()["updated"] == ["j"]
    assert Job.objects.get().enabled is True


def test_sync_never_deletes_jobs(isolated):
    scheduler.declare_job("j", "k.any", authority=AUTHORITY)
    sync()
    declared.undeclare("j")
    assert sync() == {"created": [], "updated": [], "unchanged": [], "disabled": []}
    assert Job.objects.filter(pk="j").exists()


def test_unregister_forgets_the_kinds_declarations(isolated):
    register(isolated, "reports.daily", authority=AUTHORITY)
    scheduler.declare_job("extra", "reports.daily", authority=AUTHORITY)
    scheduler.declare_job("other", "other.kind", authority=AUTHORITY)
    registry.unregister("reports.daily")
    assert [d.job_id for d in declared.declared_jobs()] == ["other"]


def test_a_job_created_meanwhile_by_another_process(isolated, monkeypatch):
    scheduler.declare_job("j", "k.any", authority=AUTHORITY, max_attempts=4)
    kernel.create_job("j", "k.any", authority=AUTHORITY, max_attempts=4)
    real_get_job = kernel.get_job
    calls = []

    def get_job_missing_once(job_id, **kwargs):
        calls.append(job_id)
        if len(calls) == 1:
            raise scheduler.NotFound("not yet")  # our read came before their insert
        return real_get_job(job_id, **kwargs)

    monkeypatch.setattr(kernel, "get_job", get_job_missing_once)
    assert sync() == {"created": [], "updated": [], "unchanged": ["j"], "disabled": []}
    assert Job.objects.get().revision == 1


def test_a_job_updated_meanwhile_by_another_process(isolated, monkeypatch):
    scheduler.declare_job("j", "k.any", authority=AUTHORITY, payload={"v": 2})
    kernel.create_job("j", "k.any", authority=AUTHORITY, payload={"v": 1})
    real_update = kernel.update_job

    def racing_update(job_id, *, expected_revision, **kwargs):
        if expected_revision == 1:
            # Another worker's sync lands first, with the same declaration.
            real_update(job_id, expected_revision=1, payload={"v": 2})
        return real_update(job_id, expected_revision=expected_revision, **kwargs)

    monkeypatch.setattr(kernel, "update_job", racing_update)
    assert sync() == {"created": [], "updated": [], "unchanged": ["j"], "disabled": []}
    assert Job.objects.get().revision == 2


# --------------------------------------------------------------------------- bad declarations


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ({"authority": AUTHORITY, "kind": "x"}, "job.kind"),
        ({"authority": AUTHORITY, "trigger": {"cron": "61 * * * *"}}, "job.trigger.cron"),
        ({"authority": {"principal": {"type": "user"}}}, "job.authority.principal.id"),
        ({"authority": AUTHORITY, "payload": {1, 2}}, "job.payload"),
        ({"authority": AUTHORITY, "enabled": "yes"}, "job.enabled"),
        ({"authority": AUTHORITY, "max_attempts": 33}, "job.max_attempts"),
        ({"authority": AUTHORITY, "retry_base_delay": 0}, "job.retry_base_delay"),
        ({"authority": AUTHORITY, "retry_base_delay": 60, "retry_max_delay": 30}, "job.retry_max_delay"),
        ({"authority": AUTHORITY, "job_id": ""}, "job.job_id"),
    ],
)
def test_bad_handler_declarations_fail_at_import(isolated, job, field):
    with pytest.raises(InvalidArgument) as info:
        scheduler.handler("bad.declared", job=job)
    assert info.value.details["field"] == field
    assert registry.get_handler("bad.declared") is None
    assert declared.declared_jobs() == []


def test_job_must_be_a_dict(isolated):
    with pytest.raises(InvalidArgument, match="job: must be a dict"):
        scheduler.handler("bad.declared", job=["authority"])  # type: ignore[arg-type]


def test_declare_job_names_the_field(isolated):
    with pytest.raises(InvalidArgument) as info:
        scheduler.declare_job("j", "k.any", authority=AUTHORITY, trigger={"every": 0})
    assert info.value.details["field"] == "trigger.every"


def test_same_declaration_twice_is_fine_another_is_refused(isolated):
    scheduler.declare_job("j", "k.any", authority=AUTHORITY, payload={"a": 1})
    scheduler.declare_job("j", "k.any", authority=AUTHORITY, payload={"a": 1})  # a module imported twice
    with pytest.raises(InvalidArgument, match="job 'j' is already declared with another definition"):
        scheduler.declare_job("j", "k.any", authority=AUTHORITY, payload={"a": 2})


def test_a_conflicting_handler_declaration_registers_neither(isolated):
    scheduler.declare_job("reports.daily", "other.kind", authority=AUTHORITY)
    with pytest.raises(InvalidArgument, match="already declared"):
        register(isolated, "reports.daily", authority=AUTHORITY)
    assert registry.get_handler("reports.daily") is None


# --------------------------------------------------------------------------- the command


def test_scheduler_sync_command(isolated):
    register(isolated, "reports.daily", authority=AUTHORITY)
    scheduler.declare_job("extra", "reports.daily", authority=AUTHORITY)
    kernel.create_job("extra", "reports.daily", authority=AUTHORITY, max_attempts=5)
    out = StringIO()
    call_command("scheduler_sync", stdout=out)
    assert out.getvalue().splitlines() == [
        "created: 1 (reports.daily)",
        "updated: 1 (extra)",
        "unchanged: 0",
        "disabled: 0",
    ]
    out = StringIO()
    call_command("scheduler_sync", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "created": [],
        "updated": [],
        "unchanged": ["extra", "reports.daily"],
        "disabled": [],
    }


def test_scheduler_sync_error_is_one_line(isolated, monkeypatch):
    scheduler.declare_job("j", "k.any", authority=AUTHORITY)

    def failing(*args, **kwargs):
        raise scheduler.InvalidArgument("retry_max_delay", "must not be shorter than retry_base_delay")

    monkeypatch.setattr(kernel, "create_job", failing)
    with pytest.raises(CommandError, match=r"^scheduler_sync: retry_max_delay: must not be shorter"):
        call_command("scheduler_sync", stdout=StringIO())


# ----------------------------------------------------------------------- the code owns its jobs


def declare_in_app(job_id: str, kind: str = "k.owned", **fields):
    """A declaration as the tasks module of the installed app tests.testapp makes it."""
    declaration = scheduler.declare_job(job_id, kind, **fields)
    declared._declared[job_id] = replace(declaration, module="tests.testapp.tasks")


def test_a_job_the_app_stops_declaring_is_disabled_once(caplog):
    declare_in_app("owned", trigger={"every": 60})
    declare_in_app("kept")
    assert sync()["created"] == ["kept", "owned"]
    assert Job.objects.get(pk="owned").declared_in == "testapp"
    del declared._declared["owned"]
    with caplog.at_level("WARNING", logger="django_durable_scheduler"):
        result = sync()
    assert result["disabled"] == ["owned"] and result["unchanged"] == ["kept"]
    job = Job.objects.get(pk="owned")
    assert not job.enabled and job.declared_in is None and job.revision == 2
    event = Event.objects.filter(job_id="owned").latest("event_id")
    assert event.data["reason"] == "undeclared" and event.data["declaredIn"] == "testapp"
    assert event.data["changed"] == ["enabled"]
    (line,) = [r.getMessage() for r in caplog.records if "owned" in r.getMessage()]
    assert "no longer declared by app testapp: disabled" in line
    assert sync()["disabled"] == []
    # An operator who enables it again owns it: no sync disables it after.
    kernel.update_job("owned", expected_revision=job.revision, enabled=True)
    assert sync()["disabled"] == [] and Job.objects.get(pk="owned").enabled


def test_declaring_a_disabled_job_again_enables_it():
    declare_in_app("back")
    sync()
    del declared._declared["back"]
    assert sync()["disabled"] == ["back"]
    declare_in_app("back")
    assert sync()["updated"] == ["back"]
    job = Job.objects.get(pk="back")
    assert job.enabled and job.declared_in == "testapp"


def test_jobs_of_apps_this_process_does_not_install_are_left_alone():
    kernel.create_job("elsewhere", "k.other", authority=AUTHORITY)
    Job.objects.filter(pk="elsewhere").update(declared_in="billing")  # another deployment's app
    made_here = kernel.create_job("by-api", "k.api", authority=AUTHORITY)
    assert made_here.declared_in is None
    assert sync()["disabled"] == []
    assert Job.objects.get(pk="elsewhere").enabled and Job.objects.get(pk="by-api").enabled


def _pending_schedule(job_id):
    return list(
        Occurrence.objects.filter(job_id=job_id, trigger_key__startswith="schedule:", status="queued")
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)
    )


@pytest.mark.parametrize(
    ("misfire", "off_for", "kept"),
    [
        ("run_latest", timedelta(hours=2), False),  # the scheduler fires the latest slot itself
        ("skip", timedelta(hours=2), False),
        ("run_all", timedelta(hours=2), False),  # outside the catch-up window (1 h)
        ("run_all", timedelta(minutes=30), True),
        ("run_latest", timedelta(seconds=30), True),  # still on time
        ("run_latest", timedelta(minutes=30), True),  # late, but no newer slot is due yet
    ],
)
def test_re_enabling_follows_the_misfire_policy(clock, misfire, off_for, kept):
    kernel.create_job("tick", "k.tick", authority=AUTHORITY, trigger={"every": 3600, "misfire": misfire})
    clock.advance(hours=1)
    assert kernel.materialize_due() == 1
    (slot,) = _pending_schedule("tick")
    asked, _ = kernel.enqueue("tick", scheduled_for=clock(), trigger_key="asked-for")
    job = kernel.update_job("tick", expected_revision=Job.objects.get(pk="tick").revision, enabled=False)
    clock.advance(off_for.total_seconds())
    job = kernel.update_job("tick", expected_revision=job.revision, enabled=True)
    assert _pending_schedule("tick") == ([slot] if kept else [])
    if not kept:
        cancelled = Occurrence.objects.get(job_id="tick", trigger_key__startswith="schedule:")
        assert cancelled.status == "cancelled" and cancelled.last_error["message"] == "misfired"
    asked.refresh_from_db()
    assert asked.status == "queued"  # enqueued explicitly: it still runs


def test_declared_chains_sync_their_follow_ups_first_and_update(isolated):
    # "a.export" names "z.report", which sorts after it: the sync creates "z.report" first.
    register(isolated, "a.export", authority=AUTHORITY, then=["z.report"], on_dead_letter="z.report")
    scheduler.declare_job("z.report", "reports.send", authority=AUTHORITY)
    assert sync()["created"] == ["z.report", "a.export"]
    job = Job.objects.get(pk="a.export")
    assert job.then == [{"job_id": "z.report"}] and job.on_dead_letter == [{"job_id": "z.report"}]
    assert sync()["unchanged"] == ["z.report", "a.export"]
    declared._declared["a.export"] = replace(declared._declared["a.export"], then=None)
    assert sync()["updated"] == ["a.export"]
    assert Job.objects.get(pk="a.export").then is None


def test_a_declared_chain_is_checked_where_it_is_written(isolated):
    with pytest.raises(InvalidArgument) as raised:
        register(isolated, "a.export", authority=AUTHORITY, then=[{"job_id": "b", "then": ["c"]}])
    assert raised.value.field == "job.then[0].then"
    with pytest.raises(InvalidArgument, match="cycle"):
        register(isolated, "b.loop", authority=AUTHORITY, then=["c.loop"])
        scheduler.declare_job("c.loop", "reports.send", authority=AUTHORITY, then=["b.loop"])
        sync()


def test_concurrency_limits_are_declared_and_synced(isolated):
    register(isolated, "crm.push", authority=AUTHORITY, concurrency=1, concurrency_key="{customer}")
    scheduler.declare_job("crm.push.eu", "crm.push", authority=AUTHORITY, concurrency=2)
    assert sorted(sync()["created"]) == ["crm.push", "crm.push.eu"]
    assert (Job.objects.get(pk="crm.push").concurrency, Job.objects.get(pk="crm.push").concurrency_key) == (
        1,
        "{customer}",
    )
    assert Job.objects.get(pk="crm.push.eu").concurrency == 2
    # Changed elsewhere: the declaration wins at the next sync.
    kernel.update_job("crm.push.eu", expected_revision=1, concurrency=None, concurrency_key="{x}")
    assert sync()["updated"] == ["crm.push.eu"]
    job = Job.objects.get(pk="crm.push.eu")
    assert (job.concurrency, job.concurrency_key, job.revision) == (2, None, 3)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 10_001}, "concurrency"),
        ({"concurrency": "1"}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency_key": ""}, "concurrency_key"),
        ({"concurrency_key": "{a[0]}"}, "concurrency_key"),
        ({"concurrency_key": str.upper}, "concurrency_key"),
    ],
)
def test_bad_declared_limits_are_refused_naming_the_field(isolated, fields, field):
    with pytest.raises(InvalidArgument) as caught:
        scheduler.declare_job("bad-limit", "crm.push", **fields)
    assert caught.value.details["field"] == field
    with pytest.raises(InvalidArgument) as caught:
        scheduler.handler("crm.bad-limit", job=fields)
    assert caught.value.details["field"] == f"job.{field}"
    assert declared.declared_jobs() == [] and registry.get_handler("crm.bad-limit") is None
    assert sync() == {"created": [], "updated": [], "unchanged": [], "disabled": []}
