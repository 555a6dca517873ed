"""Bad input to every public kernel function (``docs/design.md``, "Bad input").

Each case calls one function with exactly one bad argument (everything else valid) and
checks that:

1. the exception is a ``scheduler.SchedulerError`` subclass (here ``InvalidArgument``,
   code ``SCHEDULER_INVALID_ARGUMENT``), never a bare TypeError/KeyError/...;
2. the message names the field and ``exc.details["field"]`` is that field
   (``authority.principal.type``, ``kinds[0]``, ...);
3. nothing was written: every scheduler table is unchanged, row for row.

The world the calls run against holds a job with a queued occurrence, a running one
(owner ``w``, fence 1) and, on another job, a running occurrence whose final-attempt lease
has expired, so that a ``claim`` that got past validation would dead-letter it (a write).

Strings with a lone surrogate are refused wherever they would be stored as given; in a
handler's error text they are replaced instead (see ``test_error_text_with_lone_surrogate``),
since failing to record a failure would be worse.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.models import AuthorityPolicy, Event

from ..conftest import AUTHORITY, Clock, snapshot

pytestmark = pytest.mark.django_db

ONE_MIB = 1024 * 1024
DAY = 24 * 60 * 60
LONE_SURROGATE = "\ud800"
DID_NOT_RAISE = pytest.fail.Exception
# An aware datetime whose UTC instant is past 9999-12-31T23:59:59.999Z (the epoch-ms bound).
BEYOND_9999 = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-1)))
NAIVE = datetime(2026, 1, 5, 12, 0, 0)
BEFORE_1970 = datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)


# --------------------------------------------------------------------------- the world


@dataclass
class World:
    now: datetime
    queued: str  # a queued occurrence of job-a (trigger key "queued")
    running: str  # a running occurrence of job-a, owner "w", fence 1, lease still valid


def build_world(clock: Clock) -> World:
    scheduler.create_job("job-a", "reports.send", authority=AUTHORITY, payload={"n": 1})
    # job-b: one attempt; its occurrence's lease expires, so a claim would dead-letter it.
    scheduler.create_job("job-b", "reports.send", authority=AUTHORITY, max_attempts=1)
    scheduler.enqueue("job-b", scheduled_for=clock() - timedelta(seconds=20), trigger_key="expiring")
    expiring = scheduler.claim(owner="w0", lease=1)
    assert expiring is not None and expiring.job_id == "job-b"
    scheduler.enqueue("job-a", scheduled_for=clock() - timedelta(seconds=10), trigger_key="running")
    running = scheduler.claim(owner="w", lease=60)
    assert running is not None and running.job_id == "job-a" and running.fence == 1
    queued, _ = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="queued")
    AuthorityPolicy.objects.create(
        principal_type="user",
        principal_id="alice",
        capabilities=["reports.send"],
        created_at=clock(),
        updated_at=clock(),
    )
    scheduler.open_batch("job-a", batch_id="open-batch")  # open: takes members
    clock.advance(2)  # job-b's final-attempt lease is now expired; job-a's is not
    return World(now=clock(), queued=queued.pk, running=running.pk)


# --------------------------------------------------------------------------- calls


class Ref:
    """An argument taken from the world when the call runs."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


NOW, QUEUED, RUNNING = Ref("now"), Ref("queued"), Ref("running")

