"""The admin dashboard's figures: outcomes per kind over the last hour and day, the due lag,
the workers and what each runs, budget use per principal, the batches in progress, and the
last day's dead letters.

Every query is an indexed aggregate or a bounded list, so the page stays fast on a large
occurrences table: settled outcomes come from the hourly counts of ``rollups`` (and the
``(status, settled_at)`` index for the hour in progress), running ones through the claim index,
budget use from the current window's usage rows, a batch's progress by bounded counts of its
members.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from django.db.models import Count

from .. import conf
from ..db.dialect import alias_for
from ..housekeeping import ops, rollups
from ..kernel import concurrency
from ..models import AuthorityPolicy, Batch, BatchStatus, Job, Occurrence, OccurrenceStatus
from ..rules.authority import Principal
from . import chainview
from .progressview import progress_html

WINDOWS = (("last hour", timedelta(hours=1)), ("last day", timedelta(days=1)))
DEAD_LETTERS_SHOWN = 25
RUNNING_SHOWN = 200
LIMITS_SHOWN = 20
BATCHES_SHOWN = 20
# The outcomes a chart bar shows, in its order.
OUTCOMES = (OccurrenceStatus.SUCCEEDED, OccurrenceStatus.DEAD_LETTER, OccurrenceStatus.CANCELLED)


@dataclass
class KindOutcomes:
    kind: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def segments(self, largest: int, width: int = 600) -> list[tuple[str, int, float, float]]:
        """The bar of this kind in a chart whose longest bar (``largest`` runs) is ``width``
        wide: ``(outcome, count, x, width)`` per outcome it had."""
        found: list[tuple[str, int, float, float]] = []
        x = 0.0
        for outcome in OUTCOMES:
            n = self.counts.get(outcome, 0)
            if n:
                length = width * n / max(largest, 1)
                found.append((str(outcome), n, round(x, 1), round(length, 1)))
                x += length
        return found


ROW_HEIGHT = 22
LABEL_WIDTH = 140
BAR_WIDTH = 250


@dataclass
class Chart:
    """One window's runs per kind as rows of an SVG bar chart."""

    title: str
    rows: list[dict[str, object]]

    @property
    def height(self) -> int:
        return ROW_HEIGHT * len(self.rows)


class Running(NamedTuple):
    """A running occurrence as the workers table lists it; ``stopping``: a cancel was
    requested for its attempt, and its worker has yet to end it; ``progress``: its last
    progress report, as a bar and its text (empty: none)."""

    pk: str
    kind: str
    stopping: bool
    progress: str = ""


@dataclass
class WorkerRow:
    worker: ops.WorkerState
    stale: bool
    running: list[Running]


def error_text(occurrence: Occurrence) -> str:
    """A dead letter's error in one line: its type and message, or the denial's reason."""
    error = occurrence.last_error if isinstance(occurrence.last_error, dict) else {}
    message = error.get("message") or error.get("reason") or ""
    kind = error.get("type") or error.get("code") or ""
    return f"{kind}: {message}" if kind and message else str(kind or message)


@dataclass
class Dashboard:
    status: ops.Status
    outcomes: dict[str, list[KindOutcomes]]  # by window title, kinds with the most runs first
    running: dict[str, list[Running]]  # by lease owner
    budgets: list[ops.BudgetUsage]
    dead_letters: list[Occurrence]
    largest: dict[str, int] = field(default_factory=dict)  # by window: the longest bar's total
    # The concurrency limits with the most running first (see concurrency_limits).
    limits: list[dict[str, object]] = field(default_factory=list)
    # The newest batches not yet completed, with their progress (see open_batches).
    batches: list[OpenBatch] = field(default_factory=list)

    def charts(self) -> list[Chart]:
        return [
            Chart(
                title,
                [
                    {
                        "kind": kind.kind,
                        "total": kind.total,
                        "y": ROW_HEIGHT * index,
                        "segments": [
                            {"outcome": outcome, "n": n, "x": LABEL_WIDTH + x, "width": width}
                            for outcome, n, x, width in kind.segments(self.largest[title], BAR_WIDTH)
                        ],
                    }
                    for index, kind in enumerate(kinds)
                ],
            )
            for title, kinds in self.outcomes.items()
        ]

    @property
    def held(self) -> list[ops.BudgetUsage]:
        """The principals held at their budget: their claims wait until the window ends."""
        return [usage for usage in self.budgets if usage.held]

    def dead_letter_rows(self) -> list[tuple[Occurrence, str]]:
        return [(occurrence, error_text(occurrence)) for occurrence in self.dead_letters]

    def workers(self) -> list[WorkerRow]:
        rows = [WorkerRow(w, False, self.running.get(w.worker_id, [])) for w in self.status.live_workers]
        rows += [WorkerRow(w, True, self.running.get(w.worker_id, [])) for w in self.status.stale_workers]
        return rows


@dataclass
class OpenBatch:
    batch: Batch
    progress: chainview.Terminal


