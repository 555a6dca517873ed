"""Settled occurrences per kind and outcome over a time range, without aggregating the whole
occurrences table: hours that are over are counted once into ``OutcomeCount`` and read from
there; only the open ends of a range (at most an hour at each) are counted from the
occurrences' ``(status, settled_at)`` index. Nothing is written on the kernel's hot path: an
hour is counted by the workers' housekeeping thread soon after it closes
(:func:`count_closed_hours`), or by the first reader that needs it before then.

An hour is over ``SETTLE_MARGIN`` after it ends: a worker stamps ``settled_at`` with its own
clock, which may run a little behind another host's (``DURABLE_SCHEDULER_TIME_SOURCE =
"database"`` removes that).

Besides its outcomes, a counted hour holds per kind what the dashboard's charts draw over
time (see :data:`KEYS`): the attempts that failed and were retried, the pickup lag of its
runs as a histogram (a run's lag: from its due time to the claim that ran it, read from that
claim's event), the milliseconds they waited, the follow-ups enqueued and the batches
completed in it. They are counted with the outcomes, from the rows an hour settled, so the
kernel writes nothing more for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Min,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Trunc

from .. import conf
from ..db.dialect import without_jit
from ..models import (
    PENDING_STATUSES,
    TERMINAL_STATUSES,
    Batch,
    BatchStatus,
    Event,
    Job,
    Occurrence,
    OutcomeCount,
)
from ..rules.events import OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED

HOUR = timedelta(hours=1)
SETTLE_MARGIN = timedelta(minutes=10)
# Counted hours older than this are deleted when new ones are counted: the readers look back
# a week (the dashboard's longest range).
KEEP = timedelta(days=8)
# The longest range a reader asks for (the dashboard's week): what the workers keep counted.
LONGEST_RANGE = timedelta(days=7)
MARK = ""  # the kind of the row that marks an hour as counted
COUNTED = "counted"  # and its status

# The keys an hour holds per kind besides the outcomes (``OutcomeCount.status``).
RETRIES = "retries"  # attempts that failed and were retried, of the occurrences settled
WAITED = "waited_ms"  # milliseconds the runs settled waited from their due time to their pickup
FOLLOW_UPS = "follow_ups"  # follow-ups enqueued (by the time they were enqueued)
BATCHES = "batches"  # batches completed (under their callback's kind)
LAG = "lag:"  # ``lag:<i>``: runs whose pickup lag fell in bucket i of LAG_BOUNDS
# The upper bounds (seconds) of the pickup lag histogram's buckets; a last one holds the rest.
LAG_BOUNDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
LAG_KEYS = tuple(f"{LAG}{i}" for i in range(len(LAG_BOUNDS) + 1))
KEYS = (*(str(s) for s in TERMINAL_STATUSES), RETRIES, WAITED, FOLLOW_UPS, BATCHES, *LAG_KEYS)
CLAIMS = (OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED)

Outcomes = Counter[tuple[str, str]]  # (kind, status) -> runs
Counted = Counter[tuple[datetime, str, str]]  # (hour or minute, kind, key) -> n
Series = Counter[tuple[datetime, str]]  # (hour or minute, key) -> n, over the kinds asked for


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


def _lag_bucket() -> Case:
    """The pickup lag's histogram bucket of a claim (annotated ``lag``)."""
    whens = [When(lag__lt=timedelta(seconds=bound), then=Value(i)) for i, bound in enumerate(LAG_BOUNDS)]
    return Case(*whens, default=Value(len(LAG_BOUNDS)))


def _last_claim(since: datetime, end: datetime, alias: str) -> QuerySet[Event]:
    """The claims of the outer settled row since it was last due, newest first (a probe of the
    events' ``(occurrence, event_id)`` index). A claim stamps its event with the time it found
    the row due at, and it comes before the settle (``end``, with a margin for another host's
    clock). ``since``, the earliest due time of the rows counted, says the same as the outer
    row's own due time but as a constant: PostgreSQL plans only the day partitions from that
    day on, so the plan (and what JIT would compile of it) does not grow with the days the
    events table holds."""
    return (
        Event.objects.using(alias)
        .filter(
            occurrence=OuterRef("pk"),
            event_type__in=CLAIMS,
            occurred_at__gte=since,
            occurred_at__lt=end + SETTLE_MARGIN,
        )
        .filter(occurred_at__gte=OuterRef("available_at"))
        .order_by("-event_id")
    )