# Valid arguments for each function; a case overrides exactly one of them.
DEFAULTS: dict[str, dict[str, Any]] = {
    "create_job": {"job_id": "job-new", "kind": "reports.send", "authority": AUTHORITY},
    "update_job": {"job_id": "job-a", "expected_revision": 1},
    "enqueue": {"job_id": "job-a", "scheduled_for": NOW, "trigger_key": "new-key"},
    "enqueue_once_per_trigger": {"job_id": "job-a", "scheduled_for": NOW, "trigger_key": "new-key"},
    "cancel": {"occurrence_id": QUEUED},
    "run_now": {"occurrence_id": QUEUED},
    "claim": {"owner": "w2", "lease": 30},
    "claim_batch": {"owner": "w2", "lease": 30, "limit": 2},
    "renew": {"occurrence_id": RUNNING, "owner": "w", "fence": 1, "lease": 30},
    "settle": {"occurrence_id": RUNNING, "owner": "w", "fence": 1, "outcome": "succeeded"},
    "release": {"occurrence_id": RUNNING, "owner": "w", "fence": 1},
    "history": {},
    "derive_occurrence_identity": {
        "job_id": "job-a",
        "job_revision": 1,
        "scheduled_for_ms": 1_700_000_000_000,
        "trigger_key": "agenda:daily",
    },
    "canonical_json": {"value": None},
    "next_fire_times": {"trigger": {"every": 60}, "after": NOW},
}
# update_job needs at least one change to be a valid call.
VALID_EXTRA: dict[str, dict[str, Any]] = {"update_job": {"payload": {"n": 2}}}


def invoke(world: World, fn: str, kwargs: dict[str, Any]) -> Any:
    args = {**DEFAULTS[fn], **kwargs}
    resolved = {
        key: getattr(world, value.name) if isinstance(value, Ref) else value for key, value in args.items()
    }
    func: Callable[..., Any] = getattr(scheduler, fn)
    return func(**resolved)


CASES: list[Any] = []


def case(
    fn: str,
    field: str,
    label: str,
    *,
    bug: str | None = None,
    raises: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    **kwargs: Any,
) -> None:
    """Register: ``fn(**DEFAULTS[fn], **kwargs)`` must be refused naming ``field``.

    ``bug`` marks a case the kernel currently gets wrong; ``raises`` is what the test then
    fails with (the leaked exception, ``Failed`` for "did not raise", ``AssertionError`` for a
    wrong exception class or field), so that the mark documents the bug exactly.
    """
    marks = [pytest.mark.xfail(strict=True, reason=bug, raises=raises)] if bug else []
    CASES.append(pytest.param(fn, kwargs, field, id=f"{fn}-{field}-{label}", marks=marks))


# --------------------------------------------------------------------------- bad values

BAD_IDENTIFIERS: list[tuple[str, Any]] = [
    ("empty", ""),
    ("whitespace", " \t\n "),
    ("nul", "a\x00b"),
    ("control-1f", "a\x1fb"),
    ("del-7f", "a\x7fb"),
    ("newline-inside", "a\nb"),
    ("int", 5),
    ("none", None),
    ("bytes", b"job"),
    ("bool", True),
]


def bad_identifiers(max_length: int = 256) -> list[tuple[str, Any]]:
    return [*BAD_IDENTIFIERS, (f"len-{max_length + 1}", "x" * (max_length + 1))]


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels - 1):
        value = [value]
    return value


BAD_JSON: list[tuple[str, Any]] = [
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("minus-inf", {"a": [float("-inf")]}),
    ("set", {1, 2}),
    ("nested-set", {"a": {"b": {1}}}),
    ("int-key", {1: "a"}),
    ("none-key", {None: "a"}),
    ("tuple-key", {("a",): 1}),
    ("bytes", b"x"),
    ("object", object()),
    ("decimal", decimal.Decimal("1.5")),
    ("datetime", datetime(2026, 1, 1, tzinfo=UTC)),
    ("huge-int", 10**400),  # beyond any double; integers past 2**53 are written as doubles
    ("depth-70", _deep(70)),
    ("over-1mib", "x" * ONE_MIB),
]

BAD_INTS_MIN1: list[tuple[str, Any]] = [
    ("zero", 0),
    ("negative", -1),
    ("bool-true", True),
    ("bool-false", False),
    ("float", 1.0),
    ("str", "1"),
    ("none", None),
]

