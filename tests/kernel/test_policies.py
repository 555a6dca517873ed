"""Authority policies: set_policy (compare-and-set, history, rebinding), get_policy,
ensure_policy, preview_policy_change, policy_history, current_usage (``docs/design.md``,
"Authority checks")."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

import django_durable_scheduler as scheduler
from django_durable_scheduler.kernel.authority import binding, policies
from django_durable_scheduler.models import AuthorityPolicy, AuthorityPolicyRevision, Job, Occurrence
from django_durable_scheduler.rules.authority import bound_revision

from ..conftest import authority_for, snapshot

pytestmark = pytest.mark.django_db

HOUR = 3600


def policy(pid="alice", caps=("reports.send",), ptype="user", **kw):
    kw.setdefault("window", HOUR)
    kw.setdefault("max_runs", 100)
    kw.setdefault("max_units", 1000)
    return scheduler.set_policy(ptype, pid, capabilities=list(caps), **kw)


def ref(row) -> int | None:
    row.refresh_from_db()
    return bound_revision(row.authority)


# --------------------------------------------------------------------------- set_policy


def test_set_policy_creates_normalized_with_history(clock):
    p = policy(caps=["b.cap", " a.cap ", "b.cap"], window=timedelta(minutes=5), changed_by="admin:1")
    assert (p.revision, p.enabled, p.capabilities, p.window_ms, p.max_runs, p.max_units) == (
        1,
        True,
        ["a.cap", "b.cap"],
        300_000,
        100,
        1000,
    )
    assert p.created_at == p.updated_at == clock()
    stored = AuthorityPolicy.objects.get()
    assert stored.capabilities == ["a.cap", "b.cap"] and stored.revision == 1
    (h,) = scheduler.policy_history("user", "alice")
    assert h.revision == 1 and h.changed_by == "admin:1" and h.changed_at == clock()
    assert h.content == {
        "principal": {"type": "user", "id": "alice"},
        "revision": 1,
        "enabled": True,
        "capabilities": ["a.cap", "b.cap"],
        "window_ms": 300_000,
        "max_runs": 100,
        "max_units": 1000,
    }
    assert p.change.created and p.change.previous_revision == 0


def test_set_policy_bumps_revision_and_keeps_created_at(clock):
    first = policy()
    clock.advance(10)
    second = policy(caps=["x.y"], max_runs=5, enabled=False)
    assert second.pk == first.pk and second.revision == 2
    assert second.created_at == first.created_at and second.updated_at == clock()
    stored = AuthorityPolicy.objects.get()
    assert (stored.revision, stored.capabilities, stored.max_runs, stored.enabled) == (2, ["x.y"], 5, False)
    assert [h.revision for h in scheduler.policy_history("user", "alice")] == [2, 1]
    assert [h.revision for h in scheduler.policy_history("user", "alice", limit=1)] == [2]


def test_set_policy_compare_and_set(clock):
    # expected_revision=0: must not exist yet.
    policy(expected_revision=0)
    before = snapshot()
    with pytest.raises(scheduler.AuthorityPolicyConflict) as info:
        policy(caps=["other"], expected_revision=0)
    exc = info.value
    assert exc.code == "SCHEDULER_AUTHORITY_POLICY_CONFLICT"
    assert exc.details["expected_revision"] == 0 and exc.details["actual_revision"] == 1
    assert snapshot() == before
    assert policy(caps=["other"], expected_revision=1).revision == 2
    with pytest.raises(scheduler.AuthorityPolicyConflict) as info:
        policy(expected_revision=1)
    assert (info.value.details["expected_revision"], info.value.details["actual_revision"]) == (1, 2)
    # A missing policy is at revision 0.
    with pytest.raises(scheduler.AuthorityPolicyConflict) as info:
        policy(pid="bob", expected_revision=3)
    assert (info.value.details["expected_revision"], info.value.details["actual_revision"]) == (3, 0)
    assert scheduler.get_policy("user", "bob") is None
    assert AuthorityPolicyRevision.objects.filter(principal_id="bob").count() == 0


def test_backfilled_policy_is_readable_and_its_revision_enters_history(clock):
    AuthorityPolicy.objects.create(
        principal_type="user", principal_id="alice", capabilities=[], created_at=clock(), updated_at=clock()
    )
    p = scheduler.get_policy("user", "alice")
    assert p is not None and p.capabilities == [] and p.revision == 1
    clock.advance(5)
    policy(expected_revision=1, changed_by="ops")
    history = scheduler.policy_history("user", "alice")
    assert [(h.revision, h.changed_by) for h in history] == [(2, "ops"), (1, None)]
    assert history[1].content["capabilities"] == [] and history[1].changed_at == p.updated_at


def test_get_policy_missing_and_other_principal_type(clock):
    policy()
    assert scheduler.get_policy("user", "nobody") is None
    assert scheduler.get_policy("service", "alice") is None
    assert scheduler.get_policy(" user ", "alice").revision == 1  # identifiers are stripped


# --------------------------------------------------------------------------- rebinding


@pytest.fixture
def principal_world(clock):
    """alice: job-a (reports.send) and job-b (reports.send + mail.send), policy r1 granting
    both; bob: job-c. Occurrences: queued, retry_wait, running and succeeded ones."""
    scheduler.create_job("job-a", "k", authority=authority_for("alice", "reports.send"), max_attempts=3)
    scheduler.create_job("job-b", "k", authority=authority_for("alice", "reports.send", "mail.send"))
    scheduler.create_job("job-c", "k", authority=authority_for("bob", "reports.send"))
    policy(caps=["reports.send", "mail.send"])
    policy(pid="bob")
    occ = {}
    for job in ("job-a", "job-b", "job-c"):
        for key in ("done", "running", "retry", "queued"):
            occ[job, key] = scheduler.enqueue(job, scheduled_for=clock(), trigger_key=key)[0]
    claimed = scheduler.claim_batch(owner="w", lease=60, limit=100)
    assert len(claimed) == 12
    for row in claimed:
        key = row.trigger_key
        if key == "done":
            scheduler.settle(row.pk, owner="w", fence=1, outcome="succeeded")
        elif key == "retry":
            scheduler.settle(row.pk, owner="w", fence=1, outcome="failed", error="x", retry_at=clock())
        elif key == "queued":
            scheduler.release(row.pk, owner="w", fence=1)
    return occ


def test_set_policy_rebinds_covered_and_leaves_the_rest_stale(principal_world, clock):
    occ = principal_world
    assert {ref(o) for o in occ.values()} == {1}
    change = scheduler.change_policy(
        "user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=10, max_units=10
    )
    assert change.policy.revision == 2 and change.previous_revision == 1
    assert change.counts() == {
        "rebound_jobs": 1,
        "stale_jobs": 1,
        "rebound_occurrences": 2,  # job-a queued + retry_wait
        "stale_occurrences": 2,  # job-b queued + retry_wait
    }
    assert bound_revision(Job.objects.get(pk="job-a").authority) == 2
    assert bound_revision(Job.objects.get(pk="job-b").authority) == 1
    assert Job.objects.get(pk="job-a").revision == 1  # a rebind is not a job edit
    assert (ref(occ["job-a", "queued"]), ref(occ["job-a", "retry"])) == (2, 2)
    assert (ref(occ["job-b", "queued"]), ref(occ["job-b", "retry"])) == (1, 1)
    # Running and terminal occurrences keep their binding; other principals are untouched.
    assert (ref(occ["job-a", "running"]), ref(occ["job-a", "done"])) == (1, 1)
    assert {ref(occ["job-c", k]) for k in ("queued", "retry", "running", "done")} == {1}
    # New occurrences snapshot the job's (re)bound envelope.
    new_a, _ = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="new")
    new_b, _ = scheduler.enqueue("job-b", scheduled_for=clock(), trigger_key="new")
    assert (bound_revision(new_a.authority), bound_revision(new_b.authority)) == (2, 1)
    # The stale ones are denied policy_stale; the rebound ones reserve.
    clock.advance(1)
    results = {}
    while (claimed := scheduler.claim(owner="w2", lease=60, kinds=["k"])) is not None:
        if claimed.job_id == "job-c":
            scheduler.settle(claimed.pk, owner="w2", fence=claimed.fence, outcome="succeeded")
            continue
        results[claimed.job_id, claimed.trigger_key] = scheduler.authorize(claimed, units=1, owner="w2")
    assert results == {
        ("job-a", "queued"): "reserved",
        ("job-a", "retry"): "reserved",
        ("job-a", "new"): "reserved",
        ("job-b", "queued"): "denied",
        ("job-b", "retry"): "denied",
        ("job-b", "new"): "denied",
    }
    denied = Occurrence.objects.get(pk=occ["job-b", "queued"].pk)
    assert denied.status == "dead_letter"
    assert denied.last_error["reason"] == "policy_stale"
    assert denied.last_error["details"]["expected_revision"] == 1
    assert denied.last_error["details"]["actual_revision"] == 2


def test_rewidening_rebinds_the_stale_again(principal_world, clock):
    occ = principal_world
    policy(caps=["reports.send"])  # r2: job-b stale
    change = scheduler.change_policy(
        "user", "alice", capabilities=["mail.send", "reports.send"], window=HOUR, max_runs=1, max_units=1
    )
    assert change.counts() == {
        "rebound_jobs": 2,
        "stale_jobs": 0,
        "rebound_occurrences": 4,
        "stale_occurrences": 0,
    }
    assert ref(occ["job-b", "queued"]) == 3 and bound_revision(Job.objects.get(pk="job-b").authority) == 3


def test_disabling_leaves_everything_stale_then_policy_required(principal_world, clock):
    occ = principal_world
    change = scheduler.change_policy(
        "user", "alice", capabilities=["reports.send", "mail.send"], window=HOUR, max_runs=1, max_units=1,
        enabled=False,
    )  # fmt: skip
    assert change.counts() == {
        "rebound_jobs": 0,
        "stale_jobs": 2,
        "rebound_occurrences": 0,
        "stale_occurrences": 4,
    }
    assert ref(occ["job-a", "queued"]) == 1
    Occurrence.objects.exclude(pk=occ["job-a", "queued"].pk).filter(
        status__in=["queued", "retry_wait"]
    ).update(available_at=clock() + timedelta(days=1))
    claimed = scheduler.claim(owner="w2", lease=60)
    assert claimed.pk == occ["job-a", "queued"].pk
    assert scheduler.authorize(claimed, units=1, owner="w2") == "denied"
    claimed.refresh_from_db()
    assert claimed.last_error["reason"] == "policy_required"
    assert claimed.last_error["code"] == "SCHEDULER_AUTHORITY_POLICY_REQUIRED"
    assert claimed.last_error["details"]["policy"] == "disabled"


def test_set_policy_binds_jobs_created_before_any_policy(clock):
    job = scheduler.create_job("job-a", "k", authority=authority_for("carol", "x.run"))
    occ, _ = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="t")
    if bound_revision(job.authority) is None:  # create_job may bind to a current policy itself
        assert bound_revision(occ.authority) is None
    change = scheduler.change_policy(
        "user", "carol", capabilities=["x.run"], window=HOUR, max_runs=1, max_units=1
    )
    assert (change.rebound_jobs, change.rebound_occurrences) == (1, 1)
    assert ref(job) == 1 and ref(occ) == 1


def test_preview_counts_what_set_policy_would_do_and_writes_nothing(principal_world, clock):
    before = snapshot()
    preview = scheduler.preview_policy_change("user", "alice", capabilities=["reports.send"])
    assert snapshot() == before
    assert preview == {"rebound_jobs": 1, "stale_jobs": 1, "rebound_occurrences": 2, "stale_occurrences": 2}
    assert scheduler.preview_policy_change("user", "alice", capabilities=["reports.send"], enabled=False) == {
        "rebound_jobs": 0,
        "stale_jobs": 2,
        "rebound_occurrences": 0,
        "stale_occurrences": 4,
    }
    assert scheduler.preview_policy_change("user", "nobody", capabilities=["a"]) == dict.fromkeys(preview, 0)
    change = scheduler.change_policy(
        "user", "alice", capabilities=["reports.send"], window=HOUR, max_runs=1, max_units=1
    )
    assert change.counts() == preview


def test_rebinding_is_batched(clock, monkeypatch):
    monkeypatch.setattr(binding, "REBIND_BATCH", 3)
    for n in range(7):
        scheduler.create_job(f"job-{n}", "k", authority=authority_for("dave", "x.run"))
        scheduler.enqueue(f"job-{n}", scheduled_for=clock(), trigger_key="a")
        scheduler.enqueue(f"job-{n}", scheduled_for=clock(), trigger_key="b")
    change = scheduler.change_policy(
        "user", "dave", capabilities=["x.run"], window=HOUR, max_runs=1, max_units=1
    )
    assert (change.rebound_jobs, change.rebound_occurrences) == (7, 14)
    assert {bound_revision(a) for a in Occurrence.objects.values_list("authority", flat=True)} == {1}
    assert {bound_revision(a) for a in Job.objects.values_list("authority", flat=True)} == {1}


def test_principal_match_is_exact(clock):
    # Same id, other type; ids that differ only in case or prefix.
    scheduler.create_job("j1", "k", authority=authority_for("eve", "x.run"))
    scheduler.create_job("j2", "k", authority=authority_for("eve", "x.run", ptype="service"))
    scheduler.create_job("j3", "k", authority=authority_for("Eve", "x.run"))
    scheduler.create_job("j4", "k", authority=authority_for("eve2", "x.run"))
    change = scheduler.change_policy(
        "user", "eve", capabilities=["x.run"], window=HOUR, max_runs=1, max_units=1
    )
    assert change.rebound_jobs == 1
    bound = {j.pk: bound_revision(j.authority) for j in Job.objects.all()}
    assert bound["j1"] == 1
    assert bound["j2"] is None and bound["j3"] is None and bound["j4"] is None


# --------------------------------------------------------------------------- ensure_policy


def test_ensure_policy_creates_then_never_widens(clock):
    envelope = authority_for("frank", "b.cap", "a.cap")
    created = scheduler.ensure_policy(envelope)
    assert (created.revision, created.capabilities, created.window_ms) == (1, ["a.cap", "b.cap"], 86_400_000)
    assert (created.max_runs, created.max_units) == (None, None)  # no budget unless configured
    wider = scheduler.ensure_policy(authority_for("frank", "a.cap", "b.cap", "c.cap"), max_runs=5)
    assert wider.pk == created.pk and wider.revision == 1 and wider.capabilities == ["a.cap", "b.cap"]
    assert AuthorityPolicy.objects.get().max_runs is None
    assert len(scheduler.policy_history("user", "frank")) == 1
    # A narrower existing policy stays narrow too.
    policy(pid="gina", caps=["a.cap"])
    assert scheduler.ensure_policy(authority_for("gina", "a.cap", "z.cap")).capabilities == ["a.cap"]
    custom = scheduler.ensure_policy(authority_for("hank", "a.cap"), window=60, max_runs=2, max_units=3)
    assert (custom.window_ms, custom.max_runs, custom.max_units) == (60_000, 2, 3)


def test_ensure_policy_refuses_an_envelope_without_capabilities(clock):
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.ensure_policy(authority_for("ivan"))
    assert info.value.details["field"] == "authority.requestedCapabilities"
    assert snapshot() == before
    # An existing policy is still returned for such an envelope.
    AuthorityPolicy.objects.create(
        principal_type="user", principal_id="ivan", capabilities=[], created_at=clock(), updated_at=clock()
    )
    assert scheduler.ensure_policy(authority_for("ivan")).capabilities == []


def test_ensure_policy_returns_the_raced_row(clock, monkeypatch):
    winner = policy(pid="jane", caps=["a.cap"])
    calls = []
    real_get = policies.get_policy

    def stale_first_read(*args, **kwargs):
        calls.append(args)
        return None if len(calls) == 1 else real_get(*args, **kwargs)

    monkeypatch.setattr(policies, "get_policy", stale_first_read)
    got = scheduler.ensure_policy(authority_for("jane", "a.cap", "b.cap"))
    assert got.pk == winner.pk and got.capabilities == ["a.cap"] and got.revision == 1
    assert len(calls) == 2


# --------------------------------------------------------------------------- current_usage, binding


def test_current_usage_reads_the_current_window(clock):
    scheduler.create_job("job-a", "k", authority=authority_for("kate", "x.run"))
    p = policy(pid="kate", caps=["x.run"], max_runs=5, max_units=50)
    empty = scheduler.current_usage(p)
    assert (empty.runs, empty.units, empty.remaining_runs, empty.remaining_units) == (0, 0, 5, 50)
    assert empty.window_started_at == clock().replace(minute=0, second=0)
    assert empty.window_ends_at == empty.window_started_at + timedelta(hours=1)
    for n in range(2):
        scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key=f"t{n}")
        claimed = scheduler.claim(owner="w", lease=60)
        assert scheduler.authorize(claimed, units=7, owner="w") == "reserved"
    usage = scheduler.current_usage(p)
    assert (usage.runs, usage.units, usage.policy_revision) == (2, 14, 1)
    assert scheduler.current_usage(p, now=clock() + timedelta(hours=1)).runs == 0
    assert scheduler.current_usage(AuthorityPolicy.objects.get()).runs == 2


def test_bind_to_current_policy(clock):
    from django_durable_scheduler.rules.authority import normalize_authority

    envelope = normalize_authority(authority_for("liam", "a.cap"))
    assert scheduler.bind_to_current_policy(envelope) == envelope  # no policy: unchanged
    policy(pid="liam", caps=["a.cap", "b.cap"])
    policy(pid="liam", caps=["a.cap", "b.cap"])
    bound = scheduler.bind_to_current_policy(envelope)
    assert bound["authorizationRefs"]["schedulerPolicyRevision"] == "scheduler-authority:2"
    assert envelope["authorizationRefs"].get("schedulerPolicyRevision") is None  # not mutated
    # Covered or not, enabled or not: bound whenever a policy exists, so
    # that the worker denies a missing capability as permission_denied, naming it.
    wide = normalize_authority(authority_for("liam", "a.cap", "z.cap"))
    assert bound_revision(scheduler.bind_to_current_policy(wide)) == 2
    policy(pid="liam", caps=["a.cap"], enabled=False)
    assert bound_revision(scheduler.bind_to_current_policy(envelope)) == 3


# --------------------------------------------------------------------------- bad input

NOT_IDENT = [("empty", ""), ("blank", "  "), ("control", "a\x01b"), ("int", 3), ("none", None)]
SET_DEFAULTS: dict[str, Any] = {
    "principal_type": "user",
    "principal_id": "alice",
    "capabilities": ["a.cap"],
    "window": HOUR,
    "max_runs": 10,
    "max_units": 10,
}
BAD_SET: list[tuple[str, str, Any]] = [
    *[("principal_type", label, value) for label, value in NOT_IDENT],
    ("principal_type", "too-long", "t" * 65),
    *[("principal_id", label, value) for label, value in NOT_IDENT],
    ("principal_id", "too-long", "i" * 257),
    ("capabilities", "empty", []),
    ("capabilities", "star", ["a.cap", "*"]),
    ("capabilities", "string", "a.cap"),
    ("capabilities", "none", None),
    ("capabilities", "too-many", [f"c{n}" for n in range(257)]),
    ("capabilities[1]", "bad-item", ["a.cap", ""]),
    ("capabilities[0]", "int-item", [5]),
    ("window", "too-short", 59.999),
    ("window", "too-long", 31 * 86400 + 1),
    ("window", "timedelta-short", timedelta(seconds=30)),
    ("window", "string", "3600"),
    ("window", "bool", True),
    ("window", "nan", float("nan")),
    ("max_runs", "zero", 0),
    ("max_runs", "too-big", 1_000_001),
    ("max_runs", "float", 1.5),
    ("max_runs", "bool", True),
    ("max_units", "zero", 0),
    ("max_units", "too-big", 1_000_001),
    ("max_units", "string", "5"),
    ("enabled", "int", 1),
    ("enabled", "none", None),
    ("expected_revision", "negative", -1),
    ("expected_revision", "string", "1"),
    ("expected_revision", "bool", False),
    ("changed_by", "empty", ""),
    ("changed_by", "control", "a\nb"),
    ("changed_by", "int", 7),
]


@pytest.fixture
def existing(clock):
    scheduler.create_job("job-a", "k", authority=authority_for("alice", "a.cap"))
    return policy(caps=["a.cap"])


@pytest.mark.parametrize("fn", ["set_policy", "change_policy"])
@pytest.mark.parametrize(("field", "label", "value"), BAD_SET, ids=[f"{f}-{lbl}" for f, lbl, _ in BAD_SET])
def test_set_policy_bad_input(existing, fn, field, label, value):
    before = snapshot()
    name = field.split("[")[0]
    with pytest.raises(scheduler.InvalidArgument) as info:
        getattr(scheduler, fn)(**{**SET_DEFAULTS, name: value})
    assert info.value.code == "SCHEDULER_INVALID_ARGUMENT"
    assert info.value.details["field"] == field and field in str(info.value)
    assert snapshot() == before


def test_set_policy_limits_are_inclusive(clock):
    p = scheduler.set_policy(
        "t" * 64, "i" * 256, capabilities=[f"c{n}" for n in range(256)], window=60, max_runs=1_000_000,
        max_units=1,
    )  # fmt: skip
    assert (p.window_ms, p.max_runs, len(p.capabilities)) == (60_000, 1_000_000, 256)
    p = scheduler.set_policy(
        "u", "v", capabilities=["c"], window=timedelta(days=31), max_runs=1, max_units=10**6
    )
    assert p.window_ms == 31 * 86_400_000


BAD_OTHER: list[tuple[str, dict[str, Any], str]] = [
    ("get_policy", {"principal_type": "", "principal_id": "alice"}, "principal_type"),
    ("get_policy", {"principal_type": "user", "principal_id": None}, "principal_id"),
    ("get_policy", {"principal_type": "t" * 65, "principal_id": "alice"}, "principal_type"),
    ("policy_history", {"principal_type": "user", "principal_id": "\x00"}, "principal_id"),
    ("policy_history", {"principal_type": "user", "principal_id": "alice", "limit": 0}, "limit"),
    ("policy_history", {"principal_type": "user", "principal_id": "alice", "limit": "5"}, "limit"),
    ("policy_history", {"principal_type": "user", "principal_id": "alice", "limit": 1001}, "limit"),
    (
        "preview_policy_change",
        {"principal_type": 1, "principal_id": "a", "capabilities": ["x"]},
        "principal_type",
    ),
    (
        "preview_policy_change",
        {"principal_type": "user", "principal_id": "a", "capabilities": []},
        "capabilities",
    ),
    (
        "preview_policy_change",
        {"principal_type": "user", "principal_id": "a", "capabilities": ["*"]},
        "capabilities",
    ),
    (
        "preview_policy_change",
        {"principal_type": "user", "principal_id": "a", "capabilities": ["x"], "enabled": "yes"},
        "enabled",
    ),
    ("ensure_policy", {"authority": None}, "authority"),
    ("ensure_policy", {"authority": {**authority_for("a", "x"), "bogus": 1}}, "authority.bogus"),
    ("ensure_policy", {"authority": authority_for("", "x")}, "authority.principal.id"),
    ("ensure_policy", {"authority": authority_for("a", "*")}, "authority.requestedCapabilities"),
    ("ensure_policy", {"authority": authority_for("new", "x"), "window": 10}, "window"),
    ("ensure_policy", {"authority": authority_for("new", "x"), "max_runs": 0}, "max_runs"),
    ("ensure_policy", {"authority": authority_for("new", "x"), "max_units": 10**7}, "max_units"),
    ("ensure_policy", {"authority": authority_for("new", "x"), "changed_by": ""}, "changed_by"),
    ("current_usage", {"policy": None}, "policy"),
    ("current_usage", {"policy": "alice"}, "policy"),
    ("bind_to_current_policy", {"authority": None}, "authority"),
]


@pytest.mark.parametrize(
    ("fn", "kwargs", "field"), BAD_OTHER, ids=[f"{f}-{fld}-{i}" for i, (f, _, fld) in enumerate(BAD_OTHER)]
)
def test_other_functions_bad_input(existing, fn, kwargs, field):
    before = snapshot()
    with pytest.raises(scheduler.InvalidArgument) as info:
        getattr(scheduler, fn)(**kwargs)
    assert info.value.details["field"] == field, info.value
    assert field in str(info.value)
    assert snapshot() == before


def test_current_usage_bad_now(existing):
    from datetime import datetime

    with pytest.raises(scheduler.InvalidArgument) as info:
        scheduler.current_usage(existing, now=datetime(2026, 1, 1))
    assert info.value.details["field"] == "now"


# --------------------------------------------------------------------------- concurrency


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("expected", [0, None], ids=["cas", "unconditional"])
def test_concurrent_creates(expected):
    """Threads racing to create one principal's policy. With expected_revision=0 exactly one
    wins and the others get the conflict; unconditional changes all apply, one revision each
    (PostgreSQL/MySQL: the unique constraint, after waiting for the winner; SQLite: one
    writer at a time)."""
    for round_ in range(5):
        pid = f"race-{round_}"
        barrier = threading.Barrier(4)
        results: list[Any] = []
        threads = [
            threading.Thread(target=_create_racer, args=(barrier, results, pid, n, expected))
            for n in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        history = sorted(
            AuthorityPolicyRevision.objects.filter(principal_id=pid).values_list("revision", flat=True)
        )
        if expected == 0:
            assert sorted(results) == [("conflict", 1)] * 3 + [("ok", 1)], results
            assert history == [1]
        else:
            assert sorted(results) == [("ok", 1), ("ok", 2), ("ok", 3), ("ok", 4)], results
            assert history == [1, 2, 3, 4]
            assert AuthorityPolicy.objects.get(principal_id=pid).revision == 4


def _create_racer(
    barrier: threading.Barrier, results: list[Any], pid: str, n: int, expected: int | None
) -> None:
    try:
        barrier.wait()
        p = scheduler.set_policy(
            "user",
            pid,
            capabilities=[f"c{n}"],
            window=HOUR,
            max_runs=1,
            max_units=1,
            expected_revision=expected,
        )
        results.append(("ok", p.revision))
    except scheduler.AuthorityPolicyConflict as exc:
        results.append(("conflict", exc.details["actual_revision"]))
    except Exception as exc:  # pragma: no cover - reported by the assertion
        results.append(("error", repr(exc)))
    finally:
        connections.close_all()


@pytest.mark.parametrize("pid", ['o"brien', "back\\slash", "ünï 雪 😀", "it's", "a.b[0]", "%_"])
def test_rebinding_finds_principals_with_any_characters(clock, pid):
    scheduler.create_job("j1", "k", authority=authority_for(pid, "x.run"))
    occ, _ = scheduler.enqueue("j1", scheduled_for=clock(), trigger_key="t")
    scheduler.create_job("j2", "k", authority=authority_for(pid + "x", "x.run"))
    change = scheduler.change_policy(
        "user", pid, capabilities=["x.run"], window=HOUR, max_runs=1, max_units=1
    )
    assert (change.rebound_jobs, change.rebound_occurrences) == (1, 1)
    assert bound_revision(Job.objects.get(pk="j1").authority) == 1 and ref(occ) == 1
    assert bound_revision(Job.objects.get(pk="j2").authority) is None
