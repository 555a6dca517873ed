"""What the admin shows of chains and batches: an occurrence's predecessor, its follow-ups
(declared and enqueued), its batch, and a batch's progress.

Every read here is one indexed lookup or a bounded list: the predecessor and a batch by
primary key, the follow-ups through the partial ``caused_by`` index (at most what one
declaration names), a batch's members through the partial ``(batch, status)`` index, so an
occurrence's page costs the same with millions of rows in the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..db.counting import COUNT_BOUND
from ..kernel.followups import FOLLOW_UP_PREFIX
from ..models import ACTIVE_STATUSES, TERMINAL_STATUSES, Batch, BatchStatus, Occurrence, OccurrenceStatus
from ..rules.chains import EDGES
from ..rules.identity import canonical_json

# Follow-ups listed on an occurrence's page: more than one edge of a declaration can name
# (a job's and an enqueue's follow-ups, each at most chains.MAX_FOLLOW_UPS).
FOLLOW_UPS_SHOWN = 200
EDGE_LABELS = {"then": "then (on success)", "on_dead_letter": "on dead letter"}


def occurrence_url(occurrence_id: str) -> str:
    return reverse("admin:durable_scheduler_occurrence_change", args=[quote(occurrence_id)])


def batch_url(batch_id: str) -> str:
    return reverse("admin:durable_scheduler_batch_change", args=[quote(batch_id)])


def job_url(job_id: str) -> str:
    return reverse("admin:durable_scheduler_job_change", args=[quote(job_id)])


def completed_batch_id(occurrence: Occurrence) -> str | None:
    """The batch a batch's callback occurrence completes (its ``cause`` names it), else None."""
    cause = occurrence.cause
    if occurrence.caused_by is None and isinstance(cause, dict) and isinstance(cause.get("batch_id"), str):
        return str(cause["batch_id"])
    return None


def has_links(occurrence: Occurrence) -> bool:
    """Whether the occurrence is part of a chain or a batch (its page then shows them)."""
    return bool(
        occurrence.caused_by
        or occurrence.follow_ups
        or occurrence.batch_id
        or completed_batch_id(occurrence) is not None
    )


def predecessor(occurrence: Occurrence) -> SafeString | str:
    """The occurrence that caused this one, linked with its job and status; its id as plain
    text once retention has pruned it (``cause`` keeps what it ended with)."""
    if not occurrence.caused_by:
        return "-"
    row = (
        Occurrence.objects.using(occurrence._state.db)
        .filter(pk=occurrence.caused_by)
        .values_list("job_id", "status")
        .first()
    )
    if row is None:
        return format_html("{} (pruned; its outcome is in the cause below)", occurrence.caused_by)
    job_id, status = row
    return format_html(
        '<a href="{}">{}</a> (job {}, {})',
        occurrence_url(occurrence.caused_by),
        occurrence.caused_by,
        job_id,
        OccurrenceStatus(status).label,
    )


def _edge_and_index(trigger_key: str, cause: str) -> tuple[str, int]:
    """A follow-up's trigger key ``after:<cause>:<edge>:<index>`` as (edge, index)."""
    rest = trigger_key.removeprefix(f"{FOLLOW_UP_PREFIX}{cause}:")
    edge, _, index = rest.rpartition(":")
    return edge, int(index) if index.isdigit() else 0


def follow_ups(occurrence: Occurrence) -> SafeString | str:
    """The occurrences this one caused (its enqueued follow-ups), in declaration order, each
    linked with its job and status."""
    rows = list(
        Occurrence.objects.using(occurrence._state.db)
        .filter(caused_by=occurrence.pk)
        .order_by()
        .values_list("pk", "job_id", "status", "trigger_key")[: FOLLOW_UPS_SHOWN + 1]
    )
    if not rows:
        if occurrence.is_terminal or not occurrence.follow_ups:
            return "none"
        return "none yet (they are enqueued when it ends)"
    more = len(rows) > FOLLOW_UPS_SHOWN
    rows = sorted(rows[:FOLLOW_UPS_SHOWN], key=lambda row: _edge_and_index(row[3], occurrence.pk))
    cells = format_html_join(
        "",
        '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
        (
            (
                occurrence_url(pk),
                pk[:16] + "…",
                job_id,
                EDGE_LABELS.get(_edge_and_index(key, occurrence.pk)[0], "-"),
                OccurrenceStatus(status).label,
            )
            for pk, job_id, status, key in rows
        ),
    )
    head = mark_safe(  # a constant
        "<tr><th>occurrence</th><th>job</th><th>on</th><th>status</th></tr>"
    )
    tail = format_html("<p>Only the first {} are listed.</p>", FOLLOW_UPS_SHOWN) if more else ""
    return format_html('<table class="dsch-follow-ups">{}{}</table>{}', head, cells, tail)


