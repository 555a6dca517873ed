"""Property test: arbitrary values at every public function's arguments (``docs/design.md``,
"Bad input").

Each example calls one public function with its valid arguments, some of them replaced by
arbitrary values: text with NUL and lone surrogates, integers past every float and column,
floats with NaN and infinities, values nested thousands deep, bytes, datetimes, timedeltas,
plain objects, and dicts (triggers, authority envelopes, batch items) whose known keys hold
such values. The only outcomes allowed are success and a ``SchedulerError``; after a
``SchedulerError`` every scheduler table is unchanged, row for row. Every example is rolled
back, so each starts from the same world (``test_bad_input``'s).

It runs on every database leg: what it guards is that the databases see only what they all
store alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, timedelta
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import django_durable_scheduler as scheduler
from django_durable_scheduler.rules import triggers
from django_durable_scheduler.rules.triggers import descriptions

from ..conftest import AUTHORITY, snapshot
from .test_bad_input import NOW, QUEUED, RUNNING, Ref, World

pytestmark = pytest.mark.django_db


def _nested(levels: int, wrap: Callable[[Any], Any]) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = wrap(value)
    return value


# Values the search would rarely build by itself. Kept shallower and shorter than those of
# test_input_contract, so that Hypothesis can still print a failing example.
SPECIAL: list[Any] = [
    "\x00",
    "a\x00b",
    "\ud800",
    "k\udfff",
    "",
    " ",
    "\\u0000",
    "x" * 1025,
    "x" * 70_000,
    0,
    -1,
    2**31,
    2**53,
    2**63,
    10**400,
    -(10**400),
    1e308,
    -0.0,
    _nested(65, lambda v: [v]),
    _nested(100, lambda v: {"k": v}),
    _nested(100, lambda v: (v,)),
]


def _special(index: int) -> Any:
    return SPECIAL[index]


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and the infinities included
    st.text(st.characters(exclude_categories=()), max_size=12),  # surrogates included
    st.text(st.sampled_from('\x00\ud800\\"u0a '), max_size=6),  # what the databases disagree on
    st.binary(max_size=8),
    st.datetimes(timezones=st.one_of(st.none(), st.just(UTC), st.timezones())),
    st.timedeltas(),
    st.builds(object),
    st.integers(0, len(SPECIAL) - 1).map(_special),
    st.integers(0, len(SPECIAL) - 1).map(_special),
)
KEYS = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=6), st.integers(), st.integers(0, 3).map(_special)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3), st.tuples(inner)
    ),
    max_leaves=6,
)


def arg(default: Any, *more: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The valid ``default`` or an arbitrary value (or one of ``more``)."""
    return st.one_of(st.just(default), VALUES, *more)


