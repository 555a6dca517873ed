"""One input contract on every database (``docs/design.md``, "Bad input"): what SQLite would
store but PostgreSQL or MariaDB would refuse, and values that broke the validation itself, are
refused the same way everywhere, with ``InvalidArgument`` naming the field, before anything is
written.

* NUL (U+0000) in a stored string or JSON object key: PostgreSQL's text and jsonb refuse it.
* Integers beyond float range (``10**400``) as durations, and integers past their column.
* Values nested thousands deep in trigger keys that are compared, not encoded.
* Oversize and unprintable values in error messages: a message shows a short preview only.

The world and its calling convention are ``test_bad_input``'s; the cases here add the
functions and values it does not cover. Each case checks the error class and code, the field
(in the message and ``details``), that the message stays short, and that every scheduler table
is unchanged row for row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler.rules import triggers
from django_durable_scheduler.rules.triggers import descriptions

from ..conftest import AUTHORITY, snapshot
from ..kernel.test_bad_input import DEFAULTS, NOW, RUNNING, Ref, World

pytestmark = pytest.mark.django_db


HUGE = 10**400  # beyond every float
HUGER = 10**5000  # beyond str()'s default digit limit too
ONE_MIB = "x" * (1024 * 1024)
# A refused value appears in a message as a short preview at most.
MAX_MESSAGE = 400


def deep_list(levels: int, leaf: Any = "skip") -> Any:
    value = leaf
    for _ in range(levels - 1):
        value = [value]
    return value


def deep_dict(levels: int) -> Any:
    value: Any = "allow"
    for _ in range(levels - 1):
        value = {"k": value}
    return value


def deep_tuple(levels: int) -> Any:
    value: Any = "k"
    for _ in range(levels - 1):
        value = (value,)
    return value


DEEP = deep_list(3000)

EXTRA_DEFAULTS: dict[str, dict[str, Any]] = {
    "enqueue_many": {"job_id": "job-a", "items": [{"scheduled_for": NOW, "trigger_key": "many"}]},
    "settle_many": {"items": [{"occurrence_id": RUNNING, "fence": 1, "outcome": "succeeded"}], "owner": "w"},
    "record_execution": {"occurrence_id": RUNNING, "owner": "w", "fence": 1, "metadata": {"m": 1}},
    "record_progress": {"occurrence_id": RUNNING, "owner": "w", "fence": 1, "done": 1, "total": 10},
    "deny": {"occurrence_id": RUNNING, "owner": "w", "fence": 1, "code": "X_DENIED", "reason": "because"},
    "defer": {"occurrence_id": RUNNING, "owner": "w", "fence": 1, "until": NOW},
    "set_policy": {
        "principal_type": "user",
        "principal_id": "bob",
        "capabilities": ["reports.send"],
        "window": 3600,
        "max_runs": 10,
        "max_units": 10,
    },
    "ensure_policy": {
        "authority": {"principal": {"type": "user", "id": "carol"}, "requestedCapabilities": ["c"]}
    },
    "reserve_authority": {"occurrence_id": RUNNING, "policy_revision": 1},
    "dead_letter_expired": {},
    "validate_trigger": {"trigger": {"every": 60}},
    "describe_trigger": {"trigger": {"every": 60}},
}
ALL_DEFAULTS = {**DEFAULTS, **EXTRA_DEFAULTS}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "validate_trigger": triggers.validate_trigger,
    "describe_trigger": descriptions.describe_trigger,
}


def resolve(world: World, value: Any, depth: int = 0) -> Any:
    """``value`` with its :class:`Ref` taken from the world: the arguments, and the items of a
    list argument (``items``); deeper values are the cases' own, some thousands deep."""
    if isinstance(value, Ref):
        return getattr(world, value.name)
    if depth < 3 and isinstance(value, list):
        return [resolve(world, item, depth + 1) for item in value]
    if depth < 3 and isinstance(value, dict):
        return {key: resolve(world, item, depth + 1) for key, item in value.items()}
    return value


def call(world: World, fn: str, kwargs: dict[str, Any]) -> Any:
    func = FUNCTIONS.get(fn) or getattr(scheduler, fn)
    return func(**resolve(world, {**ALL_DEFAULTS[fn], **kwargs}))


CASES: list[Any] = []


def case(fn: str, field: str, label: str, **kwargs: Any) -> None:
    """Register: ``fn(**defaults, **kwargs)`` must be refused naming ``field``."""
    CASES.append(pytest.param(fn, kwargs, field, id=f"{fn}-{field}-{label}"))


