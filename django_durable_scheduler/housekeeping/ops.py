"""Operating the scheduler: the health report behind ``manage.py scheduler_status`` and the
pruning behind ``manage.py scheduler_prune``. The commands only parse options and print.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Case, Count, F, Min, Q, When

from .. import conf
from ..db import dialect
from ..kernel.authority.binding import jobs_without_policy
from ..models import (
    ACTIVE_STATUSES,
    PENDING_STATUSES,
    AuthorityPolicy,
    AuthorityUsage,
    Batch,
    BatchStatus,
    Occurrence,
    OccurrenceStatus,
    PausedKind,
    WorkerHeartbeat,
)
from ..rules.authority import Principal
from ..rules.validation import from_ms, iso_ms, to_ms
from . import rollups
from .retention import plan as retention_plan
from .retention.thread import LastRun, last_run

DEFAULT_STALE_AFTER = timedelta(seconds=60)
# The status counts settled occurrences (succeeded, dead_letter, cancelled) of this last span.
SETTLED_COUNTED = timedelta(days=1)
DEFAULT_MAX_LAG = timedelta(seconds=300)
# A policy is "near its budget" when the current window used this share of runs or units.
NEAR_BUDGET_PERCENT = 80
STALLED_LOOKED_AT = 20  # closed batches the status probes for members still live
DEFAULT_PRUNE_BATCH = 500
MAX_PRUNE_BATCH = 10_000
MAX_DURATION = timedelta(days=36_500)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


# --------------------------------------------------------------------------- durations


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s`` or plain seconds; ``ValueError`` otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"expected a duration such as 30d, 12h, 90m, 3600s or plain seconds, not {text!r}")
    seconds = float(match[1]) * _UNIT_SECONDS[match[2].lower()]
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"must be at most {MAX_DURATION.days} days, not {text!r}")
    return timedelta(seconds=seconds)


def duration_argument(text: str) -> timedelta:
    """An argparse ``type`` for :func:`parse_duration`."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def first_line(exc: BaseException) -> str:
    """An exception's message on one line (database errors can span several)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _seconds(value: timedelta) -> float:
    return round(value.total_seconds(), 3)


# --------------------------------------------------------------------------- status


@dataclass
class WorkerState:
    worker_id: str
    hostname: str
    pid: int
    concurrency: int
    kinds: list[str]
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    age: timedelta  # since the last heartbeat

    def as_json(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "host": self.hostname,
            "pid": self.pid,
            "concurrency": self.concurrency,
            "kinds": self.kinds,
            "started_at": iso_ms(self.started_at),
            "last_seen_at": iso_ms(self.last_seen_at),
            "stopped_at": None if self.stopped_at is None else iso_ms(self.stopped_at),
            "age_seconds": _seconds(self.age),
        }


@dataclass
class KindBacklog:
    """Occurrences of one kind that no live worker has a handler for."""

    kind: str
    waiting: int  # queued or retry_wait, due or not
    due: int  # due now (including running ones whose lease expired)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "waiting": self.waiting, "due": self.due}


@dataclass
class PausedBacklog:
    """A paused kind (``kernel/pausing.py``) and its occurrences that wait for the resume."""

    kind: str
    paused_at: datetime
    paused_by: str
    waiting: int  # queued or retry_wait, due or not
    due: int  # due now (including running ones whose lease expired): paused, not late

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "paused_at": iso_ms(self.paused_at),
            "paused_by": self.paused_by,
            "waiting": self.waiting,
            "due": self.due,
        }


@dataclass
class BudgetUsage:
    principal_type: str
    principal_id: str
    policy_revision: int
    window_started_at: datetime
    window_ends_at: datetime
    runs: int
    max_runs: int | None  # None: no limit
    units: int
    max_units: int | None

    @property
    def held(self) -> bool:
        """Whether the window's runs or units are spent: the principal's claims wait until
        ``window_ends_at``."""
        return (self.max_runs is not None and self.runs >= self.max_runs) or (
            self.max_units is not None and self.units >= self.max_units
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "principal": Principal.of_row(self).as_dict(),
            "policy_revision": self.policy_revision,
            "window_started_at": iso_ms(self.window_started_at),
            "window_ends_at": iso_ms(self.window_ends_at),
            "runs": self.runs,
            "max_runs": self.max_runs,
            "units": self.units,
            "max_units": self.max_units,
        }


@dataclass
class Status:
    now: datetime
    counts: dict[str, int]
    due: int
    oldest_due_at: datetime | None
    live_workers: list[WorkerState]
    stale_workers: list[WorkerState]
    stopped_workers: int
    unhandled: list[KindBacklog]
    near_budget: list[BudgetUsage]
    disabled_waiting: int
    # Enabled jobs whose principal has no policy (every run denied), by "type:id".
    without_policy: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # The workers' last retention run (retention/thread.py).
    last_retention: LastRun = field(default_factory=lambda: LastRun(enabled=False))
    # Batches not completed, by status (open, closed), and the closed ones with no live
    # member left whose completion is overdue (batches.py: a worker's sweep completes them).
    batches: dict[str, int] = field(default_factory=dict)
    stalled_batches: list[str] = field(default_factory=list)
    # The paused kinds, whose work waits by design: counted here, not as due, late or unhandled.
    paused: list[PausedBacklog] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def oldest_due_lag(self) -> timedelta | None:
        return None if self.oldest_due_at is None else self.now - self.oldest_due_at

    def as_json(self) -> dict[str, Any]:
        lag = self.oldest_due_lag
        return {
            "healthy": self.healthy,
            "problems": self.problems,
            "now": iso_ms(self.now),
            "counts": self.counts,
            "due": self.due,
            "oldest_due_at": None if self.oldest_due_at is None else iso_ms(self.oldest_due_at),
            "oldest_due_lag_seconds": None if lag is None else _seconds(lag),
            "live_workers": [w.as_json() for w in self.live_workers],
            "stale_workers": [w.as_json() for w in self.stale_workers],
            "stopped_workers": self.stopped_workers,
            "unhandled_kinds": [k.as_json() for k in self.unhandled],
            "near_budget": [b.as_json() for b in self.near_budget],
            "disabled_waiting": self.disabled_waiting,
            "jobs_without_policy": self.without_policy,
            "retention": self.last_retention.as_json(),
            "batches": self.batches,
            "stalled_batches": self.stalled_batches,
            "paused_kinds": [p.as_json() for p in self.paused],
        }


def _due(now: datetime) -> Q:
    # What a worker would claim now (claiming.has_due), and the final-attempt lease
    # expiries too: those are work as well (the next claim dead-letters them).
    return Q(status__in=PENDING_STATUSES, available_at__lte=now) | Q(
        status=OccurrenceStatus.RUNNING, lease_expires_at__lte=now
    )


def _due_at() -> Case:
    return Case(When(status=OccurrenceStatus.RUNNING, then=F("lease_expires_at")), default=F("available_at"))


def _workers(
    now: datetime, stale_after: timedelta, alias: str
) -> tuple[list[WorkerState], list[WorkerState], int]:
    live: list[WorkerState] = []
    stale: list[WorkerState] = []
    stopped = 0
    for row in WorkerHeartbeat.objects.using(alias).order_by("worker_id"):
        if row.stopped_at is not None:
            stopped += 1
            continue
        kinds = [k for k in row.kinds if isinstance(k, str)] if isinstance(row.kinds, list) else []
        state = WorkerState(
            worker_id=row.worker_id,
            hostname=row.hostname,
            pid=row.pid,
            concurrency=row.concurrency,
            kinds=sorted(kinds),
            started_at=row.started_at,
            last_seen_at=row.last_seen_at,
            stopped_at=row.stopped_at,
            age=now - row.last_seen_at,
        )
        (live if state.age <= stale_after else stale).append(state)
    return live, stale, stopped


def _limit(limit: int | None) -> str:
    return "no limit" if limit is None else str(limit)


def _used(used: int, limit: int | None, percent: int) -> bool:
    return limit is not None and used * 100 >= limit * percent


def budget_usage(now: datetime, percent: int, alias: str) -> list[BudgetUsage]:
    """Enabled policies with a budget whose current window used ``percent`` % of its runs or
    units (0: every one with usage in the window)."""
    by_window: dict[int, list[AuthorityPolicy]] = defaultdict(list)
    budgeted = Q(max_runs__isnull=False) | Q(max_units__isnull=False)
    for policy in AuthorityPolicy.objects.using(alias).filter(budgeted, enabled=True):
        by_window[policy.window_ms].append(policy)
    now_ms = to_ms(now, "now")
    found: list[BudgetUsage] = []
    # One query per window length (there are few), not one per principal.
    for window_ms, policies in sorted(by_window.items()):
        start_ms = now_ms // window_ms * window_ms
        start = from_ms(start_ms)
        usage = {
            (u.principal_type, u.principal_id, u.policy_revision): u
            for u in AuthorityUsage.objects.using(alias).filter(window_started_at=start)
        }
        for policy in policies:
            row = usage.get((policy.principal_type, policy.principal_id, policy.revision))
            if row is None:
                continue
            if _used(row.runs, policy.max_runs, percent) or _used(row.units, policy.max_units, percent):
                found.append(
                    BudgetUsage(
                        principal_type=policy.principal_type,
                        principal_id=policy.principal_id,
                        policy_revision=policy.revision,
                        window_started_at=start,
                        window_ends_at=from_ms(start_ms + window_ms),
                        runs=row.runs,
                        max_runs=policy.max_runs,
                        units=row.units,
                        max_units=policy.max_units,
                    )
                )
    found.sort(key=lambda b: (b.principal_type, b.principal_id))
    return found


def collect_status(
    *,
    stale_after: timedelta = DEFAULT_STALE_AFTER,
    max_lag: timedelta = DEFAULT_MAX_LAG,
    budget_percent: int = NEAR_BUDGET_PERCENT,
    using: str | None = None,
) -> Status:
    """The scheduler's health as the status command reports it.

    Unhealthy (``problems`` non-empty) when there is due work and no live worker, when the
    oldest due occurrence has waited longer than ``max_lag``, or when due work is of a kind
    that no live worker has a handler for. Occurrences of disabled jobs and of paused kinds
    wait by design and count for none of these (``disabled_waiting`` and ``paused`` count them).
    """
    alias = dialect.alias_for(using)
    now = conf.now()
    occurrences = Occurrence.objects.using(alias)
    counts = {status.value: 0 for status in OccurrenceStatus}
    # One pass over the occurrences not yet settled, grouped by job and status: the counts by
    # status, what is due and waiting per job (the jobs' kinds and enabled flags looked up
    # once, not joined per row).
    active = list(
        occurrences.filter(status__in=[*PENDING_STATUSES, OccurrenceStatus.RUNNING])
        .values_list("job_id", "status")
        .annotate(n=Count("pk"), due=Count("pk", filter=_due(now)), oldest=Min(_due_at(), filter=_due(now)))
        .order_by()
    )
    jobs = rollups.job_kinds([job_id for job_id, *_ in active], alias)
    paused = _paused(alias)
    due_by_kind: dict[str, int] = {}
    waiting_by_kind: dict[str, int] = {}
    disabled_waiting = 0
    oldest: datetime | None = None
    for job_id, status_name, n, due, job_oldest in active:
        counts[status_name] += n
        kind, enabled = jobs[job_id]
        if not enabled:
            disabled_waiting += n if status_name in PENDING_STATUSES else 0
            continue
        if kind in paused:
            paused[kind].waiting += n if status_name in PENDING_STATUSES else 0
            paused[kind].due += due
            continue
        if status_name in PENDING_STATUSES:
            waiting_by_kind[kind] = waiting_by_kind.get(kind, 0) + n
        if due:
            due_by_kind[kind] = due_by_kind.get(kind, 0) + due
            oldest = job_oldest if oldest is None else min(oldest, job_oldest)
    # Settled ones over the last day only: a count over all history would read the whole table.
    for (_, status_name), n in rollups.outcomes_through(now - SETTLED_COUNTED, now, alias=alias).items():
        counts[status_name] += n
    live, stale, stopped = _workers(now, stale_after, alias)
    handled = {kind for worker in live for kind in worker.kinds}
    unhandled = [
        KindBacklog(kind, waiting_by_kind.get(kind, 0), due_by_kind.get(kind, 0))
        for kind in sorted(set(due_by_kind) | set(waiting_by_kind))
        if kind not in handled
    ]
    status = Status(
        now=now,
        counts=counts,
        due=sum(due_by_kind.values()),
        oldest_due_at=oldest,
        live_workers=live,
        stale_workers=stale,
        stopped_workers=stopped,
        unhandled=unhandled,
        near_budget=budget_usage(now, budget_percent, alias),
        disabled_waiting=disabled_waiting,
        without_policy={
            principal.label: jobs for principal, jobs in jobs_without_policy(using=alias).items()
        },
        last_retention=last_run(alias, now),
        paused=list(paused.values()),
    )
    status.batches, status.stalled_batches = _batches(now - max_lag, alias)
    status.problems.extend(_problems(status, max_lag))
    return status


def _paused(alias: str) -> dict[str, PausedBacklog]:
    """The paused kinds, by kind, their waiting work not counted yet."""
    rows = PausedKind.objects.using(alias)
    return {row.kind: PausedBacklog(row.kind, row.paused_at, row.paused_by, 0, 0) for row in rows}


def _problems(status: Status, max_lag: timedelta) -> list[str]:
    """What makes ``status`` unhealthy, one line each."""
    problems = []
    if status.due and not status.live_workers:
        problems.append(f"no live worker while {status.due} occurrence(s) are due")
    lag = status.oldest_due_lag
    if lag is not None and lag > max_lag:
        problems.append(
            f"the oldest due occurrence has waited {lag.total_seconds():.0f} s "
            f"(limit {max_lag.total_seconds():g} s)"
        )
    starved = [k for k in status.unhandled if k.due]
    if status.live_workers and starved:
        listed = ", ".join(f"{k.kind} ({k.due} due)" for k in starved)
        problems.append(f"due work for kinds no live worker handles: {listed}")
    if status.stalled_batches:
        problems.append(
            f"{len(status.stalled_batches)} closed batch(es) have every member done but no callback yet "
            f"(the workers' sweep completes them): {', '.join(status.stalled_batches[:5])}"
        )
    return problems


def _batches(closed_before: datetime, alias: str) -> tuple[dict[str, int], list[str]]:
    """The batches not completed by status, and the closed ones (a bounded few) whose members
    are all done since before ``closed_before`` but that have no callback yet."""
    unfinished = Batch.objects.using(alias).exclude(status=BatchStatus.COMPLETED)
    counts = dict(unfinished.values_list("status").annotate(n=Count("pk")).order_by())
    overdue = unfinished.filter(status=BatchStatus.CLOSED, closed_at__lt=closed_before)
    stalled = [
        batch_id
        for batch_id in overdue.order_by("closed_at").values_list("pk", flat=True)[:STALLED_LOOKED_AT]
        if not Occurrence.objects.using(alias).filter(batch_id=batch_id, status__in=ACTIVE_STATUSES).exists()
    ]
    return counts, stalled


def format_status(status: Status) -> str:
    """The status as text, for people."""
    lines = ["occurrences: " + ", ".join(f"{name} {n}" for name, n in status.counts.items())]
    lag = status.oldest_due_lag
    if status.oldest_due_at is None or lag is None:
        lines.append("due now: 0")
    else:
        lines.append(
            f"due now: {status.due} (oldest due at {iso_ms(status.oldest_due_at)}, "
            f"lag {lag.total_seconds():.1f} s)"
        )
    if status.disabled_waiting:
        lines.append(f"waiting on disabled jobs: {status.disabled_waiting}")
    if status.paused:
        lines.append("paused kinds (no worker claims them):")
        lines.extend(
            f"  {p.kind}: {p.waiting} waiting, {p.due} due; paused at {iso_ms(p.paused_at)}"
            + (f" by {p.paused_by}" if p.paused_by else "")
            for p in status.paused
        )
    if status.batches:
        lines.append(
            "batches not completed: " + ", ".join(f"{name} {n}" for name, n in sorted(status.batches.items()))
        )
    for title, workers in (("live workers", status.live_workers), ("stale workers", status.stale_workers)):
        lines.append(f"{title}: {len(workers)}")
        lines.extend(
            f"  {w.worker_id} host={w.hostname} pid={w.pid} concurrency={w.concurrency} "
            f"kinds={','.join(w.kinds) or '-'} last seen {iso_ms(w.last_seen_at)} "
            f"({w.age.total_seconds():.1f} s ago)"
            for w in workers
        )
    if status.stopped_workers:
        lines.append(f"stopped workers: {status.stopped_workers}")
    if status.unhandled:
        lines.append("waiting for a kind no live worker handles:")
        lines.extend(f"  {k.kind}: {k.waiting} waiting, {k.due} due" for k in status.unhandled)
    if status.near_budget:
        lines.append(f"policies near their budget (>= {NEAR_BUDGET_PERCENT}%):")
        lines.extend(
            f"  {Principal.of_row(b).label} revision {b.policy_revision} "
            f"window {iso_ms(b.window_started_at)}..{iso_ms(b.window_ends_at)}: "
            f"runs {b.runs}/{_limit(b.max_runs)}, units {b.units}/{_limit(b.max_units)}"
            + (" (held until the window ends)" if b.held else "")
            for b in status.near_budget
        )
    if status.without_policy:
        lines.append("jobs whose principal has no policy (every run denied):")
        lines.extend(f"  {principal}: {', '.join(jobs)}" for principal, jobs in status.without_policy.items())
    lines.append(f"retention: {status.last_retention.describe()}")
    archived = (status.last_retention.result or {}).get("archived") or []
    lines.extend(f"  archived {name}" for name in archived)
    lines.append("healthy" if status.healthy else "unhealthy: " + "; ".join(status.problems))
    return "\n".join(lines)


# --------------------------------------------------------------------------- prune

# The pruning itself is retention's (retention/plan.py), shared with the workers; these are the
# names the command and callers have always used.
PruneResult = retention_plan.PruneResult
DEFAULT_PRUNE_BATCH = retention_plan.DEFAULT_BATCH
MAX_PRUNE_BATCH = retention_plan.MAX_BATCH


def prune(
    older_than: timedelta,
    *,
    batch_size: int = DEFAULT_PRUNE_BATCH,
    dry_run: bool = False,
    include_job_events: bool = False,
    using: str | None = None,
) -> PruneResult:
    """Delete terminal occurrences settled more than ``older_than`` ago, with their events
    and reservations, in batches: see :func:`retention.plan.prune`."""
    return retention_plan.prune(
        older_than, batch_size=batch_size, dry_run=dry_run, include_job_events=include_job_events, using=using
    )
