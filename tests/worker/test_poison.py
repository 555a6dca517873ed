"""Outcomes the database cannot store fail their own occurrence, never the worker: results and
error text are checked and repaired before the settle, and a batch the database refuses is
settled one by one, so the others of the batch settle and the loop goes on."""

from __future__ import annotations

import contextlib
import logging
import math

import pytest
from django.db import DataError, OperationalError, connection

import django_durable_scheduler as scheduler
from django_durable_scheduler import kernel
from django_durable_scheduler.exceptions import InvalidArgument
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.rules.outcomes import MAX_ERROR_MESSAGE, MAX_TRACEBACK, storable_text
from django_durable_scheduler.worker import Worker, outcomes
from django_durable_scheduler.worker.outcomes import OutcomeReporter
from django_durable_scheduler.worker.runs import Held, Run

from ..conftest import AUTHORITY
from ..procs.runner import Workers

pytestmark = pytest.mark.django_db(transaction=True)

LOG = "django_durable_scheduler"


def enqueue(job_id: str, modes: list[str], max_attempts: int = 3) -> list[Occurrence]:
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job(job_id, "test.poison", authority=AUTHORITY, max_attempts=max_attempts)
    return [
        scheduler.enqueue(
            job_id, scheduled_for=1_700_000_000_000 + i, trigger_key=f"t{i}", payload={"mode": mode}
        )[0]
        for i, mode in enumerate(modes)
    ]


# --------------------------------------------------------------------------- a real worker


@pytest.fixture
def workers(tmp_path):
    spawned = Workers(tmp_path)
    yield spawned
    spawned.cleanup()


@pytest.mark.slow
def test_runscheduler_fails_each_poison_outcome_alone_and_runs_the_rest(workers):
    good = enqueue(
        "results", ["ok"] * 6 + ["nul-result", "nul-key", "huge-result", "deep-result", "set-result"]
    )
    errors = enqueue("errors", ["ok", "nul-error", "long-error", "nul-permanent", "ok"], max_attempts=1)
    worker = workers.start("--burst", "--concurrency", "16", "--worker-id", "poison")
    assert worker.wait(180) == 0, worker.output()
    log = worker.output(100_000)
    assert "database error" not in log, log
    rows = {row.pk: row for row in Occurrence.objects.all()}
    mode = {occ.pk: occ.payload["mode"] for occ in good + errors}

    for pk, row in rows.items():
        if mode[pk] == "ok":
            assert (row.status, row.result) == ("succeeded", {"mode": "ok", "occurrence": pk})
    reasons = {
        "nul-result": "NUL character",
        "nul-key": "NUL character",
        "huge-result": "byte limit",
        "deep-result": "nested deeper",
        "set-result": "not a JSON value",
    }
    for pk, row in rows.items():
        if mode[pk] in reasons:
            # Dead-lettered at once: the handler would return the same result again.
            assert (row.status, row.attempt, row.result) == ("dead_letter", 1, None)
            assert row.last_error["type"] == "InvalidResult"
            message = row.last_error["message"]
            assert message.startswith("the handler's result could not be stored: result: "), message
            assert reasons[mode[pk]] in message
    by_mode = {mode[pk]: row for pk, row in rows.items()}
    nul = by_mode["nul-error"].last_error
    assert (by_mode["nul-error"].status, nul["type"], nul["message"]) == (
        "dead_letter",
        "RuntimeError",
        "bad\ufffdmessage",
    )
    assert "RuntimeError" in nul["traceback"]
    long = by_mode["long-error"].last_error
    assert long["message"].startswith("?éé") and long["message"].endswith(" [truncated]")
    assert len(long["message"].encode()) <= MAX_ERROR_MESSAGE and long["message_truncated"] is True
    permanent = by_mode["nul-permanent"]
    assert permanent.status == "dead_letter"
    assert permanent.last_error == {
        "type": "PermanentFailure",
        "message": "never\ufffdworks",
        "code": "E\ufffdNUL",
    }


# --------------------------------------------------------------------------- the fallback


@pytest.fixture
def reporter():
    registry.autodiscover()
    return OutcomeReporter(held=Held(lambda: None), worker_id="w-poison", sender=Worker)