BAD_DURATIONS: list[tuple[str, Any]] = [
    ("zero", 0),
    ("negative", -1),
    ("sub-millisecond", 0.0004),
    ("over-24h", DAY + 1),
    ("over-24h-by-1ms", DAY + 0.001),
    ("timedelta-zero", timedelta(0)),
    ("timedelta-negative", timedelta(seconds=-1)),
    ("timedelta-sub-ms", timedelta(microseconds=999)),
    ("timedelta-over-24h", timedelta(days=1, milliseconds=1)),
    ("bool", True),
    ("str", "30"),
    ("none", None),
    ("nan", float("nan")),
    ("inf", float("inf")),
]

BAD_INSTANTS: list[tuple[str, Any]] = [
    ("naive", NAIVE),
    ("before-1970", BEFORE_1970),
    ("negative-ms", -1),
    ("ms-after-9999", 253_402_300_800_000),
    ("bool", True),
    ("float-ms", 1_767_614_400_000.0),
    ("iso-string", "2026-01-05T12:00:00Z"),
    ("date", date(2026, 1, 5)),
]

BAD_AUTHORITIES: list[tuple[str, str, Any]] = [
    # (label, field, envelope); None is no envelope: the default principal's (test_default_authority.py)
    ("string", "authority", "user:alice"),
    ("list", "authority", [AUTHORITY]),
    ("unknown-top-key", "authority.owner", {**AUTHORITY, "owner": "alice"}),
    ("schema-version-2", "authority.schemaVersion", {**AUTHORITY, "schemaVersion": 2}),
    ("schema-version-str", "authority.schemaVersion", {**AUTHORITY, "schemaVersion": "1"}),
    ("schema-version-bool", "authority.schemaVersion", {**AUTHORITY, "schemaVersion": True}),
    ("no-principal", "authority.principal", {"schemaVersion": 1, "requestedCapabilities": []}),
    ("principal-null", "authority.principal", {**AUTHORITY, "principal": None}),
    ("principal-string", "authority.principal", {**AUTHORITY, "principal": "user:alice"}),
    (
        "principal-unknown-key",
        "authority.principal.name",
        {**AUTHORITY, "principal": {"type": "user", "id": "alice", "name": "Alice"}},
    ),
    ("principal-no-type", "authority.principal.type", {**AUTHORITY, "principal": {"id": "alice"}}),
    ("principal-no-id", "authority.principal.id", {**AUTHORITY, "principal": {"type": "user"}}),
    (
        "principal-type-65",
        "authority.principal.type",
        {**AUTHORITY, "principal": {"type": "t" * 65, "id": "alice"}},
    ),
    (
        "principal-type-blank",
        "authority.principal.type",
        {**AUTHORITY, "principal": {"type": " ", "id": "a"}},
    ),
    ("principal-type-int", "authority.principal.type", {**AUTHORITY, "principal": {"type": 1, "id": "a"}}),
    (
        "principal-type-control",
        "authority.principal.type",
        {**AUTHORITY, "principal": {"type": "us\x07er", "id": "a"}},
    ),
    (
        "principal-id-257",
        "authority.principal.id",
        {**AUTHORITY, "principal": {"type": "user", "id": "a" * 257}},
    ),
    ("principal-id-empty", "authority.principal.id", {**AUTHORITY, "principal": {"type": "user", "id": ""}}),
    ("tenant-int", "authority.tenantId", {**AUTHORITY, "tenantId": 7}),
    ("tenant-empty", "authority.tenantId", {**AUTHORITY, "tenantId": ""}),
    ("workspace-257", "authority.workspaceId", {**AUTHORITY, "workspaceId": "w" * 257}),
    (
        "caps-string",
        "authority.requestedCapabilities",
        {**AUTHORITY, "requestedCapabilities": "reports.send"},
    ),
    ("caps-star", "authority.requestedCapabilities", {**AUTHORITY, "requestedCapabilities": ["*"]}),
    (
        "caps-star-among-others",
        "authority.requestedCapabilities",
        {**AUTHORITY, "requestedCapabilities": ["a", "*", "b"]},
    ),
    ("caps-empty-item", "authority.requestedCapabilities[0]", {**AUTHORITY, "requestedCapabilities": [""]}),
    ("caps-int-item", "authority.requestedCapabilities[0]", {**AUTHORITY, "requestedCapabilities": [3]}),
    (
        "caps-long-item",
        "authority.requestedCapabilities[1]",
        {**AUTHORITY, "requestedCapabilities": ["ok", "c" * 257]},
    ),
    (
        "caps-257-entries",
        "authority.requestedCapabilities",
        {**AUTHORITY, "requestedCapabilities": [f"cap.{i}" for i in range(257)]},
    ),
    ("refs-string", "authority.authorizationRefs", {**AUTHORITY, "authorizationRefs": "ref"}),
    ("refs-list", "authority.authorizationRefs", {**AUTHORITY, "authorizationRefs": []}),
    (
        "refs-unknown-key",
        "authority.authorizationRefs.policy",
        {**AUTHORITY, "authorizationRefs": {"policy": "p1"}},
    ),
    (
        "refs-decision-int",
        "authority.authorizationRefs.decisionId",
        {**AUTHORITY, "authorizationRefs": {"decisionId": 1}},
    ),
    (
        "refs-policy-revision-blank",
        "authority.authorizationRefs.policyRevision",
        {**AUTHORITY, "authorizationRefs": {"policyRevision": "  "}},
    ),
    (
        "refs-grants-string",
        "authority.authorizationRefs.grantIds",
        {**AUTHORITY, "authorizationRefs": {"grantIds": "g1"}},
    ),
    (
        "refs-approvals-empty-item",
        "authority.authorizationRefs.approvalIds[0]",
        {**AUTHORITY, "authorizationRefs": {"approvalIds": [""]}},
    ),
    (
        "refs-delegations-257",
        "authority.authorizationRefs.delegationIds",
        {**AUTHORITY, "authorizationRefs": {"delegationIds": [f"d{i}" for i in range(257)]}},
    ),
    *[
        (
            f"scheduler-policy-revision-{label}",
            "authority.authorizationRefs.schedulerPolicyRevision",
            {**AUTHORITY, "authorizationRefs": {"schedulerPolicyRevision": value}},
        )
        for label, value in [
            ("zero", "scheduler-authority:0"),
            ("leading-zero", "scheduler-authority:01"),
            ("negative", "scheduler-authority:-1"),
            ("not-a-number", "scheduler-authority:x"),
            ("no-number", "scheduler-authority:"),
            ("bare-number", "1"),
            ("other-prefix", "policy:1"),
            ("suffix", "scheduler-authority:1a"),
            ("int", 1),
            ("empty", ""),
        ]
    ],
]

