"""The soak's world and its mixed load (bench/soak.py): the principals, their policies and the
jobs, then one call at a time of the load's mix, each made as user code makes it.

The mix: one-by-one and bulk enqueues (some due later, a few an hour later, some failing once
or for good), chains (``then`` and ``on_dead_letter``, a job-level ``then`` after them),
batches (``enqueue_batch``, and ``open_batch`` + ``enqueue(batch=)`` + ``close_batch``, some
cancelled), runs under a handler's per-key limit, a job's limit and a principal's
``max_running``, runs of a principal whose budget the load keeps at its limit (a one-minute
window), unique and debounced enqueues, and cancels of waiting and of running occurrences.
The cron and interval jobs run by themselves.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db import Error, connections

import django_durable_scheduler as scheduler
from bench.soakapp.tasks import CUSTOMERS
from django_durable_scheduler import conf
from django_durable_scheduler.rules.validation import to_ms

CAPABILITY = "soak.run"
# principal id -> (window, max_runs, max_units, max_running)
POLICIES: dict[str, tuple[timedelta, int, int, int | None]] = {
    "soak-main": (timedelta(days=1), 1_000_000, 1_000_000, None),
    "soak-capped": (timedelta(days=1), 1_000_000, 1_000_000, 2),
    # A little less than the load offers (about 32 runs of 2 units a minute): the units run out
    # near each window's end, and the rest is deferred to the next.
    "soak-budget": (timedelta(minutes=1), 30, 48, None),
}
JOB_LIMIT = 3  # runs at once of the job "joblimit", every worker together
RETRIES = {"max_attempts": 6, "retry_base_delay": 1, "retry_max_delay": 4}
# job id -> (kind, principal, extra create_job arguments)
JOBS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "chain-c": ("soak.work", "soak-main", {}),
    "chain-b": ("soak.work", "soak-main", {"then": ["chain-c"]}),
    "chain-dl": ("soak.work", "soak-main", {}),
    "batch-done": ("soak.callback", "soak-main", {}),
    "work": ("soak.work", "soak-main", {}),
    "unique": ("soak.work", "soak-main", {}),
    "limited": ("soak.limited", "soak-main", {}),
    "joblimit": ("soak.work", "soak-main", {"concurrency": JOB_LIMIT}),
    "capped": ("soak.work", "soak-capped", {}),
    "budget": ("soak.budget", "soak-budget", {}),
    "cron": ("soak.work", "soak-main", {"trigger": {"cron": "* * * * *"}, "payload": {"ms": 20}}),
    "every": ("soak.work", "soak-main", {"trigger": {"every": 5}, "payload": {"ms": 10}}),
}
SCHEDULED_JOBS = ("cron", "every")


def authority(principal: str) -> dict[str, Any]:
    return {"principal": {"type": "service", "id": principal}, "requestedCapabilities": [CAPABILITY]}


def create_world() -> None:
    """The policies first (so each job is bound to its principal's revision), then the jobs."""
    for principal, (window, runs, units, running) in POLICIES.items():
        scheduler.set_policy(
            "service",
            principal,
            capabilities=[CAPABILITY],
            window=window,
            max_runs=runs,
            max_units=units,
            max_running=running,
        )
    for job_id, (kind, principal, extra) in JOBS.items():
        scheduler.create_job(job_id, kind, authority=authority(principal), **RETRIES, **extra)


class Load:
    """The mixed load, one operation per :meth:`step`. ``enqueued`` holds the id of every
    occurrence an enqueue call returned, which the audit finds stored; ``counts`` what was
    done, ``errors`` what the database refused while it was down."""

    def __init__(self, rng: random.Random, rate: float = 1.0) -> None:
        self.rng = rng
        self.rate = rate
        self.seq = 0
        self.enqueued: set[str] = set()
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.later: list[str] = []  # waiting ones a cancel may reach
        self.long: list[str] = []  # long runs a cancel may reach while they run
        self.ops = (
            (self.one, 6),
            (self.bulk, 1),
            (self.chain, 2),
            (self.batch, 1),
            (self.limited, 2),
            (self.joblimit, 1),
            (self.capped, 1),
            (self.budget, 1),
            (self.unique, 2),
            (self.cancel_waiting, 1),
            (self.cancel_running, 1),
        )

    # --------------------------------------------------------------- helpers

    def _key(self, prefix: str) -> str:
        self.seq += 1
        return f"{prefix}:{self.seq}"

    def _payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"ms": self.rng.choice((0, 5, 20, 50, 150))}
        roll = self.rng.random()
        if roll < 0.03:
            payload["fail"] = "always"
        elif roll < 0.13:
            payload["fail"] = "once"
        return payload

    def _when(self, now: datetime) -> tuple[int, int]:
        """(scheduled_for, available_at) in ms: mostly now, some seconds later, a few an hour later."""
        roll = self.rng.random()
        later = 0 if roll < 0.8 else (3600_000 if roll < 0.82 else self.rng.randint(1_000, 20_000))
        return to_ms(now, "now"), to_ms(now, "now") + later

    def _keep(self, occurrence: Any, available_ms: int, now_ms: int) -> None:
        self.enqueued.add(occurrence.pk)
        if available_ms - now_ms >= 5_000:
            self.later.append(occurrence.pk)

    def step(self) -> None:
        """One operation of the mix; a database that does not answer (the restart) is counted,
        and the connection closed so that the next operation reconnects."""
        operation = self.rng.choices([op for op, _ in self.ops], weights=[w for _, w in self.ops])[0]
        try:
            operation()
            self.counts[operation.__name__] += 1
        except Error as exc:  # DatabaseError, or InterfaceError for a connection the restart closed
            self.errors[type(exc).__name__] += 1
            connections.close_all()
        except scheduler.InvalidState:
            self.counts[f"{operation.__name__} (not waiting any more)"] += 1

    # --------------------------------------------------------------- operations

    def one(self) -> None:
        now = conf.now()
        scheduled, available = self._when(now)
        occurrence, _ = scheduler.enqueue(
            "work",
            scheduled_for=scheduled,
            trigger_key=self._key("one"),
            available_at=available,
            payload=self._payload(),
        )
        self._keep(occurrence, available, scheduled)

    def bulk(self) -> None:
        now = conf.now()
        items = []
        for _ in range(self.rng.randint(10, 40)):
            scheduled, available = self._when(now)
            items.append(
                {
                    "scheduled_for": scheduled,
                    "trigger_key": self._key("bulk"),
                    "available_at": available,
                    "payload": self._payload(),
                }
            )
        for item, (occurrence, _) in zip(items, scheduler.enqueue_many("work", items), strict=True):
            self._keep(occurrence, item["available_at"], item["scheduled_for"])

    def chain(self) -> None:
        """work, then chain-b (whose job adds chain-c), or chain-dl if it is dead-lettered."""
        now_ms = to_ms(conf.now(), "now")
        occurrence, _ = scheduler.enqueue(
            "work",
            scheduled_for=now_ms,
            trigger_key=self._key("chain"),
            payload=self._payload(),
            then=[{"job_id": "chain-b", "payload": {"ms": 5}}],
            on_dead_letter=["chain-dl"],
        )
        self._keep(occurrence, now_ms, now_ms)

    def batch(self) -> None:
        now_ms = to_ms(conf.now(), "now")
        roll = self.rng.random()
        size = self.rng.randint(3, 15)
        if roll < 0.6:
            items = [
                {"scheduled_for": now_ms, "trigger_key": self._key("member"), "payload": self._payload()}
                for _ in range(size)
            ]
            batch, members = scheduler.enqueue_batch("work", items, callback="batch-done")
            for occurrence, _ in members:
                self._keep(occurrence, now_ms, now_ms)
            return
        batch = scheduler.open_batch("batch-done", description="soak")
        # The batches to be cancelled have their members wait a little: something to cancel.
        delay = 10_000 if roll > 0.85 else 0
        for _ in range(size):
            occurrence, _ = scheduler.enqueue(
                "work",
                scheduled_for=now_ms,
                trigger_key=self._key("member"),
                available_at=now_ms + delay,
                payload=self._payload(),
                batch=batch.batch_id,
            )
            self._keep(occurrence, now_ms, now_ms)
        if delay:
            scheduler.cancel_batch(batch.batch_id, reason="soak", requested_by="soak")
            self.counts["batch cancelled"] += 1
        else:
            scheduler.close_batch(batch.batch_id)

    def _simple(self, job_id: str, payload: dict[str, Any]) -> None:
        now_ms = to_ms(conf.now(), "now")
        occurrence, _ = scheduler.enqueue(
            job_id, scheduled_for=now_ms, trigger_key=self._key(job_id), payload=payload
        )
        self._keep(occurrence, now_ms, now_ms)

    # The limited runs come in bursts, so that their limits bind.

    def limited(self) -> None:
        customer = self.rng.choice(CUSTOMERS)
        for _ in range(self.rng.randint(2, 6)):
            self._simple("limited", {"customer": customer, "ms": self.rng.randint(50, 400)})

    def joblimit(self) -> None:
        for _ in range(self.rng.randint(2, 6)):
            self._simple("joblimit", {"ms": self.rng.randint(50, 400)})

    def capped(self) -> None:
        for _ in range(self.rng.randint(2, 5)):
            self._simple("capped", {"ms": self.rng.randint(50, 400)})

    def budget(self) -> None:
        self._simple("budget", {"ms": 5})

    def unique(self) -> None:
        """One waiting per key: a key either returns the waiting one or (debounced) moves it."""
        now_ms = to_ms(conf.now(), "now")
        key = f"u{self.rng.randint(0, 3)}"
        options: dict[str, Any] = (
            {"debounce": 2} if self.rng.random() < 0.5 else {"available_at": now_ms + 2_000}
        )
        occurrence, _ = scheduler.enqueue(
            "unique",
            scheduled_for=now_ms,
            trigger_key=self._key("unique"),
            payload={"ms": 5, "n": self.seq},
            unique_key=key,
            **options,
        )
        self.enqueued.add(occurrence.pk)

    def cancel_waiting(self) -> None:
        if self.later:
            scheduler.cancel(self.later.pop(self.rng.randrange(len(self.later))), reason="soak")

    def cancel_running(self) -> None:
        """A long run, then a cancel of an earlier one (running by now, or already over)."""
        now_ms = to_ms(conf.now(), "now")
        occurrence, _ = scheduler.enqueue(
            "work", scheduled_for=now_ms, trigger_key=self._key("long"), payload={"ms": 4_000}
        )
        self._keep(occurrence, now_ms, now_ms)
        self.long.append(occurrence.pk)
        if len(self.long) > 3:
            scheduler.cancel(self.long.pop(0), reason="soak", requested_by="soak")
