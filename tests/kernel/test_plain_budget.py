"""What plain work costs: the statements and the Python calls of an occurrence that uses no
batch, chain, limit, unique key, trace or cancel (docs/design.md, "Concurrency limits" says a
claim without limits sends nothing more; the other features pay inside their own branch).

The budget is the table below. A change that adds a statement to plain work, or more calls
than ``CALL_MARGIN``, fails here, naming the operation, the database, the budget and what was
measured; a change that makes plain work cheaper should lower the table. Statements are
counted exactly (every statement sent, transaction control included); calls are cProfile's
count (primitive and recursive) of a fixed number of operations after a warm-up, divided:
deterministic once Django's and the package's caches are warm. The figures are taken in a
process of their own (a fresh pytest run of this module): what earlier tests left in a process
(an OpenTelemetry SDK configured, receivers connected) would change the calls counted.

Set ``DSCH_BUDGET_PRINT=1`` to print what is measured (to update the table), and
``DSCH_BUDGET_PROFILE=<path prefix>`` to write each profile (``pstats``) to study it.
"""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_durable_scheduler as scheduler
from django_durable_scheduler.handlers import registry
from django_durable_scheduler.worker.claims import Claimer
from django_durable_scheduler.worker.heartbeat import Heartbeat
from django_durable_scheduler.worker.loop import Worker
from django_durable_scheduler.worker.outcomes import OutcomeReporter
from django_durable_scheduler.worker.pool import HandlerPool
from django_durable_scheduler.worker.runs import Held

from ..conftest import AUTHORITY

pytestmark = pytest.mark.django_db(transaction=True)

N = 10  # the batch: claimed, settled, held by the heartbeat
CALL_MARGIN = 0.03  # calls may grow this much (a fraction) before the budget fails
KIND = "budget.plain"
WORKER = "w-budget"

# Statements sent, exactly: per plain enqueue (of a job this process enqueued before), per
# claimed batch of N (the worker's claim: plan, claim and authorize), per settled batch of N
# (the outcome reporter's flush), per heartbeat tick with N held (Heartbeat.renew_all).
STATEMENTS: dict[tuple[str, str], int] = {
    ("enqueue", "sqlite"): 4,
    ("enqueue", "postgresql"): 1,
    ("enqueue", "mysql"): 7,
    (f"claim {N}", "sqlite"): 11,
    (f"claim {N}", "postgresql"): 9,
    (f"claim {N}", "mysql"): 11,
    # A pickup: the claim of the one occurrence a wake-up announced (a first claim, one
    # principal). The same statements as a batch's: they do not grow with the batch.
    ("claim 1", "sqlite"): 11,
    ("claim 1", "postgresql"): 9,
    ("claim 1", "mysql"): 11,
    (f"settle {N}", "sqlite"): 6,
    (f"settle {N}", "postgresql"): 6,
    (f"settle {N}", "mysql"): 7,
    # One renewal of everything held (kernel.leases.renew_many): a locking read, one UPDATE and
    # one insert of the events, in one transaction, however many are held.
    (f"heartbeat {N} held", "sqlite"): 5,
    (f"heartbeat {N} held", "postgresql"): 5,
    (f"heartbeat {N} held", "mysql"): 5,
}

# Python function calls: per plain enqueue, per pickup (the worker's claim of one occurrence:
# what a wake-up for one new occurrence waits for), and per drained occurrence (its share of
# the claim of a batch of N, its run made, its handler called through the pool, its share of
# the settle). By database too: each backend's Django code differs.
CALLS: dict[tuple[str, str], int] = {
    ("enqueue", "sqlite"): 1370,
    ("enqueue", "postgresql"): 955,
    ("enqueue", "mysql"): 3664,
    ("claim 1", "sqlite"): 3543,
    ("claim 1", "postgresql"): 3762,
    ("claim 1", "mysql"): 4057,
    ("drained occurrence", "sqlite"): 2012,
    ("drained occurrence", "postgresql"): 2161,
    ("drained occurrence", "mysql"): 2539,
}


VENDOR = connection.vendor


def _plain(ctx):
    return {"ok": True}


@pytest.fixture
def plain(clock):
    """A job of a plain kind, its principal's policy, nothing else; the package's logger
    quiet (what a handler's success logs depends on the logging setup, not on plain work)."""
    registry.handler(KIND)(_plain)
    scheduler.ensure_policy(AUTHORITY)
    scheduler.create_job("budget", KIND, authority=AUTHORITY)
    logger = logging.getLogger("django_durable_scheduler")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield clock
    logger.setLevel(level)
    registry.unregister(KIND)


class _Slots:
    """Trigger keys never used before, so that every enqueue inserts."""

    def __init__(self) -> None:
        self.n = 0

    def enqueue(self, count: int) -> None:
        for _ in range(count):
            self.n += 1
            scheduler.enqueue("budget", scheduled_for=1_700_000_000_000, trigger_key=f"t{self.n}")


