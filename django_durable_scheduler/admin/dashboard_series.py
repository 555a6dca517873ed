"""The dashboard's figures over time: per bucket of the last hour, day or week, for one kind
or all, the runs by outcome, the retried attempts, the pickup lag's p50 and p95, the average
queue depth, and the follow-ups enqueued and batches completed.

Read from the hourly counts of ``rollups`` (one range of their key, however many occurrences
the week saw) and, for the last hour's five-minute buckets and the open end of the others,
counted live from the occurrences' indexes. Two figures are derived, as docs/operations.md
says: the percentiles from the lag histogram the counts hold, and the queue depth, by
Little's law, from the time occurrences waited (those settled in a bucket, and those waiting
now) divided by the bucket's length.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils.translation import ngettext

from ..housekeeping import rollups
from ..models import Job, OccurrenceStatus


@dataclass(frozen=True)
class Range:
    name: str
    span: timedelta
    step: timedelta  # a bucket's length
    unit: str  # what rollups counts per: "minute" or "hour"
    label: str  # a bucket's length, in words


RANGES = {
    r.name: r
    for r in (
        Range("hour", timedelta(hours=1), timedelta(minutes=5), "minute", "5 minutes"),
        Range("day", timedelta(days=1), timedelta(hours=1), "hour", "hour"),
        Range("week", timedelta(days=7), timedelta(hours=6), "hour", "6 hours"),
    )
}
DEFAULT_RANGE = "day"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SUCCEEDED, DEAD_LETTER, CANCELLED = (
    str(OccurrenceStatus.SUCCEEDED),
    str(OccurrenceStatus.DEAD_LETTER),
    str(OccurrenceStatus.CANCELLED),
)


# What a count of these reads as, singular and plural (the chart's tooltips, the totals).
RETRIED = ("attempt failed and retried", "attempts failed and retried")
BATCHES_COMPLETED = ("batch completed", "batches completed")
FOLLOW_UPS_ENQUEUED = ("follow-up enqueued", "follow-ups enqueued")


@dataclass
class Bucket:
    start: datetime
    end: datetime
    counts: Counter[str]  # every key of rollups.KEYS this bucket had
    depth: float  # occurrences waiting, on average over the bucket

    @property
    def lag_runs(self) -> int:
        return sum(self.counts[key] for key in rollups.LAG_KEYS)

    def lag(self, quantile: float) -> float | None:
        """The pickup lag (seconds) below which ``quantile`` of the bucket's runs fell, read
        from the histogram: interpolated within its bucket (the last one, past the largest
        bound, reads as that bound). None without runs."""
        return percentile([self.counts[key] for key in rollups.LAG_KEYS], quantile)


def percentile(histogram: list[int], quantile: float) -> float | None:
    """The ``quantile`` of the values counted in ``histogram`` (a count per bucket of
    ``rollups.LAG_BOUNDS``, and one more for the rest)."""
    total = sum(histogram)
    if not total:
        return None
    wanted = quantile * total
    below = 0
    for i, n in enumerate(histogram):
        if n and below + n >= wanted:
            if i >= len(rollups.LAG_BOUNDS):
                return float(rollups.LAG_BOUNDS[-1])
            low = 0.0 if i == 0 else float(rollups.LAG_BOUNDS[i - 1])
            return low + (float(rollups.LAG_BOUNDS[i]) - low) * (wanted - below) / n
        below += n
    return float(rollups.LAG_BOUNDS[-1])  # pragma: no cover - the loop always returns


@dataclass
class Timeline:
    range: Range
    kind: str | None
    now: datetime
    buckets: list[Bucket]

    def total(self, key: str) -> int:
        return sum(bucket.counts[key] for bucket in self.buckets)

    @property
    def summary(self) -> list[tuple[str, int]]:
        """The range's totals, as the page's line above the charts reads them (the words
        agreeing with each count)."""
        totals = [
            (("succeeded", "succeeded"), self.total(SUCCEEDED)),
            (("dead-lettered", "dead-lettered"), self.total(DEAD_LETTER)),
            (("cancelled", "cancelled"), self.total(CANCELLED)),
            (RETRIED, self.total(rollups.RETRIES)),
            (BATCHES_COMPLETED, self.total(rollups.BATCHES)),
            (FOLLOW_UPS_ENQUEUED, self.total(rollups.FOLLOW_UPS)),
        ]
        return [(ngettext(*words, n), n) for words, n in totals]


def _floor(moment: datetime, step: timedelta) -> datetime:
    return moment - (moment - EPOCH) % step


def bucket_starts(span: Range, now: datetime) -> list[datetime]:
    """The buckets' starts: aligned to their length (UTC), the last one holding ``now``."""
    last = _floor(now.astimezone(UTC), span.step)
    count = int(span.span / span.step)
    return [last - span.step * (count - 1 - i) for i in range(count)]


def collect(range_name: str, kind: str | None, now: datetime, alias: str) -> Timeline:
    """The timeline of ``range_name`` (a key of RANGES) for ``kind`` (None: every kind)."""
    span = RANGES[range_name]
    starts = bucket_starts(span, now)
    start, end = starts[0], now + timedelta(microseconds=1)  # "as of now", as the rest of the page
    read = rollups.minutely if span.unit == "minute" else rollups.hourly
    counted = read(start, end, alias=alias, kind=kind)
    counts: dict[datetime, Counter[str]] = {s: Counter() for s in starts}
    for (at, key), n in counted.items():
        counts[_floor(at, span.step)][key] += n
    waiting = rollups.waiting(now, alias=alias, kind=kind)
    buckets = []
    for s in starts:
        e = min(s + span.step, now)
        seconds = max((e - s).total_seconds(), 1.0)
        waited = counts[s][rollups.WAITED] / 1000 + _waited_within(waiting, s, e)
        buckets.append(Bucket(s, s + span.step, counts[s], waited / seconds))
    return Timeline(span, kind, now, buckets)


def _waited_within(waiting: Counter[datetime], start: datetime, end: datetime) -> float:
    """Seconds the occurrences waiting now (by the minute they became due) waited in
    [start, end)."""
    return sum(n * max(0.0, (end - max(due, start)).total_seconds()) for due, n in waiting.items())


KINDS_SHOWN = 200


def kinds(alias: str) -> list[str]:
    """The kinds of the jobs, for the dashboard's selector (the first ``KINDS_SHOWN``)."""
    rows = Job.objects.using(alias).order_by("kind").values_list("kind", flat=True).distinct()
    return list(rows[:KINDS_SHOWN])


def kind_exists(kind: str, alias: str) -> bool:
    """Whether a job has ``kind``: for one past the selector's first ``KINDS_SHOWN``."""
    return Job.objects.using(alias).filter(kind=kind).exists()