# Wrong types that the envelope normalizer turns into [] instead of refusing (``x or []``).
FALSY_LISTS: list[tuple[str, Any]] = [("false", False), ("zero", 0), ("empty-dict", {}), ("empty-string", "")]

# --------------------------------------------------------------------------- create_job

for label, value in bad_identifiers():
    case("create_job", "job_id", label, job_id=value)
for label, value in bad_identifiers(128):
    case("create_job", "kind", label, kind=value)
for label, field, value in BAD_AUTHORITIES:
    case("create_job", field, label, authority=value)
for label, value in FALSY_LISTS:
    case(
        "create_job",
        "authority.requestedCapabilities",
        f"caps-{label}",
        authority={**AUTHORITY, "requestedCapabilities": value},
    )
    case(
        "create_job",
        "authority.authorizationRefs.grantIds",
        f"grants-{label}",
        authority={**AUTHORITY, "authorizationRefs": {"grantIds": value}},
    )
for label, value in BAD_JSON:
    case("create_job", "payload", label, payload=value)
case("create_job", "payload", "lone-surrogate", payload={"s": "p" + LONE_SURROGATE})
case("create_job", "trigger", "string", trigger="0 9 * * *")
case("create_job", "trigger", "list", trigger=[])
for label, value in [("str", "yes"), ("int", 1), ("none", None), ("zero", 0)]:
    case("create_job", "enabled", label, enabled=value)