def open_batches(*, using: str | None = None) -> list[OpenBatch]:
    """The newest :data:`BATCHES_SHOWN` batches that are open or closed (not yet completed),
    each with how many of its members have ended. One range of the ``(status, created_at)``
    index per status, then bounded counts per batch (``chainview.terminal_members``)."""
    alias = alias_for(using)
    found: list[Batch] = []
    for status in (BatchStatus.OPEN, BatchStatus.CLOSED):
        rows = Batch.objects.using(alias).filter(status=status).order_by("-created_at", "-batch_id")
        found.extend(rows[:BATCHES_SHOWN])
    found.sort(key=lambda batch: (batch.created_at, batch.batch_id), reverse=True)
    return [OpenBatch(batch, chainview.terminal_members(batch, alias)) for batch in found[:BATCHES_SHOWN]]


def outcomes_since(since: datetime, now: datetime, alias: str) -> list[KindOutcomes]:
    """Settled occurrences per kind and outcome since ``since``, kinds with the most first."""
    by_kind: dict[str, dict[str, int]] = defaultdict(dict)
    for (kind, status), n in rollups.outcomes_through(since, now, alias=alias).items():
        by_kind[kind][status] = n
    found = [KindOutcomes(kind, counts) for kind, counts in by_kind.items()]
    return sorted(found, key=lambda k: (-k.total, k.kind))


def concurrency_limits(*, using: str | None = None, now: datetime | None = None) -> list[dict[str, object]]:
    """Running / limit of every capped principal and of the limited jobs' and kinds' keys that
    run now, the most running first (LIMITS_SHOWN of them). Running: ``running`` rows with an
    unexpired lease, read through the claim index, so the cost is what runs, not the history."""
    alias = alias_for(using)
    now = conf.now() if now is None else now
    live = Occurrence.objects.using(alias).filter(status=OccurrenceStatus.RUNNING, lease_expires_at__gt=now)
    found: list[dict[str, object]] = []
    by_principal = dict(
        live.values("principal_key").annotate(n=Count("pk")).values_list("principal_key", "n")
    )
    for policy in AuthorityPolicy.objects.using(alias).filter(max_running__isnull=False)[:1000]:
        principal = Principal.of_row(policy)
        found.append(
            {
                "scope": "principal",
                "name": principal.label,
                "running": by_principal.get(principal.key, 0),
                "limit": policy.max_running,
            }
        )
    limited_jobs = dict(
        Job.objects.using(alias).filter(concurrency__isnull=False).values_list("job_id", "concurrency")[:1000]
    )
    by_key = live.values("job", "job__kind", "concurrency_key").annotate(n=Count("pk"))
    kinds: dict[tuple[str, str | None], int] = defaultdict(int)
    for row in by_key.values_list("job", "job__kind", "concurrency_key", "n"):
        job_id, kind, key, n = row
        if job_id in limited_jobs:
            label = job_id if key is None else f"{job_id} [{key}]"
            found.append({"scope": "job", "name": label, "running": n, "limit": limited_jobs[job_id]})
        kinds[kind, key] += n
    for (kind, key), n in kinds.items():
        limit = concurrency.kind_limit(kind)
        if limit is not None:
            label = kind if key is None else f"{kind} [{key}]"
            found.append({"scope": "kind", "name": label, "running": n, "limit": limit})
    found.sort(key=lambda row: (-int(str(row["running"])), str(row["scope"]), str(row["name"])))
    return found[:LIMITS_SHOWN]


def collect(*, using: str | None = None) -> Dashboard:
    alias = alias_for(using)
    status = ops.collect_status(using=alias)
    now = status.now
    outcomes = {title: outcomes_since(now - span, now, alias) for title, span in WINDOWS}
    running: dict[str, list[Running]] = defaultdict(list)
    fields = ("pk", "lease_owner", "job__kind", "fence", "cancel_requested_fence", "progress")
    for pk, owner, kind, fence, cancel_fence, progress in (
        Occurrence.objects.using(alias)
        .filter(status=OccurrenceStatus.RUNNING)
        .order_by("lease_owner", "pk")
        .values_list(*fields)[:RUNNING_SHOWN]
    ):
        running[str(owner)].append(Running(pk, kind, cancel_fence == fence, progress_html(progress, fence)))
    dead = list(
        Occurrence.objects.using(alias)
        .filter(status=OccurrenceStatus.DEAD_LETTER, settled_at__gte=now - timedelta(days=1))
        .select_related("job")
        .order_by("-settled_at")[:DEAD_LETTERS_SHOWN]
    )
    board = Dashboard(
        status=status,
        outcomes=outcomes,
        running=dict(running),
        budgets=ops.budget_usage(now, 0, alias),
        dead_letters=dead,
    )
    board.limits = concurrency_limits(using=alias, now=now)
    board.batches = open_batches(using=alias)
    board.largest = {title: max((k.total for k in kinds), default=0) for title, kinds in outcomes.items()}
    return board