# --------------------------------------------------------------------------- 1. NUL

NUL_JSON: list[tuple[str, Any]] = [
    ("in-string", "a\x00b"),
    ("alone", "\x00"),
    ("in-nested-string", {"a": [1, {"b": "x\x00"}]}),
    ("in-key", {"a\x00": 1}),
    ("in-nested-key", {"a": {"\x00": 1}}),
    ("after-escaped-backslash", "\\\x00"),
]
for label, value in NUL_JSON:
    case("create_job", "payload", f"nul-{label}", payload=value)
    case("update_job", "payload", f"nul-{label}", payload=value)
    case("enqueue", "payload", f"nul-{label}", payload=value)
    case("enqueue_once_per_trigger", "payload", f"nul-{label}", payload=value)
    case(
        "enqueue_many",
        "items[0].payload",
        f"nul-{label}",
        items=[{"scheduled_for": NOW, "trigger_key": "many", "payload": value}],
    )
    case("settle", "result", f"nul-{label}", result=value)
    case(
        "settle_many",
        "items[0].result",
        f"nul-{label}",
        items=[{"occurrence_id": RUNNING, "fence": 1, "outcome": "succeeded", "result": value}],
    )
    case("record_execution", "metadata", f"nul-{label}", metadata=value)
    case("record_execution", "receipt", f"nul-{label}", receipt=value)
    case("deny", "details", f"nul-{label}", details={"d": value})
    case("defer", "details", f"nul-{label}", details={"d": value})
case("enqueue_once_per_trigger", "payload", "nul-existing-key", trigger_key="queued", payload="\x00")
for label, value in [("in-text", "why\x00"), ("alone", "\x00")]:
    case("cancel", "reason", f"nul-{label}", reason=value)
    case("run_now", "reason", f"nul-{label}", reason=value)
# A handler's error: other keys than message and traceback are stored as given, so refused.
case("settle", "error", "nul-in-code", outcome="failed", error={"message": "boom", "code": "E\x00"})
case("settle", "error", "nul-in-key", outcome="failed", error={"message": "boom", "k\x00": 1})
# Identifiers and trigger fields refuse NUL like any control character.
case("create_job", "authority.principal.id", "nul", authority={"principal": {"type": "user", "id": "a\x00"}})
case("create_job", "trigger.timezone", "nul", trigger={"cron": "0 9 * * *", "timezone": "UTC\x00"})
case("create_job", "trigger.cron", "nul", trigger={"cron": "0 9 * * *\x00"})
case("create_job", "trigger.anchor", "nul", trigger={"every": 60, "anchor": "2026-01-01T00:00:00Z\x00"})
case("create_job", "trigger.misfire", "nul", trigger={"every": 60, "misfire": "skip\x00"})
case("set_policy", "capabilities[0]", "nul", capabilities=["reports\x00send"])
case("set_policy", "principal_id", "nul", principal_id="bob\x00")
case("set_policy", "changed_by", "nul", changed_by="me\x00")
case("deny", "reason", "nul", reason="why\x00")

# --------------------------------------------------------------------------- 3. huge integers

for label, value in [("huge", HUGE), ("minus-huge", -HUGE), ("huger", HUGER)]:
    case("create_job", "retry_base_delay", label, retry_base_delay=value)
    case("create_job", "retry_max_delay", label, retry_max_delay=value)
    case("update_job", "retry_base_delay", label, retry_base_delay=value)
    case("update_job", "retry_max_delay", label, retry_max_delay=value)
    case("set_policy", "window", label, window=value)
    case("ensure_policy", "window", label, window=value)
    case("claim", "lease", label, lease=value)
    case("claim_batch", "lease", label, lease=value)
    case("renew", "lease", label, lease=value)
    case("create_job", "trigger.every", label, trigger={"every": value})
    case("create_job", "trigger.catchup_window", label, trigger={"every": 60, "catchup_window": value})
    case("next_fire_times", "count", label, count=value)
    case("next_fire_times", "after", label, after=value)
    case("enqueue", "scheduled_for", label, scheduled_for=value)
    case("defer", "until", label, until=value)
    case("settle", "retry_at", label, outcome="failed", retry_at=value)
    case("set_policy", "max_runs", label, max_runs=value)
    case("history", "limit", label, limit=value)
    case("dead_letter_expired", "limit", label, limit=value)
    case("claim_batch", "limit", label, limit=value)
    case("reserve_authority", "units", label, units=value)
    case("create_job", "max_attempts", label, max_attempts=value)