def declared(follow_ups_value: Any) -> SafeString | str:
    """An occurrence's (or a job's) declared follow-ups as nested lists: per edge, each
    step's job (linked), its payload if it gives one, and its own follow-ups."""
    if not isinstance(follow_ups_value, dict) or not any(follow_ups_value.get(e) for e in EDGES):
        return "none"
    return format_html_join(
        "",
        "<div><strong>{}</strong>{}</div>",
        ((EDGE_LABELS[edge], _steps(follow_ups_value[edge])) for edge in EDGES if follow_ups_value.get(edge)),
    )


def _steps(specs: list[Any]) -> SafeString:
    items = []
    for spec in specs:
        if not isinstance(spec, dict) or "job_id" not in spec:
            items.append(format_html("<li>{}</li>", canonical_json(spec)))
            continue
        payload = (
            format_html(", payload <code>{}</code>", canonical_json(spec["payload"]))
            if "payload" in spec
            else ""
        )
        nested = format_html_join(
            "",
            "<div>{}: {}</div>",
            ((EDGE_LABELS[edge], _steps(spec[edge])) for edge in EDGES if spec.get(edge)),
        )
        items.append(
            format_html(
                '<li><a href="{}">{}</a>{}{}</li>', job_url(spec["job_id"]), spec["job_id"], payload, nested
            )
        )
    return format_html('<ul class="dsch-steps">{}</ul>', mark_safe("".join(items)))  # each item escaped


def batch_link(batch_id: str | None, alias: str | None) -> SafeString | str:
    """A batch linked with its status and description; plain text if it is gone."""
    if not batch_id:
        return "-"
    row = Batch.objects.using(alias).filter(pk=batch_id).values_list("status", "description").first()
    if row is None:
        return format_html("{} (not found)", batch_id)
    status, description = row
    label = BatchStatus(status).label
    if description:
        return format_html('<a href="{}">{}</a> ({}, {})', batch_url(batch_id), batch_id, label, description)
    return format_html('<a href="{}">{}</a> ({})', batch_url(batch_id), batch_id, label)


# --------------------------------------------------------------------------- batches


@dataclass
class Progress:
    """A batch's members by status, and how many are terminal, out of its ``size``."""

    size: int
    counts: dict[str, int]
    terminal: int

    @property
    def percent(self) -> int | None:
        """The terminal share; None for a batch without members, which is empty, not done."""
        return min(100, self.terminal * 100 // self.size) if self.size else None


def progress_of(batch: Batch, counts: dict[str, int]) -> Progress:
    """``counts`` (``kernel.batch_progress``'s, or a completed batch's stored counts) as a
    batch's progress. A completed batch is all terminal, whatever retention pruned since."""
    by_status = {str(s): int(counts.get(str(s), 0)) for s in OccurrenceStatus}
    terminal = sum(by_status[str(s)] for s in TERMINAL_STATUSES)
    if batch.status == BatchStatus.COMPLETED:
        terminal = batch.size
    return Progress(batch.size, by_status, terminal)


def progress_html(progress: Progress) -> SafeString:
    """A bar of the terminal share, and a row per status that has members."""
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td></tr>",
        ((OccurrenceStatus(s).label, n) for s, n in progress.counts.items() if n),
    )
    return format_html(
        '<p><progress max="{}" value="{}"></progress> {} of {} terminal ({})</p>'
        '<table class="dsch-progress"><tr><th>status</th><th>members</th></tr>{}</table>',
        max(progress.size, 1),
        progress.terminal,
        progress.terminal,
        progress.size,
        "empty" if progress.percent is None else f"{progress.percent}%",
        rows,
    )


@dataclass
class Terminal:
    """How many of a live batch's members are terminal, read with bounded counts: exact
    unless both its live and its terminal members number at least ``COUNT_BOUND`` (then
    ``terminal`` is that bound, a lower bound of the truth)."""

    terminal: int
    exact: bool
    size: int

    @property
    def percent(self) -> int | None:
        """The terminal share; None when ``terminal`` is a lower bound, or for a batch without
        members (empty, not done)."""
        if not self.exact or not self.size:
            return None
        return min(100, self.terminal * 100 // self.size)


def terminal_members(batch: Batch, alias: str | None, bound: int = COUNT_BOUND) -> Terminal:
    """A not yet completed batch's terminal members: its size less its live members (all
    of them are kept until it completes), counted up to ``bound`` index entries; else its
    terminal members, up to ``bound`` too."""
    members = Occurrence.objects.using(alias).filter(batch_id=batch.pk).order_by()
    live = members.filter(status__in=ACTIVE_STATUSES)[:bound].count()
    if live < bound:
        return Terminal(max(batch.size - live, 0), True, batch.size)
    terminal = members.filter(status__in=TERMINAL_STATUSES)[:bound].count()
    return Terminal(terminal, terminal < bound, batch.size)