for label, value in [*BAD_INTS_MIN1, ("33", 33), ("huge", 2**40)]:
    case("create_job", "max_attempts", label, max_attempts=value)
for label, value in [("zero", 0), ("negative", -5), ("over-24h", DAY + 1), ("str", "10"), ("bool", True)]:
    case("create_job", "retry_base_delay", label, retry_base_delay=value)
for label, value in [("zero", 0), ("over-31-days", 31 * DAY + 1), ("nan", float("nan")), ("str", "1h")]:
    case("create_job", "retry_max_delay", label, retry_max_delay=value)
case("create_job", "retry_max_delay", "below-base", retry_base_delay=20, retry_max_delay=10)
case(
    "create_job",
    "retry_max_delay",
    "below-base-timedelta",
    retry_base_delay=timedelta(minutes=2),
    retry_max_delay=timedelta(minutes=1),
)
BAD_LIMITS: list[tuple[str, Any]] = [
    ("zero", 0),
    ("negative", -1),
    ("over-10000", 10_001),
    ("str", "2"),
    ("float", 2.0),
    ("bool", True),
]
BAD_TEMPLATES: list[tuple[str, Any]] = [
    ("int", 5),
    ("empty", ""),
    ("attribute", "{a.b}"),
    ("index", "{a[0]}"),
    ("conversion", "{a!r}"),
    ("format-spec", "{a:>5}"),
    ("unclosed", "{a"),
    ("nul", "a\x00b"),
    ("len-257", "x" * 257),
    ("callable", str.upper),
]
for fn in ("create_job", "update_job"):
    for label, value in BAD_LIMITS:
        case(fn, "concurrency", label, concurrency=value)
    for label, value in BAD_TEMPLATES:
        case(fn, "concurrency_key", label, concurrency_key=value)
case(
    "create_job",
    "job_id",
    "lone-surrogate",
    job_id="job-" + LONE_SURROGATE,
)
case(
    "create_job",
    "retry_base_delay",
    "float-overflow",
    retry_base_delay=1e308,
)

# --------------------------------------------------------------------------- update_job

for label, value in bad_identifiers():
    case("update_job", "job_id", label, job_id=value, payload={"n": 2})
for label, value in BAD_INTS_MIN1:
    case("update_job", "expected_revision", label, expected_revision=value, payload={"n": 2})
case("update_job", "changes", "no-changes")
case("update_job", "colour", "unknown-key", colour="red")
case("update_job", "revision", "revision-not-changeable", revision=5)
case("update_job", "created_at", "created-at-not-changeable", created_at=NAIVE)
case("update_job", "colour", "unknown-key-with-valid-one", payload={"n": 2}, colour="red")
for label, value in bad_identifiers(128):
    case("update_job", "kind", label, kind=value)
for label, field, value in BAD_AUTHORITIES:
    case("update_job", field, label, authority=value)
case(
    "update_job",
    "authority.requestedCapabilities",
    "caps-false",
    authority={**AUTHORITY, "requestedCapabilities": False},
)
for label, value in BAD_JSON:
    case("update_job", "payload", label, payload=value)
case("update_job", "trigger", "string", trigger="0 9 * * *")
for label, value in [("str", "no"), ("int", 0), ("none", None)]:
    case("update_job", "enabled", label, enabled=value)
for label, value in [*BAD_INTS_MIN1, ("33", 33)]:
    case("update_job", "max_attempts", label, max_attempts=value)
for label, value in [("zero", 0), ("over-24h", DAY + 1), ("none", None)]:
    case("update_job", "retry_base_delay", label, retry_base_delay=value)