def _settled(start: datetime, end: datetime, unit: str, alias: str) -> list[tuple[Any, ...]]:
    """The rows settled in [start, end) per ``unit`` (hour, minute), job, status and lag
    bucket (-1: not claimed since it was last due, as one cancelled while it waited): how many,
    their retried attempts and their summed lag. The bucket is worked out inside the subquery
    so that each row's last claim is read twice (bucket and lag), not once per bound; this runs
    once per hour that is over, and live only for the open ends. PostgreSQL's JIT is off for
    it: compiling it cost more than it ran."""
    rows = Occurrence.objects.using(alias).filter(
        status__in=TERMINAL_STATUSES, settled_at__gte=start, settled_at__lt=end
    )
    since = rows.aggregate(since=Min("available_at"))["since"]
    if since is None:
        return []
    since_due = ExpressionWrapper(F("occurred_at") - OuterRef("available_at"), output_field=DurationField())
    claims = _last_claim(since, end, alias).annotate(lag=since_due)
    bucket = claims.annotate(bucket=_lag_bucket()).values("bucket")[:1]
    lag = claims.values("lag")[:1]
    retried = Case(When(attempt__gt=1, then=F("attempt") - 1), default=Value(0))
    query = (
        rows.annotate(
            bucket=Coalesce(Subquery(bucket, output_field=IntegerField()), Value(-1)),
            at=Trunc("settled_at", unit, tzinfo=UTC),
        )
        .values_list("at", "job_id", "status", "bucket")
        .annotate(
            n=Count("pk"),
            retries=Sum(retried),
            waited=Sum(Subquery(lag, output_field=DurationField())),
        )
        .order_by()
    )
    with without_jit(alias):
        return list(query)


