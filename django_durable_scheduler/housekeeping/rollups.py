"""Settled occurrences per kind and outcome over a time range, without aggregating the whole
occurrences table: hours that are over are counted once into ``OutcomeCount`` and read from
there; only the open ends of a range (at most an hour at each) are counted from the
occurrences' ``(status, settled_at)`` index. Nothing is written on the kernel's hot path: an
hour is counted by the first reader that needs it.

An hour is over ``SETTLE_MARGIN`` after it ends: a worker stamps ``settled_at`` with its own
clock, which may run a little behind another host's (``DURABLE_SCHEDULER_TIME_SOURCE =
"database"`` removes that).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.db.models import Count, Sum
from django.db.models.functions import Trunc

from .. import conf
from ..models import TERMINAL_STATUSES, Job, Occurrence, OutcomeCount

HOUR = timedelta(hours=1)
SETTLE_MARGIN = timedelta(minutes=10)
# Counted hours older than this are deleted when new ones are counted: the readers look back a day.
KEEP = timedelta(days=3)
MARK = ""  # the kind and status of the row that marks an hour as counted

Outcomes = Counter[tuple[str, str]]  # (kind, status) -> runs


def _floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _ceil(moment: datetime) -> datetime:
    floor = _floor(moment)
    return floor if floor == moment else floor + HOUR


def job_kinds(job_ids: Iterable[str], alias: str) -> dict[str, tuple[str, bool]]:
    """``(kind, enabled)`` of these jobs, in one query. Aggregates group occurrences by their
    job and look the kinds up here, rather than join every occurrence row to its job."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    rows = Job.objects.using(alias).filter(pk__in=wanted).values_list("pk", "kind", "enabled")
    return {pk: (kind, enabled) for pk, kind, enabled in rows}


def _live(start: datetime, end: datetime, alias: str) -> Outcomes:
    """Counted from the occurrences themselves: for ranges of at most an hour or so."""
    rows = list(
        Occurrence.objects.using(alias)
        .filter(status__in=TERMINAL_STATUSES, settled_at__gte=start, settled_at__lt=end)
        .values_list("job_id", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    kinds = job_kinds((job_id for job_id, _, _ in rows), alias)
    found = Outcomes()
    for job_id, status, n in rows:
        found[kinds[job_id][0], status] += n
    return found


def _count_hours(first: datetime, end: datetime, alias: str) -> None:
    """Count the hours in [first, end) that are not counted yet, in one grouped query over
    their span, and store them with their marks (a concurrent reader may store the same
    rows: the unique key keeps one, and both counted the same settled rows)."""
    wanted = []
    hour = first
    while hour < end:
        wanted.append(hour)
        hour += HOUR
    table = OutcomeCount.objects.using(alias)
    counted = set(
        table.filter(kind=MARK, status=MARK, hour__gte=first, hour__lt=end).values_list("hour", flat=True)
    )
    missing = [hour for hour in wanted if hour not in counted]
    if not missing:
        return
    span = list(
        Occurrence.objects.using(alias)
        .filter(status__in=TERMINAL_STATUSES, settled_at__gte=missing[0], settled_at__lt=missing[-1] + HOUR)
        .annotate(hour=Trunc("settled_at", "hour", tzinfo=UTC))
        .values_list("hour", "job_id", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    kinds = job_kinds((job_id for _, job_id, _, _ in span), alias)
    todo = set(missing)
    counted_by: Counter[tuple[datetime, str, str]] = Counter()
    for hour, job_id, status, n in span:
        if hour in todo:
            counted_by[hour, kinds[job_id][0], status] += n
    rows = [
        OutcomeCount(hour=hour, kind=kind, status=status, count=n)
        for (hour, kind, status), n in counted_by.items()
    ]
    rows += [OutcomeCount(hour=hour, kind=MARK, status=MARK, count=0) for hour in missing]
    table.bulk_create(rows, ignore_conflicts=True)
    table.filter(hour__lt=missing[-1] - KEEP).delete()


def outcomes_through(start: datetime, now: datetime, *, alias: str) -> Outcomes:
    """Occurrences settled from ``start`` up to and including ``now``, per (kind, status): a
    view "as of now" counts what settled at that very instant too (as its other parts do)."""
    return outcomes(start, now + timedelta(microseconds=1), alias=alias)


def outcomes(start: datetime, end: datetime, *, alias: str) -> Outcomes:
    """Occurrences settled in [start, end), per (kind, status)."""
    closed = _floor(conf.now() - SETTLE_MARGIN)  # hours before this one are over
    first, last = _ceil(start), min(_floor(end), closed)
    if first >= last:
        return _live(start, end, alias)
    _count_hours(first, last, alias)
    found = Outcomes()
    for a, b in ((start, first), (last, end)):
        if a < b:
            found += _live(a, b, alias)
    for kind, status, n in (
        OutcomeCount.objects.using(alias)
        .filter(hour__gte=first, hour__lt=last)
        .exclude(kind=MARK)
        .values_list("kind", "status")
        .annotate(total=Sum("count"))
        .order_by()
    ):
        found[kind, status] += n
    return found