for label, value in [("zero", 0), ("over-31-days", 31 * DAY + 1), ("none", None)]:
    case("update_job", "retry_max_delay", label, retry_max_delay=value)
# The job's delays are the defaults, 10 s and 1 h.
case("update_job", "retry_max_delay", "max-below-current-base", retry_max_delay=5)
case("update_job", "retry_max_delay", "base-above-current-max", retry_base_delay=7200)
case("update_job", "retry_max_delay", "both-inverted", retry_base_delay=60, retry_max_delay=30)

# ------------------------------------------------------------- enqueue, enqueue_once_per_trigger

for fn in ("enqueue", "enqueue_once_per_trigger"):
    for label, value in bad_identifiers():
        case(fn, "job_id", label, job_id=value)
        case(fn, "trigger_key", label, trigger_key=value)
    for label, value in BAD_INSTANTS:
        case(fn, "scheduled_for", label, scheduled_for=value)
        case(fn, "available_at", label, available_at=value)
    case(fn, "scheduled_for", "none", scheduled_for=None)
    for label, value in BAD_JSON:
        case(fn, "payload", label, payload=value)
    for field in ("scheduled_for", "available_at"):
        case(
            fn,
            field,
            "aware-beyond-9999",
            **{field: BEYOND_9999},
        )
    case(
        fn,
        "trigger_key",
        "lone-surrogate",
        trigger_key="k" + LONE_SURROGATE,
    )
case("enqueue", "payload", "lone-surrogate", payload={"s": "p" + LONE_SURROGATE})
case(
    "enqueue_once_per_trigger",
    "payload",
    "nan-with-existing-trigger-key",
    trigger_key="queued",
    payload=float("nan"),
)
case(
    "enqueue_once_per_trigger",
    "payload",
    "set-with-existing-trigger-key",
    trigger_key="queued",
    payload={1, 2},
)

# --------------------------------------------------------------------------- cancel

for fn in ("cancel", "run_now"):
    for label, value in bad_identifiers():
        case(fn, "occurrence_id", label, occurrence_id=value)
    for label, value in [
        ("int", 5),
        ("bytes", b"why"),
        ("dict", {"why": "x"}),
        ("1025-bytes", "r" * 1025),
        ("1026-bytes-multibyte", "\u00e9" * 513),
    ]:
        case(fn, "reason", label, reason=value)
    case(fn, "reason", "lone-surrogate", reason="why" + LONE_SURROGATE)
for label, value in [
    ("int", 5),
    ("blank", " "),
    ("257-bytes", "x" * 257),
    ("lone-surrogate", "who" + LONE_SURROGATE),
]:
    case("cancel", "requested_by", label, requested_by=value)
for label, value in [("zero", 0), ("negative", -1), ("string", "1"), ("float", 1.5), ("bool", True)]:
    case("cancel", "fence", label, fence=value)

# --------------------------------------------------------------------------- claim, claim_batch

for fn in ("claim", "claim_batch"):
    for label, value in bad_identifiers():
        case(fn, "owner", label, owner=value)
    for label, value in BAD_DURATIONS:
        case(fn, "lease", label, lease=value)
    for label, value in [("string", "reports.send"), ("int", 5), ("float", 1.5)]:
        case(fn, "kinds", label, kinds=value)
    for label, value in bad_identifiers(128):
        case(fn, "kinds[0]", label, kinds=[value])
    case(fn, "kinds[1]", "second-bad", kinds=["reports.send", ""])
    case(
        fn,
        "lease",
        "float-overflow",
        lease=1e308,
    )
for label, value in [*BAD_INTS_MIN1, ("over-max-batch", 501)]:
    case("claim_batch", "limit", label, limit=value)

# --------------------------------------------------------------------------- renew, settle, release