def grouped(start: datetime, end: datetime, unit: str, alias: str) -> Counted:
    """Every key of :data:`KEYS` per ``unit`` (``"hour"`` or ``"minute"``) and kind over
    [start, end), from the occurrences and batches themselves."""
    settled = _settled(start, end, unit, alias)
    follow_ups = list(
        Occurrence.objects.using(alias)
        .filter(caused_by__isnull=False, created_at__gte=start, created_at__lt=end)
        .annotate(at=Trunc("created_at", unit, tzinfo=UTC))
        .values_list("at", "job_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    batches = list(
        Batch.objects.using(alias)
        .filter(status=BatchStatus.COMPLETED, completed_at__gte=start, completed_at__lt=end)
        .annotate(at=Trunc("completed_at", unit, tzinfo=UTC))
        .values_list("at", "callback_job_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    jobs = {row[1] for row in settled} | {row[1] for row in follow_ups} | {row[1] for row in batches}
    kinds = job_kinds(jobs, alias)
    found = Counted()
    for at, job_id, status, bucket, n, retries, waited in settled:
        kind = kinds[job_id][0]
        found[at, kind, status] += n
        found[at, kind, RETRIES] += retries or 0
        if bucket >= 0:
            found[at, kind, f"{LAG}{bucket}"] += n
            found[at, kind, WAITED] += max(0, round(waited.total_seconds() * 1000)) if waited else 0
    for at, job_id, n in follow_ups:
        found[at, kinds[job_id][0], FOLLOW_UPS] += n
    for at, job_id, n in batches:
        found[at, kinds[job_id][0], BATCHES] += n
    return +found


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
        table.filter(kind=MARK, status=COUNTED, hour__gte=first, hour__lt=end).values_list("hour", flat=True)
    )
    missing = [hour for hour in wanted if hour not in counted]
    if not missing:
        return
    todo = set(missing)
    rows = [
        OutcomeCount(hour=hour, kind=kind, status=key, count=n)
        for (hour, kind, key), n in grouped(missing[0], missing[-1] + HOUR, "hour", alias).items()
        if hour in todo
    ]
    rows += [OutcomeCount(hour=hour, kind=MARK, status=COUNTED, count=0) for hour in missing]
    table.bulk_create(rows, ignore_conflicts=True)
    table.filter(hour__lt=missing[-1] - KEEP).delete()


def _counted_span(start: datetime, end: datetime, alias: str) -> tuple[datetime, datetime]:
    """The hours of [start, end) that are over, ``[first, last)``, counted if they were not."""
    closed = _floor(conf.now() - SETTLE_MARGIN)  # hours before this one are over
    first, last = _ceil(start), min(_floor(end), closed)
    if first < last:
        _count_hours(first, last, alias)
    return first, last


def count_closed_hours(now: datetime, *, alias: str) -> None:
    """Count the hours of the last :data:`LONGEST_RANGE` that are over and not counted yet:
    the workers' housekeeping thread calls it every few minutes, so that a reader (the
    dashboard, ``scheduler_status``) finds them counted and counts only the open ends. Each
    call counts the hour or so that closed since the last; the first after a deploy, a week."""
    _counted_span(now - LONGEST_RANGE, now, alias)


def outcomes_through(start: datetime, now: datetime, *, alias: str) -> Outcomes:
    """Occurrences settled from ``start`` up to and including ``now``, per (kind, status): a
    view "as of now" counts what settled at that very instant too (as its other parts do)."""
    return outcomes(start, now + timedelta(microseconds=1), alias=alias)


def outcomes(start: datetime, end: datetime, *, alias: str) -> Outcomes:
    """Occurrences settled in [start, end), per (kind, status)."""
    first, last = _counted_span(start, end, alias)
    if first >= last:
        return _live(start, end, alias)
    found = Outcomes()
    for a, b in ((start, first), (last, end)):
        if a < b:
            found += _live(a, b, alias)
    for kind, status, n in (
        OutcomeCount.objects.using(alias)
        .filter(hour__gte=first, hour__lt=last, status__in=TERMINAL_STATUSES)
        .values_list("kind", "status")
        .annotate(total=Sum("count"))
        .order_by()
    ):
        found[kind, status] += n
    return found


def hourly(start: datetime, end: datetime, *, alias: str, kind: str | None = None) -> Series:
    """Every key of :data:`KEYS` per hour of [start, end), summed over the kinds (or of
    ``kind`` alone): the hours that are over read from their counts (one range of the
    ``(hour, kind, status)`` key, whatever the rows), the open ends counted live."""
    first, last = _counted_span(start, end, alias)
    found = Series()
    if first >= last:
        return _of_kind(grouped(start, end, "hour", alias), kind)
    for a, b in ((start, first), (last, end)):
        if a < b:
            found += _of_kind(grouped(a, b, "hour", alias), kind)
    rows = OutcomeCount.objects.using(alias).filter(hour__gte=first, hour__lt=last).exclude(kind=MARK)
    if kind is not None:
        rows = rows.filter(kind=kind)
    for hour, key, n in rows.values_list("hour", "status").annotate(total=Sum("count")).order_by():
        found[hour, key] += n
    return found


def minutely(start: datetime, end: datetime, *, alias: str, kind: str | None = None) -> Series:
    """Every key of :data:`KEYS` per minute of [start, end) (a short range: counted live)."""
    return _of_kind(grouped(start, end, "minute", alias), kind)


def _of_kind(counted: Counted, kind: str | None) -> Series:
    found = Series()
    for (at, of, key), n in counted.items():
        if kind is None or of == kind:
            found[at, key] += n
    return found


def waiting(before: datetime, *, alias: str, kind: str | None = None) -> Counter[datetime]:
    """The occurrences that wait now, due before ``before`` and not picked up, per minute in
    which they became due (through the claim index: the cost is the backlog, not the
    history)."""
    rows = (
        Occurrence.objects.using(alias)
        .filter(status__in=PENDING_STATUSES, available_at__lt=before)
        .annotate(at=Trunc("available_at", "minute", tzinfo=UTC))
        .values_list("at", "job_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    found: Counter[datetime] = Counter()
    listed = list(rows)
    kinds = job_kinds((job_id for _, job_id, _ in listed), alias)
    for at, job_id, n in listed:
        if kind is None or kinds[job_id][0] == kind:
            found[at] += n
    return found
