"""Bad input to every helper of ``django_durable_scheduler.testing``: an ``InvalidArgument``
naming the argument, and nothing written."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

import django_durable_scheduler as scheduler
from django_durable_scheduler import testing
from django_durable_scheduler.exceptions import InvalidArgument

from ..conftest import snapshot
from .conftest import START

NAIVE = datetime(2026, 3, 23, 12, 0)
# The helpers as untyped code calls them: what a type checker would refuse reaches them.
helpers: Any = testing

CALLS = {
    # drain
    "drain max_runs 0": (lambda: helpers.drain(max_runs=0), "max_runs"),
    "drain max_runs text": (lambda: helpers.drain(max_runs="2"), "max_runs"),
    "drain kinds text": (lambda: helpers.drain(kinds="test.ok"), "kinds"),
    "drain kinds empty": (lambda: helpers.drain(kinds=[]), "kinds"),
    "drain kinds unknown": (lambda: helpers.drain(kinds=["t.nobody"]), "kinds"),
    "drain kinds not identifiers": (lambda: helpers.drain(kinds=[""]), "kinds[0]"),
    "drain lease": (lambda: helpers.drain(lease=0), "lease"),
    "drain using": (lambda: helpers.drain(using=3), "using"),
    # enqueued and the assertions
    "enqueued job": (lambda: helpers.enqueued(job=""), "job"),
    "enqueued kind": (lambda: helpers.enqueued(kind=5), "kind"),
    "enqueued payload_contains": (lambda: helpers.enqueued(payload_contains=[1]), "payload_contains"),
    "enqueued scheduled_for naive": (lambda: helpers.enqueued(scheduled_for=NAIVE), "scheduled_for"),
    "enqueued scheduled_for text": (lambda: helpers.enqueued(scheduled_for="2026-01-01"), "scheduled_for"),
    "enqueued unique_key": (lambda: helpers.enqueued(unique_key=""), "unique_key"),
    "enqueued trigger_key": (lambda: helpers.enqueued(trigger_key=1), "trigger_key"),
    "enqueued batch": (lambda: helpers.enqueued(batch=""), "batch"),
    "enqueued status": (lambda: helpers.enqueued(status="waiting"), "status"),
    "enqueued status empty": (lambda: helpers.enqueued(status=[]), "status"),
    "assert_enqueued count": (lambda: helpers.assert_enqueued(count=-1), "count"),
    "assert_enqueued filter": (lambda: helpers.assert_enqueued(job=""), "job"),
    "assert_not_enqueued filter": (lambda: helpers.assert_not_enqueued(status="x"), "status"),
    # the clock
    "clock naive": (lambda: helpers.clock(NAIVE).__enter__(), "at"),
    "Clock text": (lambda: helpers.Clock("2026-01-01T00:00:00Z"), "at"),
    "advance negative": (lambda: helpers.Clock(START).advance(hours=-1), "hours"),
    "advance negative delta": (lambda: helpers.Clock(START).advance(timedelta(seconds=-1)), "delta"),
    "advance unknown unit": (lambda: helpers.Clock(START).advance(years=1), "years"),
    "advance not a number": (lambda: helpers.Clock(START).advance(minutes="5"), "minutes"),
    "advance delta text": (lambda: helpers.Clock(START).advance("5"), "delta"),
    "set naive": (lambda: helpers.Clock(START).set(NAIVE), "at"),
    # run_handler
    "run_handler kind": (lambda: helpers.run_handler("t.nobody"), "kind"),
    "run_handler kind type": (lambda: helpers.run_handler(None), "kind"),
    "run_handler payload": (lambda: helpers.run_handler("test.ok", {1, 2}), "payload"),
    "run_handler attempt 0": (lambda: helpers.run_handler("test.ok", attempt=0), "attempt"),
    "run_handler attempt past max": (
        lambda: helpers.run_handler("test.ok", attempt=4, max_attempts=3),
        "attempt",
    ),
    "run_handler max_attempts": (lambda: helpers.run_handler("test.ok", max_attempts=0), "max_attempts"),
    "run_handler fence": (lambda: helpers.run_handler("test.ok", fence=0), "fence"),
    "run_handler job_id": (lambda: helpers.run_handler("test.ok", job_id=""), "job_id"),
    "run_handler authority": (lambda: helpers.run_handler("test.ok", authority={"x": 1}), "authority.x"),
    "run_handler scheduled_for": (
        lambda: helpers.run_handler("test.ok", scheduled_for=NAIVE),
        "scheduled_for",
    ),
    "run_handler predecessor": (lambda: helpers.run_handler("test.ok", predecessor="x"), "predecessor"),
    "run_handler batch": (lambda: helpers.run_handler("test.ok", batch=[1]), "batch"),
    "run_handler both causes": (lambda: helpers.run_handler("test.ok", predecessor={}, batch={}), "batch"),
    "run_handler cancel_requested": (
        lambda: helpers.run_handler("test.ok", cancel_requested=1),
        "cancel_requested",
    ),
    # grant
    "grant principal label": (lambda: helpers.grant("billing", "x.y"), "principal"),
    "grant principal type": (lambda: helpers.grant(42, "x.y"), "principal"),
    "grant no capability": (lambda: helpers.grant("team:billing"), "capabilities"),
    "grant capability": (lambda: helpers.grant("team:billing", ""), "capabilities[0]"),
    "grant runs": (lambda: helpers.grant("team:billing", "x.y", runs=0), "runs"),
    "grant units": (lambda: helpers.grant("team:billing", "x.y", units=-1), "units"),
    "grant window": (lambda: helpers.grant("team:billing", "x.y", window="1h"), "window"),
    "grant max_running": (lambda: helpers.grant("team:billing", "x.y", max_running=0), "max_running"),
}


@pytest.mark.parametrize("call, field", CALLS.values(), ids=CALLS.keys())
def test_bad_input_is_refused_naming_the_argument(db, call, field):
    scheduler.create_job("ok", "test.ok")
    scheduler.enqueue("ok", scheduled_for=START, trigger_key="k")
    before = snapshot()
    with pytest.raises(InvalidArgument) as refused:
        call()
    assert refused.value.details["field"] == field, refused.value
    assert field in str(refused.value)
    assert snapshot() == before