for fn in ("renew", "settle", "release"):
    for label, value in bad_identifiers():
        case(fn, "occurrence_id", label, occurrence_id=value)
        case(fn, "owner", label, owner=value)
    for label, value in BAD_INTS_MIN1:
        case(fn, "fence", label, fence=value)
for label, value in BAD_DURATIONS:
    case("renew", "lease", label, lease=value)
case(
    "renew",
    "lease",
    "float-overflow",
    lease=1e308,
)
for label, value in [
    ("unknown", "success"),
    ("upper", "SUCCEEDED"),
    ("status-name", "retry_wait"),
    ("padded", " succeeded"),
    ("none", None),
    ("int", 1),
    ("bool", True),
]:
    case("settle", "outcome", label, outcome=value)
for label, value in [
    *BAD_JSON[:-1],
    ("over-64kib", "x" * (64 * 1024)),
    ("dict-over-64kib", {"a": "y" * 65530}),
]:
    case("settle", "result", label, result=value)
for label, value in [("int", 5), ("list", ["boom"]), ("object", object()), ("bytes", b"boom")]:
    case("settle", "error", label, outcome="failed", error=value)
for label, value in [("nan-in-dict", {"message": "x", "value": float("nan")}), ("int-key", {1: "x"})]:
    case("settle", "error", label, outcome="failed", error=value)
case("settle", "error", "over-64kib", outcome="failed", error={"message": "x", "detail": "d" * 70_000})
case("settle", "result", "lone-surrogate", result={"s": "r" + LONE_SURROGATE})
for label, value in [("str", "yes"), ("int", 1), ("none", None)]:
    case("settle", "retryable", label, outcome="failed", retryable=value)
for label, value in BAD_INSTANTS:
    case("settle", "retry_at", label, outcome="failed", retry_at=value)
case(
    "settle",
    "retry_at",
    "aware-beyond-9999",
    outcome="failed",
    retry_at=BEYOND_9999,
)
# --------------------------------------------------------------------------- history

for label, value in bad_identifiers():
    if value is None:
        continue  # None means "no filter"
    case("history", "job_id", label, job_id=value)
    case("history", "occurrence_id", label, occurrence_id=value)
for label, value in [*BAD_INTS_MIN1[:-1], ("over-10000", 10_001)]:
    case("history", "limit", label, limit=value)

# --------------------------------------------------------------------------- identity, canonical_json

for label, value in bad_identifiers():
    case("derive_occurrence_identity", "job_id", label, job_id=value)
    case("derive_occurrence_identity", "trigger_key", label, trigger_key=value)
for label, value in BAD_INTS_MIN1:
    case("derive_occurrence_identity", "job_revision", label, job_revision=value)
for label, value in [
    ("negative", -1),
    ("bool", True),
    ("float", 1.7e12),
    ("str", "1700000000000"),
    ("none", None),
    ("datetime", datetime(2026, 1, 1, tzinfo=UTC)),
]:
    case("derive_occurrence_identity", "scheduled_for_ms", label, scheduled_for_ms=value)
case(
    "derive_occurrence_identity",
    "job_revision",
    "unsafe-int",
    job_revision=2**53,
)
case(
    "derive_occurrence_identity",
    "scheduled_for_ms",
    "unsafe-int",
    scheduled_for_ms=2**53,
)
case(
    "derive_occurrence_identity",
    "job_id",
    "lone-surrogate",
    job_id="job-" + LONE_SURROGATE,
)
for label, value in BAD_JSON:
    case("canonical_json", "value", label, value=value)

# --------------------------------------------------------------------------- next_fire_times

case("next_fire_times", "after", "naive", after=NAIVE)
case("next_fire_times", "trigger.cron", "step-zero", trigger={"cron": "*/0 * * * *"})


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("fn", sorted(DEFAULTS))
def test_default_arguments_are_valid(world, fn):
    """The baseline each case starts from is accepted, so a refusal is the bad argument's doing."""
    invoke(world, fn, VALID_EXTRA.get(fn, {}))