# Past the column the value is compared with (a fence is a bigint, revisions are integers).
for label, value in [("bigint-plus-1", 2**63), ("huge", HUGE)]:
    case("renew", "fence", label, fence=value)
    case("settle", "fence", label, fence=value)
    case("release", "fence", label, fence=value)
    case("record_execution", "fence", label, fence=value)
    case("deny", "fence", label, fence=value)
    case("defer", "fence", label, fence=value)
    case(
        "settle_many",
        "items[0].fence",
        label,
        items=[{"occurrence_id": RUNNING, "fence": value, "outcome": "succeeded"}],
    )
for label, value in [("integer-plus-1", 2**31), ("huge", HUGE)]:
    case("update_job", "expected_revision", label, expected_revision=value, payload={"n": 2})
    case("set_policy", "expected_revision", label, expected_revision=value)
    case("reserve_authority", "policy_revision", label, policy_revision=value)
for label, value in [("float-max", 1.7976931348623157e308), ("nan", float("nan")), ("inf", float("inf"))]:
    case("set_policy", "window", label, window=value)
    case("create_job", "retry_max_delay", label, retry_max_delay=value)

# --------------------------------------------------------------------------- 4. deep nesting

for label, value in [("list-3000", DEEP), ("dict-3000", deep_dict(3000)), ("tuple-3000", deep_tuple(3000))]:
    for key in ("misfire", "overlap"):
        trigger = {"every": 60, key: value}
        case("next_fire_times", f"trigger.{key}", label, trigger=trigger)
        case("create_job", f"trigger.{key}", label, trigger=trigger)
        case("update_job", f"trigger.{key}", label, trigger=trigger)
        case("validate_trigger", f"trigger.{key}", label, trigger=trigger)
        case("describe_trigger", f"trigger.{key}", label, trigger=trigger)
    for key in ("every", "catchup_window", "anchor", "start_at", "timezone"):
        trigger = {"cron": "0 9 * * *", key: value} if key == "timezone" else {"every": 60, key: value}
        case("next_fire_times", f"trigger.{key}", label, trigger=trigger)
    case("create_job", "trigger.cron", label, trigger={"cron": value})
    case("create_job", "payload", label, payload=value)
    case("enqueue", "payload", label, payload=value)
    case("settle", "result", label, result=value)
    case("settle", "error", label, outcome="failed", error={"message": "m", "detail": value})
    case("record_execution", "metadata", label, metadata=value)
    principal = {"type": "user", "id": value}
    case("create_job", "authority.principal.id", label, authority={"principal": principal})
    case("set_policy", "capabilities", label, capabilities=value)
    case("claim", "kinds[0]", label, kinds=[value])
    case("cancel", "reason", label, reason=value)
    case("run_now", "reason", label, reason=value)
# A deep tuple as an unknown key: the field names a short preview of it.
case("create_job", "authority.(", "deep-tuple-key", authority={**AUTHORITY, deep_tuple(3000): 1})
case("create_job", "trigger", "deep-tuple-key", trigger={deep_tuple(3000): 1})
case(
    "enqueue_many",
    "items[0].(",
    "deep-tuple-key",
    items=[{"scheduled_for": NOW, "trigger_key": "many", deep_tuple(3000): 1}],
)

# --------------------------------------------------------------------------- oversize in messages

case("next_fire_times", "trigger.anchor", "one-mib", trigger={"every": 60, "anchor": ONE_MIB})
case("create_job", "trigger.start_at", "one-mib", trigger={"every": 60, "start_at": ONE_MIB})
case("create_job", "trigger.misfire", "one-mib", trigger={"every": 60, "misfire": ONE_MIB})
case("create_job", "trigger.timezone", "one-mib", trigger={"cron": "0 9 * * *", "timezone": ONE_MIB})
case("create_job", "trigger.'" + "x" * 24, "one-mib-key", trigger={"every": 60, ONE_MIB: 1})
case("create_job", "authority.'" + "x" * 24, "one-mib-key", authority={**AUTHORITY, ONE_MIB: 1})
case("update_job", "'" + "x" * 24, "one-mib-key", **{ONE_MIB: 1})
case(
    "settle_many",
    "items[0].'" + "x" * 24,
    "one-mib-key",
    items=[{"occurrence_id": RUNNING, "fence": 1, "outcome": "succeeded", ONE_MIB: 1}],
)
case("enqueue_many", "items[0].1", "mixed-keys", items=[{"scheduled_for": NOW, "trigger_key": "k", 1: 2}])
case(
    "settle_many",
    "items[0].1",
    "mixed-type-keys",
    items=[{"occurrence_id": RUNNING, "fence": 1, "outcome": "succeeded", 1: 2}],
)

