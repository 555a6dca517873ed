"""The workers' retention: :class:`RetentionThread` runs a pass (:mod:`.plan`) once per period,
and the record of the last run that the dashboard and ``scheduler_status`` show.

In ``runscheduler``, :class:`RetentionThread` runs it off the claim loop, on a thread with its own
database connection, under the ``retention`` lease (:mod:`..maintenance`): one worker at a time
across hosts, once per period. A thread rather than a step of the loop, because an archive
write to remote storage or a batch waiting on a row lock may take seconds that the loop
would otherwise spend not claiming.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from ... import conf
from ...db import dialect
from ...kernel.authority import budgets
from ...rules.validation import iso_ms
from .. import archive, maintenance, partitions, rollups
from .plan import Plan, PruneResult, apply
from .rules import cutoffs

logger = logging.getLogger("django_durable_scheduler")

LEASE_NAME = "retention"
# How often a worker looks whether a run is due, at most (the period may be shorter).
CHECK_EVERY = 60.0
# How often a worker makes sure the coming days' event partitions exist (partitions.AHEAD ahead).
AHEAD_EVERY = 3600.0
# How often a worker counts the hours that closed for the dashboard (rollups.count_closed_hours).
COUNT_EVERY = 300.0


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _worker_plan(
    settings: conf.Retention, now: datetime, alias: str, held: maintenance.Held, stopping: threading.Event
) -> Plan:
    lease = timedelta(seconds=settings.lease)
    caller_age = settings.ages["caller_keys"]
    job_events_age = settings.ages["job_events"]
    return Plan(
        now=now,
        cutoffs=cutoffs(now, settings),
        job_events=None if job_events_age is None else now - job_events_age,
        caller_keys=None if caller_age is None else now - caller_age,
        protect_keys=True,
        batch_size=settings.batch_size,
        pause=settings.pause,
        sink=archive.sink(alias),
        keep_going=lambda: not stopping.is_set() and held.renew(conf.now(), lease),
        stopping=stopping,
    )


def _audit_budgets(alias: str, result: PruneResult) -> None:
    """Recount the current budget windows (claims trust the usage rows without counting), one
    worker at a time like the rest of this run; a mismatch is marked, so its claims are refused."""
    for check in budgets.audit_budgets(using=alias):
        if not check.matches:
            result.budget_mismatches += 1
            logger.warning("budget usage does not match its reservations: %s", check.describe())


def run_once(
    worker_id: str, *, using: str | None = None, stopping: threading.Event | None = None
) -> PruneResult | None:
    """One retention run by worker ``worker_id``, if retention is on and this worker takes the
    lease (nobody holds it and the period has passed); None otherwise. Logs what it removed
    (INFO) or why it failed (WARNING: the next period tries again), and records either on the
    lease row."""
    settings = conf.settings.RETENTION
    if settings is None:
        return None
    alias = dialect.alias_for(using)
    now = conf.now()
    period = timedelta(seconds=settings.period)
    held = maintenance.take(
        LEASE_NAME, worker_id, now=now, lease=timedelta(seconds=settings.lease), period=period, alias=alias
    )
    if held is None:
        return None
    started = time.monotonic()
    plan = _worker_plan(settings, now, alias, held, stopping or threading.Event())
    result = PruneResult(cutoff=None, dry_run=False, archiving=plan.sink is not None)
    try:
        apply(plan, alias, result)
        _audit_budgets(alias, result)
    except Exception as exc:
        record = {**result.record(time.monotonic() - started), "ok": False, "error": _one_line(exc)}
        logger.warning(
            "retention by %s failed after removing %s: %s; nothing of the failed chunk was deleted, "
            "the next run (in %g s) tries again",
            worker_id,
            result.summary(),
            _one_line(exc),
            settings.period,
        )
        held.release(conf.now(), record)
        return None
    seconds = time.monotonic() - started
    if not held.release(conf.now(), result.record(seconds)):
        logger.warning(
            "retention by %s lost its lease before the end; another worker took it over", worker_id
        )
    if result.removed:
        logger.info("retention by %s removed %s in %.2f s", worker_id, result.summary(), seconds)
    return result


class RetentionThread:
    """The ``dsch-retention`` thread of a worker: looks every ``min(period, CHECK_EVERY)``
    seconds (the first time after a random part of that, so restarted workers spread out)
    whether a retention run is due, and runs it when this worker gets the lease. Retention on
    or off, it also makes the coming days' partitions where history is partitioned by time,
    and counts the hours that closed for the dashboard and ``scheduler_status``, so that their
    readers do not (every worker may: making a partition or counting an hour that is done
    already is nothing)."""

    def __init__(self, worker_id: str, using: str | None = None) -> None:
        self.worker_id = worker_id
        self.using = using
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._ahead_at: float | None = None  # monotonic time of the last partitions.ensure_ahead
        self._counted_at: float | None = None  # and of the last rollups.count_closed_hours

    def start(self) -> None:
        settings = conf.settings.RETENTION
        if settings is None:
            logger.info("retention off (DURABLE_SCHEDULER_RETENTION = None)")
        every = CHECK_EVERY if settings is None else min(settings.period, CHECK_EVERY)
        self._thread = threading.Thread(target=self._run, args=(every,), name="dsch-retention", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current batch (the lease is released with what was done)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, every: float) -> None:
        self._partitions_ahead()
        # The hours are counted at the first look, not at start: a week of them after a
        # deploy takes seconds of the database that the first claims need more.
        wait = every * random.uniform(0.5, 1.0)
        while not self._stopping.wait(wait):
            wait = every
            self._partitions_ahead()
            self._hours_counted()
            if conf.settings.RETENTION is None:
                continue
            try:
                run_once(self.worker_id, using=self.using, stopping=self._stopping)
            except Exception as exc:
                # The lease could not be read or taken (the database is away): next time.
                logger.warning("retention could not start: %s; trying again in %g s", _one_line(exc), every)
            finally:
                # This thread's own connection: not kept open between runs minutes apart.
                connections.close_all()

    def _partitions_ahead(self) -> None:
        """Make the coming days' partitions, at most once per ``AHEAD_EVERY``; a failure (locks
        not had, the database away) is tried again at the next look."""
        if self._ahead_at is not None and time.monotonic() - self._ahead_at < AHEAD_EVERY:
            return
        alias = dialect.alias_for(self.using)
        try:
            made = partitions.ensure_ahead(alias, conf.now())
        except Exception as exc:
            logger.warning(
                "could not make the coming days' event partitions: %s; trying again", _one_line(exc)
            )
            return
        finally:
            connections.close_all()
        self._ahead_at = time.monotonic()
        if made:
            logger.info("made event partitions %s", ", ".join(made))

    def _hours_counted(self) -> None:
        """Count the hours that closed, at most once per ``COUNT_EVERY``; a failure is logged
        and tried again at the next look (a reader counts what is missing meanwhile)."""
        if self._counted_at is not None and time.monotonic() - self._counted_at < COUNT_EVERY:
            return
        try:
            rollups.count_closed_hours(conf.now(), alias=dialect.alias_for(self.using))
        except Exception as exc:
            logger.warning("could not count the hours that closed: %s; trying again", _one_line(exc))
            return
        finally:
            connections.close_all()
        self._counted_at = time.monotonic()


@dataclass
class LastRun:
    """The last retention run, as the dashboard and ``scheduler_status`` show it."""

    enabled: bool
    owner: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    running: bool = False
    result: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "worker": self.owner,
            "started_at": None if self.started_at is None else iso_ms(self.started_at),
            "finished_at": None if self.finished_at is None else iso_ms(self.finished_at),
            "running": self.running,
            "result": self.result,
        }

    def describe(self) -> str:
        """One line for people."""
        if self.started_at is None:
            return "not run yet" if self.enabled else "off"
        text = f"last run {iso_ms(self.started_at)} by {self.owner}"
        result = self.result or {}
        if self.running:
            text += " (running)"
        elif not result.get("ok", False):
            text += f": failed: {result.get('error', 'did not finish')}"
        else:
            by_status = ", ".join(f"{s} {n}" for s, n in (result.get("by_status") or {}).items())
            text += (
                f" ({result.get('seconds', 0):g} s): removed {result.get('occurrences', 0)} occurrences"
                f"{f' ({by_status})' if by_status else ''}, {result.get('events', 0)} events, "
                f"{result.get('reservations', 0)} reservations, {result.get('job_events', 0)} job events"
            )
            if result.get("archived_files"):
                text += f"; archived to {result['archived_files']} files"
        return text if self.enabled else f"off; {text}"


def last_run(alias: str, now: datetime) -> LastRun:
    """The last retention run recorded on database ``alias``."""
    enabled = conf.settings.raw("RETENTION") is not None
    row = maintenance.last_run(LEASE_NAME, alias)
    if row is None:
        return LastRun(enabled)
    running = row.expires_at is not None and row.expires_at > now
    result = row.last_result if isinstance(row.last_result, dict) else None
    return LastRun(enabled, row.owner, row.last_started_at, row.last_finished_at, running, result)
