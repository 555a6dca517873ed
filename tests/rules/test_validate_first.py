"""A refused call writes nothing, on the paths that write before they finish: a job given no
authority (its kind granted to the default principal's policy, with a history row), a change
of kind that follows the default envelope, declarations in code, and enqueues (a job read and
remembered, many items in one call).

Each case makes one call with one bad argument and checks the error names the field and
every scheduler table is unchanged, row for row (``snapshot``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import declared, registry
from django_durable_scheduler.models import AuthorityPolicy, AuthorityPolicyRevision

from ..conftest import AUTHORITY, snapshot

pytestmark = pytest.mark.django_db

NUL_VALUE = {"note": "a\x00b"}
NUL_KEY = {"a\x00b": 1}


def refused(field: str, call: Any, *args: Any, **kwargs: Any) -> None:
    """``call`` is refused naming ``field`` and leaves every scheduler table as it was."""
    before = snapshot()
    with pytest.raises(scheduler.SchedulerError) as info:
        call(*args, **kwargs)
    assert info.value.code == "SCHEDULER_INVALID_ARGUMENT"
    assert info.value.details["field"] == field
    assert field in str(info.value)
    assert snapshot() == before


@pytest.fixture
def policy_that_grants_other_kinds(clock):
    """The default principal's policy exists (a first job made it) and grants another kind:
    a job of a new kind would widen it."""
    scheduler.create_job("first", "other.run")
    return AuthorityPolicy.objects.get()


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("payload", {"payload": NUL_VALUE}),
        ("payload", {"payload": NUL_KEY}),
        ("payload", {"payload": "\x00"}),
        ("trigger.at", {"trigger": {"at": "2026-03-01T09:00:00Z\x00"}}),
        ("trigger.cron", {"trigger": {"cron": "0 9 * * *\x00"}}),
        ("retry_max_delay", {"retry_base_delay": 20, "retry_max_delay": 10}),
        ("timeout", {"timeout": 0}),
        ("max_attempts", {"max_attempts": 0}),
        ("enabled", {"enabled": "yes"}),
    ],
)
@pytest.mark.parametrize("policy", ["none yet", "grants other kinds"])
def test_create_job_without_authority_refused_writes_no_policy(request, clock, policy, field, kwargs):
    if policy == "grants other kinds":
        request.getfixturevalue("policy_that_grants_other_kinds")
    refused(field, scheduler.create_job, "job-new", "reports.send", **kwargs)


def test_create_job_with_a_nul_payload_leaves_no_job_policy_or_event(clock):
    refused("payload", scheduler.create_job, "job-new", "reports.send", payload=NUL_VALUE)
    assert snapshot() == {name: [] for name in snapshot()}


def test_longest_job_id_without_authority_is_created(clock):
    """The policy history names the job that widened it, cut to fit its column."""
    job_id = "j" * 256
    job = scheduler.create_job(job_id, "reports.send")
    assert job.job_id == job_id
    (changed_by,) = AuthorityPolicyRevision.objects.values_list("changed_by", flat=True)
    assert changed_by is not None and len(changed_by) == 256
    assert changed_by.startswith("durable_scheduler: job jjj")
    assert changed_by.endswith("... has no authority envelope")


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("payload", {"kind": "new.kind", "payload": NUL_VALUE}),
        ("payload", {"authority": None, "payload": NUL_KEY}),
        ("trigger.at", {"authority": None, "trigger": {"at": "\x002026-03-01T09:00:00Z"}}),
        ("retry_max_delay", {"kind": "new.kind", "retry_max_delay": timedelta(seconds=1)}),
    ],
)
def test_update_job_to_the_default_authority_refused_writes_no_policy(clock, field, changes):
    scheduler.create_job("job-default", "reports.send", retry_base_delay=10)
    scheduler.create_job("job-explicit", "reports.send", authority=AUTHORITY)
    job_id = "job-explicit" if changes.get("authority", "") is None else "job-default"
    refused(field, scheduler.update_job, job_id, expected_revision=1, **changes)


@pytest.fixture
def no_declarations():
    saved = declared.declared_jobs()
    yield
    for declaration in declared.declared_jobs():
        if declaration not in saved:
            declared.undeclare(declaration.job_id)


@pytest.mark.usefixtures("no_declarations")
def test_declare_job_refused_declares_nothing(clock):
    before = declared.declared_jobs()
    refused("payload", declared.declare_job, "declared-bad", "reports.send", payload=NUL_VALUE)
    assert declared.declared_jobs() == before


@pytest.mark.usefixtures("no_declarations")
def test_handler_with_a_refused_job_registers_nothing(clock):
    before = declared.declared_jobs()

    def handle(ctx: Any) -> None:
        return None

    refused(
        "job.payload", scheduler.handler, "reports.bad", job={"payload": NUL_VALUE, "authority": AUTHORITY}
    )
    assert registry.get_handler("reports.bad") is None
    assert declared.declared_jobs() == before


@pytest.mark.parametrize("remembered", [False, True], ids=["first-enqueue", "job-remembered"])
def test_enqueue_with_a_nul_payload_writes_nothing(clock, remembered):
    """The second enqueue of a job in a process may insert without reading the job again."""
    scheduler.create_job("job-e", "reports.send", authority=AUTHORITY)
    if remembered:
        scheduler.enqueue("job-e", scheduled_for=clock(), trigger_key="ok")
    refused("payload", scheduler.enqueue, "job-e", scheduled_for=clock(), trigger_key="bad", payload=NUL_KEY)


def test_enqueue_many_with_one_bad_item_writes_none(clock):
    scheduler.create_job("job-e", "reports.send", authority=AUTHORITY)
    items = [
        {"scheduled_for": clock(), "trigger_key": "one"},
        {"scheduled_for": clock(), "trigger_key": "two", "payload": NUL_VALUE},
    ]
    refused("items[1].payload", scheduler.enqueue_many, "job-e", items)