# --------------------------------------------------------------------------- other columns

# Quotes are escaped in the principal key: within both identifier limits, over its column.
QUOTED_PRINCIPAL = {"principal": {"type": '"' * 64, "id": '"' * 256}, "requestedCapabilities": ["c"]}
case("create_job", "authority.principal", "key-over-column", authority=QUOTED_PRINCIPAL)
case("update_job", "authority.principal", "key-over-column", authority=QUOTED_PRINCIPAL)
case("ensure_policy", "authority.principal", "key-over-column", authority=QUOTED_PRINCIPAL)
case("claim_batch", "after_principal", "int", after_principal=5)
case("claim_batch", "sweep_expired", "str", sweep_expired="no")
case("deny", "details", "list", details=["d"])
case("defer", "details", "string", details="d")

# --------------------------------------------------------------------------- concurrency limits

for label, value in [
    ("zero", 0),
    ("over-max", 10_001),
    ("text", "2"),
    ("bool", True),
    ("float", 1.5),
    ("huge", HUGE),
]:
    case("set_policy", "max_running", label, max_running=value)
    case("create_job", "concurrency", label, concurrency=value)
    case("update_job", "concurrency", label, concurrency=value)
for label, value in [
    ("empty", ""),
    ("int", 5),
    ("attribute", "{customer.name}"),
    ("index", "{customer[0]}"),
    ("conversion", "{customer!r}"),
    ("format-spec", "{customer:>10}"),
    ("unbalanced", "{customer"),
    ("over-max", "x" * 257),
    ("nul", "{customer}\x00"),
]:
    case("create_job", "concurrency_key", label, concurrency_key=value)
    case("update_job", "concurrency_key", label, concurrency_key=value)

# --------------------------------------------------------------------------- unique keys and debounce

for label, value in [
    ("empty", ""),
    ("whitespace", "  "),
    ("nul", "k\x00"),
    ("control", "k\n1"),
    ("lone-surrogate", "k\ud800"),
    ("len-257", "k" * 257),
    ("int", 42),
    ("bool", True),
    ("bytes", b"k"),
    ("dict", {"k": 1}),
]:
    case("enqueue", "unique_key", label, unique_key=value)
    case("enqueue", "unique_key", f"{label}-debounced", unique_key=value, debounce=5)
for label, value in [
    ("unknown", "always"),
    ("int", 1),
    ("bool", True),
    ("list", ["pending"]),
    ("nul", "pending\x00"),
]:
    case("enqueue", "unique_while", label, unique_key="k", unique_while=value)
case("enqueue", "unique_while", "without-key", unique_while="pending")
case("enqueue", "unique_while", "with-debounce", unique_key="k", unique_while="pending", debounce=5)
for label, value in [
    ("negative", -1),
    ("timedelta-negative", timedelta(seconds=-1)),
    ("str", "30"),
    ("bool", True),
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("huge", HUGE),
    ("over-31-days", timedelta(days=31, milliseconds=1)),
    ("list", [5]),
]:
    case("enqueue", "debounce", label, unique_key="k", debounce=value)
case("enqueue", "debounce", "without-key", debounce=5)
case("enqueue", "available_at", "with-debounce", unique_key="k", debounce=5, available_at=NOW)
# A key that a queued occurrence already holds: refused all the same, before anything is read.
case("enqueue", "debounce", "existing-key", trigger_key="queued", unique_key="k", debounce=-5)


# --------------------------------------------------------------------------- progress

for label, value in [
    ("negative", -1),
    ("negative-float", -0.5),
    ("str", "3"),
    ("bool", True),
    ("none", None),
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("huge", HUGE),
    ("list", [1]),
]:
    case("record_progress", "done", label, done=value)
    if value is not None:
        case("record_progress", "total", label, total=value)
case("record_progress", "total", "less-than-done", done=5, total=4)
for label, value in [
    ("too-long", "n" * 201),
    ("not-text", 5),
    ("newline", "two\nlines"),
    ("nul", "a\x00b"),
    ("surrogate", "\ud800"),
]:
    case("record_progress", "note", label, note=value)
