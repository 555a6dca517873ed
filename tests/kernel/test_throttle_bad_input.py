"""Bad throttles wherever one is written (docs/design.md, "Throttles"): ``create_job``,
``update_job``, ``declare_job``, ``@handler(throttle=)`` and its ``job=``, ``@durable`` and the
backend's ``OPTIONS``, and ``set_policy`` (where a ``key`` is refused too). Each is a
``SchedulerError`` naming the field (the backend's an ``ImproperlyConfigured`` carrying it, as
Django reports bad settings), and nothing is written or registered."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import declared, registry
from django_durable_scheduler.models import ThrottleBucket, ThrottlePlace
from django_durable_scheduler.tasks import durable
from django_durable_scheduler.tasks.backend import DurableBackend

from ..conftest import AUTHORITY, snapshot

GOOD = {"limit": 2, "period": 1}

# (label, throttle, the field named after the prefix "throttle")
BAD: list[tuple[str, Any, str]] = [
    ("not-a-dict", 5, ""),
    ("a-list", [2, 1], ""),
    ("a-string", "2/s", ""),
    ("no-limit", {"period": 1}, ".limit"),
    ("no-period", {"limit": 1}, ".period"),
    ("limit-none", {"limit": None, "period": 1}, ".limit"),
    ("limit-zero", {"limit": 0, "period": 1}, ".limit"),
    ("limit-negative", {"limit": -1, "period": 1}, ".limit"),
    ("limit-too-big", {"limit": 1_000_001, "period": 1}, ".limit"),
    ("limit-float", {"limit": 1.5, "period": 1}, ".limit"),
    ("limit-string", {"limit": "2", "period": 1}, ".limit"),
    ("limit-bool", {"limit": True, "period": 1}, ".limit"),
    ("period-zero", {"limit": 1, "period": 0}, ".period"),
    ("period-negative", {"limit": 1, "period": -1}, ".period"),
    ("period-under-1ms", {"limit": 1, "period": 0.0001}, ".period"),
    ("period-over-31-days", {"limit": 1, "period": timedelta(days=31, seconds=1)}, ".period"),
    ("period-nan", {"limit": 1, "period": float("nan")}, ".period"),
    ("period-inf", {"limit": 1, "period": float("inf")}, ".period"),
    ("period-huge-int", {"limit": 1, "period": 10**400}, ".period"),
    ("period-string", {"limit": 1, "period": "5s"}, ".period"),
    ("period-bool", {"limit": 1, "period": True}, ".period"),
    ("period-ms-huge", {"limit": 1, "period_ms": 10**18}, ".period_ms"),
    ("period-ms-zero", {"limit": 1, "period_ms": 0}, ".period_ms"),
    ("period-ms-float", {"limit": 1, "period_ms": 1.5}, ".period_ms"),
    ("period-and-period-ms", {"limit": 1, "period": 1, "period_ms": 1000}, ".period_ms"),
    ("burst-negative", {**GOOD, "burst": -1}, ".burst"),
    ("burst-too-big", {**GOOD, "burst": 1_000_001}, ".burst"),
    ("burst-float", {**GOOD, "burst": 0.5}, ".burst"),
    ("burst-false", {**GOOD, "burst": False}, ".burst"),
    ("burst-empty-string", {**GOOD, "burst": ""}, ".burst"),
    ("burst-empty-list", {**GOOD, "burst": []}, ".burst"),
    ("unknown-setting", {**GOOD, "rate": 3}, ".rate"),
    ("int-setting-name", {**GOOD, 7: 3}, ".7"),
    ("key-empty", {**GOOD, "key": ""}, ".key"),
    ("key-not-text", {**GOOD, "key": 5}, ".key"),
    ("key-attribute", {**GOOD, "key": "{a.b}"}, ".key"),
    ("key-index", {**GOOD, "key": "{a[0]}"}, ".key"),
    ("key-format-spec", {**GOOD, "key": "{a:>9}"}, ".key"),
    ("key-unbalanced", {**GOOD, "key": "{a"}, ".key"),
    ("key-nul", {**GOOD, "key": "{a}\x00"}, ".key"),
    ("key-lone-surrogate", {**GOOD, "key": "{a}\ud800"}, ".key"),
    ("key-too-long", {**GOOD, "key": "x" * 257}, ".key"),
]
IDS = [label for label, _, _ in BAD]


def everything() -> dict[str, Any]:
    """Every scheduler table, the throttle tables too: a refused call changed none of them."""
    tables = snapshot()
    for model in (ThrottleBucket, ThrottlePlace):
        tables[model.__name__] = list(model.objects.order_by("pk").values())
    return tables


@pytest.fixture
def job(db, clock):
    scheduler.create_job("thr-job", "reports.send", authority=AUTHORITY)
    return "thr-job"


@pytest.mark.django_db
@pytest.mark.parametrize(("label", "throttle", "field"), BAD, ids=IDS)
def test_create_job(clock, label, throttle, field):
    before = everything()
    with pytest.raises(scheduler.InvalidArgument) as caught:
        scheduler.create_job("thr-new", "reports.send", authority=AUTHORITY, throttle=throttle)
    assert caught.value.details["field"] == f"throttle{field}"
    assert f"throttle{field}" in str(caught.value)
    assert everything() == before


@pytest.mark.parametrize(("label", "throttle", "field"), BAD, ids=IDS)
def test_update_job(job, label, throttle, field):
    before = everything()
    with pytest.raises(scheduler.InvalidArgument) as caught:
        scheduler.update_job(job, expected_revision=1, throttle=throttle)
    assert caught.value.details["field"] == f"throttle{field}"
    assert everything() == before


@pytest.mark.parametrize(("label", "throttle", "field"), BAD, ids=IDS)
def test_declare_job(label, throttle, field):
    before = declared.declared_jobs()
    with pytest.raises(scheduler.InvalidArgument) as caught:
        scheduler.declare_job("thr-declared", "reports.send", throttle=throttle)
    assert caught.value.details["field"] == f"throttle{field}"
    assert declared.declared_jobs() == before


@pytest.fixture
def unregister():
    """A refused registration registers nothing; should one get through, it is undone."""
    yield
    for kind in ("thr.bad.handler", "thr.bad.handler-job"):
        registry.unregister(kind)


@pytest.mark.usefixtures("unregister")
@pytest.mark.parametrize(("label", "throttle", "field"), BAD, ids=IDS)
def test_handler(label, throttle, field):
    kind = "thr.bad.handler"
    with pytest.raises(scheduler.InvalidArgument) as caught:
        scheduler.handler(kind, throttle=throttle)(lambda ctx: None)
    assert caught.value.details["field"] == f"throttle{field}"
    assert registry.get_handler(kind) is None


@pytest.mark.usefixtures("unregister")
@pytest.mark.parametrize(("label", "throttle", "field"), BAD, ids=IDS)
def test_handler_job(label, throttle, field):
    kind = "thr.bad.handler-job"
    before = declared.declared_jobs()
    with pytest.raises(scheduler.InvalidArgument) as caught:
        scheduler.handler(kind, job={"throttle": throttle})(lambda ctx: None)
    assert caught.value.details["field"] == f"job.throttle{field}"
    assert registry.get_handler(kind) is None
    assert declared.declared_jobs() == before


@pytest.mark.parametrize(("label", "throttle", "field"), BAD, ids=IDS)
def test_durable_and_backend_options(label, throttle, field):
    with pytest.raises(scheduler.InvalidArgument) as caught:
        durable(throttle=throttle)
    assert caught.value.details["field"] == f"durable.throttle{field}"
    with pytest.raises(ImproperlyConfigured) as refused:
        DurableBackend("broken", {"OPTIONS": {"throttle": throttle}})
    assert f"['OPTIONS'].throttle{field}" in str(refused.value)


def set_policy(throttle: Any) -> Any:
    return scheduler.set_policy(
        "team", "thr", capabilities=["reports.send"], window=3600, max_runs=5, throttle=throttle
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("label", "throttle", "field"),
    [*BAD, ("a-key", {**GOOD, "key": "{account}"}, ".key")],
    ids=[*IDS, "a-key"],
)
def test_set_policy(clock, label, throttle, field):
    before = everything()
    with pytest.raises(scheduler.InvalidArgument) as caught:
        set_policy(throttle)
    assert caught.value.details["field"] == f"throttle{field}"
    assert everything() == before


@pytest.mark.django_db
def test_set_policy_on_an_existing_policy_writes_nothing(clock):
    set_policy(GOOD)
    before = everything()
    with pytest.raises(scheduler.InvalidArgument):
        set_policy({**GOOD, "key": "{account}"})
    assert everything() == before


@pytest.mark.django_db
def test_good_throttles_are_stored_as_normalized(clock):
    job = scheduler.create_job(
        "thr-ok",
        "reports.send",
        authority=AUTHORITY,
        throttle={"limit": 1_000_000, "period": timedelta(days=31), "burst": 1_000_000, "key": "{a}"},
    )
    assert job.throttle == {
        "limit": 1_000_000,
        "period_ms": 31 * 86_400_000,
        "burst": 1_000_000,
        "key": "{a}",
    }
    job = scheduler.update_job("thr-ok", expected_revision=1, throttle={"limit": 1, "period": 0.001})
    assert job.throttle == {"limit": 1, "period_ms": 1, "burst": 0, "key": None}
    # A stored throttle read back and saved again is taken as it is.
    job = scheduler.update_job("thr-ok", expected_revision=2, throttle={**job.throttle, "burst": 3})
    assert job.throttle == {"limit": 1, "period_ms": 1, "burst": 3, "key": None}
    assert set_policy({"limit": 5, "period": 2, "key": None}).throttle == {
        "limit": 5,
        "period_ms": 2000,
        "burst": 0,
        "key": None,
    }