class _Worker:
    """The worker's parts, driven by hand: no thread, so that what is counted is the same on
    every run (the handler is called through the pool's own path, on this thread)."""

    def __init__(self) -> None:
        self.held = Held(lambda: None)
        self.pool = HandlerPool(
            concurrency=N,
            held=self.held,
            wake=lambda: None,
            learn=lambda seconds: None,
            sender=Worker,
            worker_id=WORKER,
        )
        self.reporter = OutcomeReporter(held=self.held, worker_id=WORKER, sender=Worker)
        self.claimer = Claimer(
            worker_id=WORKER, lease=60, using=None, held=self.held, pool=self.pool, reporter=self.reporter
        )
        self.heartbeat = Heartbeat(worker_id=WORKER, held=self.held, lease=60, concurrency=N)

    def claim(self) -> None:
        assert len(self.claimer.claim(N, [KIND])) == N

    def run_all(self) -> None:
        while self.pool.queued:
            self.pool._execute(self.pool._queue.get_nowait())

    def run(self) -> None:
        self.run_all()
        assert self.held.finished == N

    def settle(self) -> None:
        self.reporter.flush()
        assert len(self.held) == 0

    def claim_one(self) -> None:
        """A pickup: the worker's claim of the one occurrence a wake-up announced."""
        assert len(self.claimer.claim(1, [KIND])) == 1

    def drain(self) -> None:
        self.claim()
        self.run()
        self.settle()


@contextmanager
def _statements() -> Iterator[list[int]]:
    counted: list[int] = []
    with CaptureQueriesContext(connection) as queries:
        yield counted
    counted.append(len(queries.captured_queries))


def _calls(name: str, operation: Callable[[], None]) -> int:
    profile = cProfile.Profile()
    profile.enable()
    operation()
    profile.disable()
    if os.environ.get("DSCH_BUDGET_PROFILE"):  # where to write each profile, to study it
        profile.dump_stats(f"{os.environ['DSCH_BUDGET_PROFILE']}.{name}.{VENDOR}")
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


def measure() -> tuple[dict[str, int], dict[str, float]]:
    """Every figure of the budget, on the test database: (statements, calls)."""
    slots, worker = _Slots(), _Worker()
    slots.enqueue(1 + N)  # the job remembered, Django's caches warm
    worker.drain()
    statements: dict[str, int] = {}
    calls: dict[str, float] = {}
    with _statements() as counted:
        slots.enqueue(N)
    assert counted[0] % N == 0, counted
    statements["enqueue"] = counted[0] // N
    calls["enqueue"] = _calls("enqueue", lambda: slots.enqueue(N)) / N
    slots.enqueue(N)
    with _statements() as counted:
        worker.claim()
    statements[f"claim {N}"] = counted[0]
    with _statements() as counted:
        worker.heartbeat.renew_all()
    statements[f"heartbeat {N} held"] = counted[0]
    worker.run()
    with _statements() as counted:
        worker.settle()
    statements[f"settle {N}"] = counted[0]
    slots.enqueue(1)
    with _statements() as counted:
        worker.claim_one()
    statements["claim 1"] = counted[0]
    worker.run_all()
    worker.settle()
    slots.enqueue(1)
    calls["claim 1"] = _calls("claim1", worker.claim_one)
    worker.run_all()
    worker.settle()
    slots.enqueue(N)
    calls["drained occurrence"] = _calls("drain", worker.drain) / N
    return statements, calls


FRESH = "DSCH_BUDGET_FRESH"  # set in the process that measures


def test_plain_work_stays_within_its_budget(request):
    """Measured in a fresh pytest process (on a test database of its own, made for it), which
    runs the check below."""
    if os.environ.get(FRESH):
        request.getfixturevalue("plain")
        check_the_budget()
        return
    # A test database of its own: not this xdist worker's, nor this run's.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    env[FRESH] = "1"
    env["DSCH_CHECK_WRITES"] = "0"  # the tests' check of each statement is no part of plain work
    if env.get("DATABASE_URL"):
        url = urlsplit(env["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(url._replace(path=f"{url.path}_budget"))
    here = f"{request.node.path}::{request.node.name}"
    fresh = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-s", here],
        env=env,
        cwd=request.config.rootpath,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fresh.returncode == 0, fresh.stdout[-4000:] + fresh.stderr[-2000:]
    if os.environ.get("DSCH_BUDGET_PRINT"):
        print(fresh.stdout)


def check_the_budget() -> None:
    statements, calls = measure()
    if os.environ.get("DSCH_BUDGET_PRINT"):
        print(f"\n{VENDOR}: statements {statements}, calls {calls}")
    over = [
        f"{operation} on {VENDOR}: {measured} statements, budget {STATEMENTS[operation, VENDOR]}"
        for operation, measured in statements.items()
        if measured > STATEMENTS[operation, VENDOR]
    ]
    over += [
        f"{operation} on {VENDOR}: {measured:.1f} Python calls, budget {CALLS[operation, VENDOR]}"
        f" (+{CALL_MARGIN:.0%})"
        for operation, measured in calls.items()
        if measured > CALLS[operation, VENDOR] * (1 + CALL_MARGIN)
    ]
    assert not over, "plain work grew: " + "; ".join(over)