case("record_progress", "fence", "huge", fence=HUGE)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("fn", sorted(EXTRA_DEFAULTS))
def test_default_arguments_are_valid(world, fn):
    """The baseline each case starts from is accepted, so a refusal is the bad argument's doing."""
    call(world, fn, {})


@pytest.mark.parametrize(("fn", "kwargs", "field"), CASES)
def test_refused_naming_the_field_with_a_short_message_and_nothing_written(world, fn, kwargs, field):
    before = snapshot()
    with pytest.raises(scheduler.SchedulerError) as info:
        call(world, fn, kwargs)
    exc = info.value
    assert isinstance(exc, scheduler.InvalidArgument), repr(exc)[:MAX_MESSAGE]
    assert exc.code == "SCHEDULER_INVALID_ARGUMENT"
    message = str(exc)
    assert len(message) < MAX_MESSAGE, message[:MAX_MESSAGE]
    assert exc.details["field"].startswith(field), exc.details
    assert message.startswith(f"{exc.details['field']}: "), message
    assert snapshot() == before


@pytest.mark.parametrize(
    "value",
    ["\\u0000", {"\\u0000": "\\\\u0000"}, "\\\\\\u0000", "\x01\x1f\x7f", "\u2028"],
    ids=["escaped-text", "escaped-key-and-value", "escaped-thrice", "other-controls", "line-separator"],
)
def test_text_that_only_looks_like_nul_is_stored_alike(world, value):
    """The NUL check reads canonical JSON: a backslash followed by ``u0000`` is text, not NUL,
    and other control characters are stored as given."""
    job = scheduler.create_job("job-text", "reports.send", authority=AUTHORITY, payload=value)
    job.refresh_from_db()
    assert job.payload == value
    occurrence, _ = scheduler.enqueue("job-text", scheduled_for=world.now, trigger_key="t", payload=[value])
    occurrence.refresh_from_db()
    assert occurrence.payload == [value]


@pytest.mark.parametrize("key", ["message", "traceback"])
def test_nul_in_error_text_is_stored_replaced(world, key):
    """A handler's error text can hold anything; like a lone surrogate, a NUL in it is
    replaced (by U+FFFD), so the failure is recorded the same way on every database."""
    error = {"message": "boom", key: "bo\x00om"}
    done = scheduler.settle(world.running, owner="w", fence=1, outcome="failed", error=error, retryable=False)
    done.refresh_from_db()
    assert done.status == "dead_letter"
    assert done.last_error[key] == "bo\ufffdom"


def test_exception_with_nul_is_stored_replaced(world):
    done = scheduler.settle(
        world.running, owner="w", fence=1, outcome="failed", error=ValueError("a\x00b"), retryable=False
    )
    done.refresh_from_db()
    assert done.last_error == {"type": "ValueError", "message": "a\ufffdb"}


def test_longest_principal_key_is_stored(world):
    """The other side of the principal key bound: a key of exactly its column's length."""
    principal = {"type": "t" * 64, "id": '"' * 73 + "i" * (256 - 73)}  # 327 + 73 escapes
    from django_durable_scheduler.rules.authority import Principal

    assert len(Principal.of({"principal": principal}).key) == 400
    scheduler.create_job("job-key", "reports.send", authority={"principal": principal})
    occurrence, _ = scheduler.enqueue("job-key", scheduled_for=world.now, trigger_key="k")
    occurrence.refresh_from_db()
    assert occurrence.principal_key == Principal.of({"principal": principal}).key


def test_largest_column_values_are_accepted(world):
    """The bounds are the columns': the largest fence and revision are refused only by state."""
    with pytest.raises(scheduler.LeaseLost):
        scheduler.renew(world.running, owner="w", fence=2**63 - 1, lease=30)
    with pytest.raises(scheduler.RevisionConflict):
        scheduler.update_job("job-a", expected_revision=2**31 - 1, payload={"n": 3})
    with pytest.raises(scheduler.AuthorityPolicyStale):
        scheduler.reserve_authority(world.running, policy_revision=2**31 - 1)
    assert scheduler.claim(owner="w9", lease=timedelta(days=1)) is not None  # the queued one


def test_every_new_function_has_cases():
    covered = {param.values[0] for param in CASES}
    assert set(EXTRA_DEFAULTS) <= covered


def test_preview_is_short_and_never_fails():
    from django_durable_scheduler.rules.validation import preview

    class Loud:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    for value in (HUGER, -HUGER, DEEP, deep_dict(3000), ONE_MIB, Loud(), [HUGER], b"x" * 10_000):
        text = preview(value)
        assert 0 < len(text) <= 60, text