def test_every_public_kernel_function_has_cases():
    covered = {param.values[0] for param in CASES}
    assert covered == set(DEFAULTS)


@pytest.mark.parametrize(("fn", "kwargs", "field"), CASES)
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(world, fn, kwargs, field):
    before = snapshot()
    with pytest.raises(scheduler.SchedulerError) as info:
        invoke(world, fn, kwargs)
    exc = info.value
    assert isinstance(exc, scheduler.InvalidArgument), repr(exc)
    assert exc.code == "SCHEDULER_INVALID_ARGUMENT"
    assert field in str(exc), str(exc)
    assert exc.details["field"] == field, exc.details
    assert snapshot() == before


def test_float_payload_beyond_safe_integers_is_refused_or_round_trips(world):
    try:
        scheduler.create_job("job-big", "reports.send", authority=AUTHORITY, payload={"x": 1e20})
    except scheduler.InvalidArgument as exc:  # refusing it is fine
        assert exc.details["field"] == "payload"
        return
    scheduler.enqueue("job-big", scheduled_for=world.now, trigger_key="k")  # ... or it must work
    scheduler.update_job("job-big", expected_revision=1, payload=None)


def test_values_at_the_limits_are_accepted(world, clock):
    """The other side of the bounds above: the largest valid values go through."""
    principal = {"type": "t" * 64, "id": "i" * 256}
    job = scheduler.create_job(
        "j" * 256,
        "k" * 128,
        authority={"principal": principal, "requestedCapabilities": [f"c{i}" for i in range(256)]},
        payload="p" * (ONE_MIB - 2),  # exactly 1 MiB as canonical JSON (with its quotes)
        max_attempts=32,
        retry_base_delay=DAY,
        retry_max_delay=2 * DAY,  # 31 days: see test_longest_retry_max_delay_is_stored
    )
    assert job.authority["principal"] == principal
    occurrence, _ = scheduler.enqueue(
        job.job_id, scheduled_for=253_402_300_799_999, trigger_key="t" * 256, available_at=0, payload=None
    )
    assert scheduler.cancel(occurrence.pk, reason="r" * 1024).status == "cancelled"
    scheduler.update_job(job.job_id, expected_revision=1, max_attempts=1, retry_max_delay=DAY)
    assert scheduler.claim_batch(owner="o" * 256, lease=DAY, limit=500, kinds=["k" * 128]) == []
    running = scheduler.renew(world.running, owner="w", fence=1, lease=timedelta(days=1))
    assert running.lease_expires_at == clock() + timedelta(days=1)
    done = scheduler.settle(
        world.running, owner="w", fence=1, outcome="succeeded", result="r" * (64 * 1024 - 2)
    )
    assert done.status == "succeeded"
    assert len(scheduler.history(limit=10_000)) == Event.objects.count()
    assert scheduler.canonical_json(2**53 - 1) == str(2**53 - 1)


def test_longest_retry_max_delay_is_stored(world, request):
    """The kernel allows retry_max_delay up to 31 days; the job must then be stored as given."""
    before = snapshot()
    try:
        job = scheduler.create_job("job-long", "reports.send", authority=AUTHORITY, retry_max_delay=31 * DAY)
    except scheduler.InvalidArgument as exc:  # a lower documented limit would be fine too
        assert exc.details["field"] == "retry_max_delay"
        assert snapshot() == before
        return
    job.refresh_from_db()
    assert job.retry_max_delay_ms == 31 * DAY * 1000


@pytest.mark.parametrize("error", [{"message": "boom" + LONE_SURROGATE}, ValueError("boom" + LONE_SURROGATE)])
def test_error_text_with_lone_surrogate_is_stored_replaced(world, error):
    done = scheduler.settle(world.running, owner="w", fence=1, outcome="failed", error=error, retryable=False)
    assert done.status == "dead_letter"
    assert done.last_error["message"] == "boom?"