def hold(reporter: OutcomeReporter, outcomes: list[dict]) -> list:
    """Claim one occurrence per outcome and hand each its outcome, as if its handler had run."""
    occurrences = enqueue("held", ["ok"] * len(outcomes))
    claimed = {row.pk: row for row in kernel.claim_batch(owner=reporter.worker_id, lease=60, limit=50)}
    owner = reporter.worker_id
    runs = [Run.of(claimed[occ.pk], owner=owner, using=None, default_timeout=None) for occ in occurrences]
    reporter.held.add(runs)
    for run, outcome in zip(runs, outcomes, strict=True):
        reporter.held.finish(run, kernel.Outcome(run.occurrence.pk, run.occurrence.fence, **outcome))
    return [run.occurrence.pk for run in runs]


def settled_all(held: Held) -> bool:
    """Nothing held (so nothing renewed) and no outcome waiting for a settle."""
    return len(held) == 0 and held.finished == 0


@contextlib.contextmanager
def refusing(marker: str):
    """The database refuses every statement whose parameters hold ``marker`` (the error's
    own text does not hold it, as a real refusal's need not)."""

    def refuse(execute, sql, params, many, context):
        if marker in repr(params):
            raise DataError("this database refuses the value")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse):
        yield


def statuses(ids):
    return [Occurrence.objects.get(pk=pk).status for pk in ids]


def test_a_batch_the_database_refuses_is_settled_one_by_one(reporter, caplog):
    marker = "refused-by-the-database"
    ids = hold(
        reporter,
        [
            {"status": "succeeded", "result": {"n": 1}},
            {"status": "succeeded", "result": {"value": marker}},
            {"status": "failed", "error": RuntimeError("boom")},
            {"status": "succeeded", "result": {"n": 3}},
        ],
    )
    with caplog.at_level(logging.INFO, logger=LOG), refusing(marker):
        reporter.flush()
    assert statuses(ids) == ["succeeded", "dead_letter", "retry_wait", "succeeded"]
    assert [Occurrence.objects.get(pk=pk).result for pk in (ids[0], ids[3])] == [{"n": 1}, {"n": 3}]
    poison = Occurrence.objects.get(pk=ids[1])
    assert poison.last_error == {
        "type": "UnstorableOutcome",
        "message": "the handler's outcome could not be stored: DataError: this database refuses the value",
    }
    assert Occurrence.objects.get(pk=ids[2]).last_error == {"type": "RuntimeError", "message": "boom"}
    assert settled_all(reporter.held)
    fallbacks = [r for r in caplog.records if "settling them one by one" in r.getMessage()]
    assert len(fallbacks) == 1, caplog.text


def test_an_occurrence_whose_failure_is_refused_too_is_left_to_its_lease(reporter, caplog, clock):
    ids = hold(reporter, [{"status": "succeeded", "result": n} for n in range(3)])
    with caplog.at_level(logging.INFO, logger=LOG), refusing(ids[1]):  # every write of one row
        reporter.flush()
    assert statuses(ids) == ["succeeded", "running", "succeeded"]
    assert settled_all(reporter.held)  # no longer renewed, not retried
    given_up = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(given_up) == 1, caplog.text
    assert ids[1] in given_up[0].getMessage() and "expire" in given_up[0].getMessage()
    # Its lease expires as a crashed worker's would, and another worker takes it.
    clock.advance(61)
    again = kernel.claim(owner="other", lease=10)
    assert again is not None and (again.pk, again.attempt, again.fence) == (ids[1], 2, 2)


def test_outcomes_wait_while_the_database_does_not_answer(reporter, monkeypatch):
    ids = hold(reporter, [{"status": "succeeded", "result": n} for n in range(3)])
    monkeypatch.setattr(outcomes, "database_answers", lambda using: False)

    def down(execute, sql, params, many, context):
        raise OperationalError("server closed the connection unexpectedly")

    with connection.execute_wrapper(down), pytest.raises(OperationalError):
        reporter.flush()
    # An outage is nobody's fault: every outcome is kept, and the next turn settles them.
    assert statuses(ids) == ["running"] * 3
    assert reporter.held.finished == 3 and len(reporter.held) == 3
    reporter.flush()
    assert statuses(ids) == ["succeeded"] * 3
    assert settled_all(reporter.held)