def some_of(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict with the ``required`` keys and any of the ``optional`` ones, each from its strategy."""
    return st.fixed_dictionaries(
        {
            key: value if isinstance(value, st.SearchStrategy) else st.just(value)
            for key, value in required.items()
        },
        optional=optional,
    )


TRIGGERS = st.one_of(
    some_of(
        {"every": arg(60)},
        {
            "anchor": arg("2026-01-01T00:00:00Z"),
            "misfire": arg("skip"),
            "overlap": arg("allow"),
            "catchup_window": arg(60),
            "start_at": arg("2026-01-01T00:00:00Z"),
            "end_at": arg("2027-01-01T00:00:00Z"),
        },
    ),
    some_of({"cron": arg("0 9 * * *")}, {"timezone": arg("Europe/Berlin"), "misfire": arg("run_all")}),
    some_of({"at": arg("2026-12-01T09:00:00+01:00")}, {"overlap": arg("skip")}),
    st.dictionaries(KEYS, VALUES, max_size=2),
)
PRINCIPALS = st.one_of(
    st.just({"type": "user", "id": "alice"}), some_of({"type": arg("user"), "id": arg("alice")}, {})
)
AUTHORITIES = some_of(
    {"principal": PRINCIPALS},
    {
        "schemaVersion": arg(1),
        "requestedCapabilities": arg(["reports.send"], st.lists(VALUES, max_size=2)),
        "tenantId": arg("t1"),
        "workspaceId": arg("w1"),
        "authorizationRefs": arg(
            {},
            some_of({}, {"decisionId": arg("d"), "grantIds": arg(["g"]), "schedulerPolicyRevision": VALUES}),
        ),
        "extra": VALUES,
    },
)
ENQUEUE_ITEMS = st.lists(
    some_of(
        {"scheduled_for": arg(NOW), "trigger_key": arg("many")},
        {"available_at": VALUES, "payload": VALUES, "other": VALUES},
    ),
    min_size=1,
    max_size=2,
)
SETTLE_ITEMS = st.lists(
    some_of(
        {"occurrence_id": arg(RUNNING), "fence": arg(1), "outcome": arg("succeeded", st.just("failed"))},
        {"result": VALUES, "error": VALUES, "retryable": arg(True), "retry_at": VALUES, "other": VALUES},
    ),
    min_size=1,
    max_size=2,
)
ERRORS = st.one_of(
    VALUES, some_of({"message": arg("boom")}, {"traceback": VALUES, "code": VALUES, "extra": VALUES})
)
LEASE = {"occurrence_id": arg(RUNNING), "owner": arg("w"), "fence": arg(1)}

# Per public function: each argument's strategy (the valid value, or an arbitrary one).
ARGUMENTS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "create_job": {
        "job_id": arg("job-new"),
        "kind": arg("reports.send"),
        "authority": st.one_of(st.just(AUTHORITY), AUTHORITIES, VALUES),
        "trigger": st.one_of(st.just({}), TRIGGERS, VALUES),
        "payload": VALUES,
        "enabled": arg(True),
        "max_attempts": arg(3),
        "retry_base_delay": arg(10),
        "retry_max_delay": arg(3600),
        "concurrency": arg(None, st.just(2)),
        "concurrency_key": arg(None, st.just("{n}")),
        "then": arg(None, st.just(["job-a"]), st.just([{"job_id": "job-b", "payload": 1}])),
        "on_dead_letter": arg(None, st.just("job-b")),
    },
    "update_job": {
        "job_id": arg("job-a"),
        "expected_revision": arg(1),
        "payload": VALUES,
        "trigger": st.one_of(TRIGGERS, VALUES),
        "authority": st.one_of(AUTHORITIES, VALUES),
        "retry_base_delay": arg(10),
        "max_attempts": arg(3),
        "concurrency": arg(None, st.just(2)),
        "concurrency_key": arg(None, st.just("{n}")),
        "then": arg(None, st.just(["job-b"]), st.just(["job-a"])),
    },
    "enqueue": {
        "job_id": arg("job-a"),
        "scheduled_for": arg(NOW),
        "trigger_key": arg("new-key"),
        "available_at": arg(None),
        "payload": VALUES,
        "unique_key": arg(None, st.just("k")),
        "unique_while": arg(None, st.sampled_from(["pending", "active"])),
        "debounce": arg(None, st.just(5)),
        "debounce_max_wait": arg(None, st.just(60)),
        "then": arg(None, st.just(["job-b"]), st.just([{"job_id": "job-b", "then": "job-a"}])),
        "on_dead_letter": arg(None, st.just("job-a")),
        "batch": arg(None, st.just("open-batch")),
    },
    "enqueue_once_per_trigger": {
        "job_id": arg("job-a"),
        "scheduled_for": arg(NOW),
        "trigger_key": arg("new-key", st.just("queued")),
        "payload": VALUES,
    },
    "enqueue_many": {
        "job_id": arg("job-a"),
        "items": st.one_of(ENQUEUE_ITEMS, VALUES),
        "then": arg(None, st.just(["job-b"])),
        "batch": arg(None, st.just("open-batch")),
    },
    "enqueue_batch": {
        "job_id": arg("job-a"),
        "items": st.one_of(ENQUEUE_ITEMS, VALUES),
        "callback": arg("job-a"),
        "callback_payload": VALUES,
        "batch_id": arg(None, st.just("b-new"), st.just("open-batch")),
        "description": arg(""),
        "created_by": arg(None, st.just("alice")),
        "then": arg(None, st.just(["job-b"])),
    },
    "open_batch": {
        "callback": arg("job-a"),
        "payload": VALUES,
        "batch_id": arg(None, st.just("b-new"), st.just("open-batch")),
        "description": arg(""),
        "created_by": arg(None, st.just("alice")),
    },
    "close_batch": {"batch_id": arg("open-batch")},
    "cancel_batch": {"batch_id": arg("open-batch"), "reason": arg(None), "requested_by": arg(None)},
    "batch_progress": {"batch_id": arg("open-batch")},
    "batch_members": {"batch_id": arg("open-batch"), "status": arg(None, st.just("queued"))},
    "cancel": {
        "occurrence_id": arg(QUEUED),
        "reason": arg(None),
        "requested_by": arg(None, st.just("alice")),
        "fence": arg(None),
    },
    "run_now": {"occurrence_id": arg(QUEUED), "reason": arg(None)},
    "pause": {"kind": arg("reports.send"), "by": arg(None, st.just("alice"))},
    "resume": {"kind": arg("reports.send"), "by": arg(None, st.just("alice"))},
    "retry_dead_letter": {"occurrence_id": arg(QUEUED)},
    "claim": {"owner": arg("w2"), "lease": arg(30), "kinds": arg(None, st.lists(VALUES, max_size=2))},
    "claim_batch": {
        "owner": arg("w2"),
        "lease": arg(30),
        "limit": arg(2),
        "kinds": arg(None),
        "after_principal": arg(None),
        "sweep_expired": arg(True),
    },
    "renew": {**LEASE, "lease": arg(30)},
    "settle": {
        **LEASE,
        "outcome": arg("succeeded", st.just("failed")),
        "result": VALUES,
        "error": ERRORS,
        "retryable": arg(True),
        "retry_at": arg(None),
    },
    "settle_many": {"items": st.one_of(SETTLE_ITEMS, VALUES), "owner": arg("w")},
    "release": dict(LEASE),
    "record_execution": {**LEASE, "metadata": VALUES, "receipt": VALUES},
    "record_progress": {**LEASE, "done": arg(3), "total": arg(None, st.just(10)), "note": arg(None)},
    "deny": {
        **LEASE,
        "code": arg("X_DENIED"),
        "reason": arg("because"),
        "details": arg(None),
        "message": arg(None),
    },
    "defer": {**LEASE, "until": arg(NOW), "details": arg(None)},
    "dead_letter_expired": {"limit": arg(10)},
    "set_policy": {
        "principal_type": arg("user"),
        "principal_id": arg("bob", st.just("alice")),
        "capabilities": arg(["reports.send"], st.lists(VALUES, max_size=2)),
        "window": arg(3600),
        "max_runs": arg(10),
        "max_units": arg(10),
        "enabled": arg(True),
        "expected_revision": arg(None),
        "changed_by": arg(None),
    },
    "ensure_policy": {
        "authority": st.one_of(AUTHORITIES, VALUES),
        "window": arg(3600),
        "max_runs": arg(10),
        "max_units": arg(10),
        "changed_by": arg(None),
    },
    "reserve_authority": {"occurrence_id": arg(RUNNING), "policy_revision": arg(1), "units": arg(1)},
    "history": {"job_id": arg(None), "occurrence_id": arg(None), "limit": arg(50)},
    "next_fire_times": {
        "trigger": st.one_of(TRIGGERS, VALUES),
        "after": arg(NOW),
        "count": arg(3),
        "anchor": arg(None),
    },
    "validate_trigger": {"trigger": st.one_of(TRIGGERS, VALUES)},
    "describe_trigger": {"trigger": st.one_of(TRIGGERS, VALUES)},
    "derive_occurrence_identity": {
        "job_id": arg("job-a"),
        "job_revision": arg(1),
        "scheduled_for_ms": arg(1_700_000_000_000),
        "trigger_key": arg("agenda:daily"),
    },
    "canonical_json": {"value": VALUES},
}
CALLABLES: dict[str, Callable[..., Any]] = {
    "validate_trigger": triggers.validate_trigger,
    "describe_trigger": descriptions.describe_trigger,
}
# Arguments a call may leave out (the rest are always given, valid or not).
REQUIRED: dict[str, set[str]] = {
    "create_job": {"job_id", "kind", "authority"},
    "update_job": {"job_id", "expected_revision"},
    "enqueue": {"job_id", "scheduled_for", "trigger_key"},
    "enqueue_once_per_trigger": {"job_id", "scheduled_for", "trigger_key"},
    "enqueue_many": {"job_id", "items"},
    "enqueue_batch": {"job_id", "items", "callback"},
    "open_batch": {"callback"},
    "close_batch": {"batch_id"},
    "cancel_batch": {"batch_id"},
    "batch_progress": {"batch_id"},
    "batch_members": {"batch_id"},
    "cancel": {"occurrence_id"},
    "run_now": {"occurrence_id"},
    "pause": {"kind"},
    "resume": {"kind"},
    "retry_dead_letter": {"occurrence_id"},
    "claim": {"owner", "lease"},
    "claim_batch": {"owner", "lease"},
    "renew": {"occurrence_id", "owner", "fence", "lease"},
    "settle": {"occurrence_id", "owner", "fence", "outcome"},
    "settle_many": {"items", "owner"},
    "release": {"occurrence_id", "owner", "fence"},
    "record_execution": {"occurrence_id", "owner", "fence"},
    "record_progress": {"occurrence_id", "owner", "fence", "done"},
    "deny": {"occurrence_id", "owner", "fence", "code", "reason"},
    "defer": {"occurrence_id", "owner", "fence", "until"},
    "set_policy": {"principal_type", "principal_id", "capabilities", "window", "max_runs", "max_units"},
    "ensure_policy": {"authority"},
    "reserve_authority": {"occurrence_id", "policy_revision"},
    "next_fire_times": {"trigger", "after"},
    "validate_trigger": {"trigger"},
    "describe_trigger": {"trigger"},
    "derive_occurrence_identity": {"job_id", "job_revision", "scheduled_for_ms", "trigger_key"},
    "canonical_json": {"value"},
}


def arguments(fn: str) -> st.SearchStrategy[dict[str, Any]]:
    required = REQUIRED.get(fn, set())
    spec = ARGUMENTS[fn]
    return st.fixed_dictionaries(
        {name: strategy for name, strategy in spec.items() if name in required},
        optional={name: strategy for name, strategy in spec.items() if name not in required},
    )


def resolve(world: World, value: Any, depth: int = 0) -> Any:
    """``value`` with its :class:`Ref` taken from the world, down to batch items' values."""
    if isinstance(value, Ref):
        return getattr(world, value.name)
    if depth < 3 and type(value) is list:
        return [resolve(world, item, depth + 1) for item in value]
    if depth < 3 and type(value) is dict:
        return {key: resolve(world, item, depth + 1) for key, item in value.items()}
    return value


def test_every_public_function_is_called():
    exported = {
        name
        for name in scheduler.__all__
        if callable(getattr(scheduler, name)) and not isinstance(getattr(scheduler, name), type)
    }
    # Not called here: readers of one object, and the registration of code (handler, Worker).
    elsewhere = {
        "get_job",
        "get_batch",
        "complete_due_batches",
        "get_occurrence",
        "get_policy",
        "get_reservation",
        "policy_history",
        "current_usage",
        "preview_policy_change",
        "change_policy",
        "bind_to_current_policy",
        "materialize_due",
        "authorize",
        "authorize_many",
        "audit_budgets",  # no argument but ``using``
        "paused_kinds",  # likewise
        "handler",
        "declare_job",
    }
    assert exported - elsewhere <= set(ARGUMENTS), sorted(exported - elsewhere - set(ARGUMENTS))


@pytest.mark.parametrize("fn", sorted(ARGUMENTS))
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_arbitrary_arguments_are_refused_cleanly_or_accepted(world, fn, data):
    kwargs = resolve(world, data.draw(arguments(fn), label="kwargs"))
    func = CALLABLES.get(fn) or getattr(scheduler, fn)
    before = snapshot()
    with rolled_back():
        try:
            func(**kwargs)
        except scheduler.SchedulerError as exc:
            after = snapshot()
            assert len(str(exc)) < 1000, str(exc)[:1000]
            assert after == before, f"{type(exc).__name__} after a write: {str(exc)[:200]}"


class _Undo(Exception):
    """Ends a ``rolled_back`` block."""


@contextlib.contextmanager
def rolled_back() -> Iterator[None]:
    """What the block writes is undone at its end (its atomic block rolled back), so that
    each example starts from the same world."""
    with contextlib.suppress(_Undo), transaction.atomic():
        yield
        raise _Undo


def test_a_refusal_after_a_success_still_writes_nothing(world):
    """The rollback between examples: the world is the same after a successful call."""
    before = snapshot()
    with rolled_back():
        scheduler.create_job("job-new", "reports.send", authority=AUTHORITY, payload={"n": 1})
    assert snapshot() == before
    with pytest.raises(scheduler.InvalidArgument):
        scheduler.create_job("job-new", "reports.send", authority=AUTHORITY, retry_base_delay=timedelta.max)
    assert snapshot() == before