def test_a_result_the_worker_lets_through_but_settle_refuses_fails_alone(reporter, monkeypatch):
    # As if the worker's own check had missed it: settle's input contract refuses the NUL.
    monkeypatch.setattr(kernel, "storable_result", lambda result: result)
    ids = hold(
        reporter,
        [
            {"status": "succeeded", "result": "fine"},
            {"status": "succeeded", "result": {"text": "a\x00b"}},
            {"status": "succeeded", "result": "also fine"},
        ],
    )
    reporter.flush()
    assert statuses(ids) == ["succeeded", "dead_letter", "succeeded"]
    error = Occurrence.objects.get(pk=ids[1]).last_error
    assert error["type"] == "UnstorableOutcome"
    assert error["message"].startswith("the handler's outcome could not be stored: ")


def test_bad_outcomes_are_failed_before_the_settle(reporter, caplog):
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    ids = hold(
        reporter,
        [
            {"status": "succeeded", "result": float("nan")},
            {"status": "succeeded", "result": ["ok"]},
            {"status": "failed", "error": Unprintable()},
            {"status": "failed", "error": {"message": "x\x00y", "code": {1, 2}}, "retryable": False},
            {"status": "failed", "error": {"type": "Retry"}, "retry_at": 12.5},
        ],
    )
    with caplog.at_level(logging.INFO, logger=LOG):
        reporter.flush()
    assert "one by one" not in caplog.text  # one batch: nothing reached the database unchecked
    rows = [Occurrence.objects.get(pk=pk) for pk in ids]
    assert [row.status for row in rows] == [
        "dead_letter",
        "succeeded",
        "retry_wait",
        "dead_letter",
        "dead_letter",
    ]
    assert rows[0].last_error["type"] == "InvalidResult" and "NaN" in rows[0].last_error["message"]
    assert rows[2].last_error == {"type": "Unprintable", "message": "<unprintable Unprintable>"}
    assert rows[3].last_error == {"message": "x\ufffdy", "code": "{1, 2}"}
    assert rows[4].last_error["type"] == "InvalidRetry"
    assert rows[4].last_error["message"].startswith("the handler's Retry could not be scheduled: Retry.at")


# --------------------------------------------------------------------------- storable values


def test_storable_text_repairs_and_cuts_with_a_marker():
    assert storable_text("a\x00b\ud800c", 100) == ("a\ufffdb?c", False)
    text, cut = storable_text("é" * 5000, MAX_ERROR_MESSAGE)
    assert cut and text.endswith(" [truncated]") and text.startswith("éé")
    assert len(text.encode()) <= MAX_ERROR_MESSAGE
    tail, cut = storable_text("x" * 20_000 + "the end", MAX_TRACEBACK, keep_end=True)
    assert cut and tail.startswith("[truncated] ") and tail.endswith("the end")
    assert len(tail.encode()) <= MAX_TRACEBACK


def test_storable_error_never_raises():
    assert kernel.storable_error("plain") == {"message": "plain"}
    assert kernel.storable_error(ValueError("a\x00")) == {"type": "ValueError", "message": "a\ufffd"}
    nested = kernel.storable_error({"message": "m", "details": {"k\x00": [math.inf, 2**80, None]}})
    assert nested == {"message": "m", "details": {"k\ufffd": ["inf", repr(2**80), None]}}
    huge = kernel.storable_error({"type": "T", "message": "m", "details": ["y" * 4000] * 40})
    assert huge == {"type": "T", "message": "m", "error_truncated": True}
    assert kernel.storable_error(42) == {"message": 42}


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        ({"a": ["b\x00"]}, "NUL character"),
        ({"k\x00": 1}, "NUL character"),
        ("x" * (64 * 1024), "byte limit"),
        ({1, 2}, "not a JSON value"),
        ("\udc00", "lone surrogate"),
    ],
)
def test_storable_result_refuses_what_cannot_be_stored(result, reason):
    with pytest.raises(InvalidArgument) as info:
        kernel.storable_result(result)
    assert info.value.field == "result" and reason in str(info.value)
    assert kernel.storable_result({"ok": [1, "two"]}) == {"ok": [1, "two"]}
