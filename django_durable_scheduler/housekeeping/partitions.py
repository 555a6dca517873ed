"""The events table's day partitions on PostgreSQL: making them ahead of time, and dropping
whole days of history instead of deleting it row by row.

Migration 0005 partitions ``Event``'s table by range of ``occurred_at`` on PostgreSQL: one
partition per UTC day, the table as it stood before the conversion as one partition of
everything before its boundary, and a default partition for any row no day partition takes (an
insert never fails for lack of a partition). Every function here is a no-op on a table that is
not partitioned (SQLite, MySQL/MariaDB, or PostgreSQL before the migration): those keep the
batched deletes of ``ops.prune``.

Partitions are made from the parent (``LIKE`` it, then ``ATTACH``), so their columns, checks,
indexes and foreign keys are the parent's, which are the model's: a field or index added by a
migration reaches every partition, old and new, without an edit here. Each statement that needs
columns takes them from ``Event._meta``.

Why attach a new table rather than ``CREATE TABLE ... PARTITION OF``: the latter locks the
parent ACCESS EXCLUSIVE, which stops every insert of an event; ``ATTACH`` takes SHARE UPDATE
EXCLUSIVE, which inserts pass. Dropping a day detaches it first, which does lock the parent
(PostgreSQL allows ``DETACH ... CONCURRENTLY`` neither in a transaction nor beside a default
partition), for as long as the rows to keep take to copy out: ``Dropped.lock_seconds``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol, TypeVar

from django.db import OperationalError, connections, transaction
from django.db.models import QuerySet

from ..db import dialect
from ..exceptions import InvalidArgument
from ..models import Event, Occurrence

# One partition a UTC day: retention is set in days, so a day is the finest step it needs and
# each drop removes one day's rows. Longer periods would mean fewer partitions for the reads
# that do not name a time (an event by id, an occurrence's events), which look in each one, but
# would keep up to a period's rows past their retention; a retention of weeks is a few dozen
# days.
PERIOD = timedelta(days=1)
# Days made ahead of now, so a worker down for this long still finds the day's partition.
AHEAD = timedelta(days=3)
# ``<table>_p<YYYYMMDD>`` for a day (``_<HHMMSS>`` after it when a bound is not midnight),
# ``<table>_pdefault`` for the default partition.
NAME_INFIX = "_p"
DAY_FORMAT = "%Y%m%d"
DEFAULT_SUFFIX = "default"
# Making or dropping a partition adds or removes its foreign keys, which locks the occurrences
# and jobs tables against writes for an instant, after the writes under way: each try waits at
# most LOCK_TIMEOUT for its locks, so the workers' writes queued behind it wait no longer, and
# is tried again LOCK_ATTEMPTS times (the kernel's transactions last milliseconds).
LOCK_TIMEOUT = "200ms"
LOCK_ATTEMPTS = 10
LOCK_PAUSE = 0.2  # seconds between tries
LOCK_NOT_AVAILABLE = "55P03"
RESCUE_CHUNK = 10_000  # event ids in one statement that copies kept rows out
ARCHIVE_CHUNK = 2_000  # rows fetched at a time for the archive


T = TypeVar("T")


class ArchiveSink(Protocol):
    """What ``drop_before`` hands the rows it drops to (the archive writer)."""

    def write(self, model: type[Event], period: tuple[datetime, datetime], rows: Iterable[Event]) -> Any: ...


@dataclass(frozen=True)
class Partition:
    """One partition of the events table: ``start`` None is MINVALUE, ``end`` None is
    MAXVALUE; both None (and ``default``) for the default partition."""

    name: str
    start: datetime | None
    end: datetime | None
    default: bool = False


@dataclass
class Dropped:
    """What ``drop_before`` did: the partitions dropped, the rows that went with them, the rows
    copied out to survive, and how long the parent was locked in all."""

    partitions: list[str] = field(default_factory=list)
    rows: int = 0
    rescued: int = 0
    lock_seconds: float = 0.0


def _table() -> str:
    return Event._meta.db_table


def partition_name(start: datetime) -> str:
    """The name of the partition that starts at ``start``."""
    start = start.astimezone(UTC)
    suffix = start.strftime(DAY_FORMAT)
    if start.time() != datetime.min.time():
        suffix += start.strftime("_%H%M%S")
    return f"{_table()}{NAME_INFIX}{suffix}"


def default_name() -> str:
    return f"{_table()}{NAME_INFIX}{DEFAULT_SUFFIX}"


def day_start(moment: datetime) -> datetime:
    """Midnight UTC of ``moment``'s day: where its partition starts."""
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _aware(value: Any, name: str) -> datetime:
    """``value`` if it is an aware datetime: partition bounds are instants, and a naive time
    would be read in whatever zone the process runs in."""
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(name, "must be an aware datetime (a time zone set)")
    return value


def is_partitioned(alias: str) -> bool:
    """Whether the events table of ``alias`` is partitioned (PostgreSQL after migration 0005)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relkind FROM pg_class WHERE relname = %s AND pg_table_is_visible(oid)", [_table()]
        )
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


_BOUNDS = re.compile(r"FOR VALUES FROM \((?P<start>.+?)\) TO \((?P<end>.+?)\)")


def _bound(text: str) -> datetime | None:
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    return datetime.fromisoformat(text.strip("'")).astimezone(UTC)


def partitions(alias: str) -> list[Partition]:
    """The partitions of the events table, by start (the default partition last); empty where
    it is not partitioned."""
    if not is_partitioned(alias):
        return []
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [connection.ops.quote_name(_table())],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        match = _BOUNDS.match(bound)
        if match is None:
            found.append(Partition(name, None, None, default=True))
        else:
            found.append(Partition(name, _bound(match["start"]), _bound(match["end"])))
    early = datetime.min.replace(tzinfo=UTC)
    return sorted(found, key=lambda p: (p.default, p.start or early))


def _uncovered(start: datetime, end: datetime, existing: list[Partition]) -> tuple[datetime, datetime]:
    """The part of [start, end) no existing partition holds, assuming partitions that overlap
    it hold one end of it (empty, start >= end, when one holds all of it)."""
    for part in existing:
        if part.default:
            continue
        low = part.start or datetime.min.replace(tzinfo=UTC)
        high = part.end or datetime.max.replace(tzinfo=UTC)
        if low < end and high > start:
            if low <= start:
                start = max(start, high)
            else:
                end = min(end, low)
    return start, end


def _literal(moment: datetime) -> str:
    """A timestamp as SQL text: partition bounds are DDL, which takes no parameters."""
    return moment.astimezone(UTC).strftime("'%Y-%m-%d %H:%M:%S.%f+00'")


def _columns(quote: Any) -> str:
    return ", ".join(quote(f.column) for f in dialect.concrete_fields(Event))


def _retrying(step: Callable[[], T]) -> T:
    """``step()``, tried again while it fails for want of a lock (see LOCK_TIMEOUT)."""
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        try:
            return step()
        except OperationalError as exc:
            cause = exc.__cause__
            code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
            if code != LOCK_NOT_AVAILABLE or attempt == LOCK_ATTEMPTS:
                raise
        time.sleep(LOCK_PAUSE)
    raise AssertionError("unreachable")  # the last attempt returns or raises


def _create_one(alias: str, start: datetime, end: datetime) -> str | None:
    """In one transaction: the partition of what [start, end) no partition holds yet, with the
    default partition's rows of that range moved into it; its name, or None if none was needed."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    parent, column = quote(_table()), quote(str(Event._meta.get_field("occurred_at").column))
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        # Self-conflicting, so two workers never make the same partition; inserts pass it.
        cursor.execute(f"LOCK TABLE {parent} IN SHARE UPDATE EXCLUSIVE MODE")
        existing = partitions(alias)
        start, end = _uncovered(start, end, existing)
        if start >= end:
            return None
        name = partition_name(start)
        table, low, high = quote(name), _literal(start), _literal(end)
        cursor.execute(
            f"CREATE TABLE {table} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
            " INCLUDING STORAGE INCLUDING COMMENTS)"
        )
        default = next((p for p in existing if p.default), None)
        if default is not None:
            # What the attach takes anyway, taken before the move: no row of this range can
            # reach the default partition between the move and the attach's check of it.
            cursor.execute(f"LOCK TABLE {quote(default.name)} IN ACCESS EXCLUSIVE MODE")
            columns = _columns(quote)
            cursor.execute(
                f"WITH moved AS (DELETE FROM {quote(default.name)}"
                f" WHERE {column} >= {low} AND {column} < {high} RETURNING {columns})"
                f" INSERT INTO {table} ({columns}) SELECT {columns} FROM moved"
            )
        cursor.execute(f"ALTER TABLE {parent} ATTACH PARTITION {table} FOR VALUES FROM ({low}) TO ({high})")
    return name


def _make_days(alias: str, start: datetime, last: datetime) -> list[str]:
    """The missing day partitions from ``start``'s day to ``last``'s, each in its own
    transaction; the names made."""
    made = []
    start = day_start(start)
    while start <= last:
        name = _retrying(partial(_create_one, alias, start, start + PERIOD))
        if name is not None:
            made.append(name)
        start += PERIOD
    return made


def ensure_ahead(alias: str, now: datetime) -> list[str]:
    """Make the day partitions from ``now``'s day to ``now + AHEAD``'s that are missing, each in
    its own transaction; rows the default partition holds in such a day move into it. Returns
    the names made (none where the table is not partitioned). Safe to run from every worker."""
    now = _aware(now, "now")
    if not is_partitioned(alias):
        return []
    return _make_days(alias, now, now + AHEAD)


def ensure_days(alias: str, start: datetime, end: datetime) -> list[str]:
    """Make the partitions of the days [start, end) touches that no partition holds, each in
    its own transaction; rows the default partition holds in such a day move into it. For
    history written before its days had partitions (loaded, or restored from an archive), so
    that retention can drop those days whole. A day partitioned already is left as it is; a day
    inside a longer partition (the one of everything before migration 0005) is refused before
    anything is made, since that partition's rows cannot be split off without rewriting it.
    Returns the names made (none where the table is not partitioned)."""
    start, end = _aware(start, "start"), _aware(end, "end")
    if start >= end:
        raise InvalidArgument("end", "must be after start")
    if not is_partitioned(alias):
        return []
    last = day_start(end - timedelta(microseconds=1))
    first, stop = day_start(start), last + PERIOD
    for part in partitions(alias):
        low = part.start or datetime.min.replace(tzinfo=UTC)
        high = part.end or datetime.max.replace(tzinfo=UTC)
        a_day = high - low == PERIOD and low == day_start(low)
        if part.default or a_day or high <= first or low >= stop:
            continue
        raise InvalidArgument(
            "start",
            f"[{first.isoformat()}, {stop.isoformat()}) overlaps partition {part.name}, which holds more"
            " than a day: its days cannot be made",
        )
    return _make_days(alias, first, last)


def _rescued(rows: QuerySet[Event], kept: QuerySet[Occurrence], keep_job_events: bool) -> list[int]:
    """The ids among ``rows`` to copy out: the events of ``kept``, and those of no occurrence
    with ``keep_job_events``. Two reads, not one with an OR: an ``IN`` beside an OR cannot be
    a join, and PostgreSQL then searches the kept occurrences once per event (hours for a day
    of a million runs)."""
    found = list(rows.filter(occurrence__in=kept.values("pk")).values_list("pk", flat=True))
    if keep_job_events:
        found += rows.filter(occurrence__isnull=True).values_list("pk", flat=True)
    return found


def _in_range(alias: str, part: Partition) -> QuerySet[Event]:
    rows = Event.objects.using(alias).filter(occurred_at__lt=part.end)
    return rows if part.start is None else rows.filter(occurred_at__gte=part.start)


def _going(rows: QuerySet[Event], rescued: set[int]) -> Iterator[Event]:
    for row in rows.order_by("pk").iterator(chunk_size=ARCHIVE_CHUNK):
        if row.pk not in rescued:
            yield row


def _archive(archive: ArchiveSink, alias: str, part: Partition, rescued: set[int]) -> None:
    """Hand the rows that go to the archive. The partition of everything before the
    conversion has no lower bound: its period starts at its earliest row."""
    rows = _in_range(alias, part)
    assert part.end is not None  # drop_before passes bounded partitions only
    start = part.start
    if start is None:
        earliest = rows.order_by("occurred_at").values_list("occurred_at", flat=True).first()
        start = part.end if earliest is None else earliest
    archive.write(Event, (start, part.end), _going(rows, rescued))


def _detach_and_drop(alias: str, part: Partition, rescued: list[int]) -> float:
    """The locked step: detach the partition, copy the rows to keep back into the parent
    (where no partition holds their day now, so the default partition takes them), drop it.
    Returns the seconds the parent was locked, from the moment the detach had its lock."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    parent, table, columns = quote(_table()), quote(part.name), _columns(quote)
    key = quote(str(Event._meta.get_field("event_id").column))
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        # Django's foreign keys are deferred: checked now, the copied rows leave no check
        # pending that would keep the detached table from being dropped.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(f"ALTER TABLE {parent} DETACH PARTITION {table}")
        locked = time.monotonic()
        for begin in range(0, len(rescued), RESCUE_CHUNK):
            cursor.execute(
                f"INSERT INTO {parent} ({columns}) SELECT {columns} FROM {table} WHERE {key} = ANY(%s)",
                [rescued[begin : begin + RESCUE_CHUNK]],
            )
        cursor.execute(f"DROP TABLE {table}")
    return time.monotonic() - locked


def drop_before(
    alias: str,
    cutoff: datetime,
    *,
    kept: QuerySet[Occurrence],
    keep_job_events: bool,
    archive: ArchiveSink | None,
) -> Dropped:
    """Drop every partition that ends at or before ``cutoff`` (never the default one), each in
    its own short transaction. Rows that must stay are copied out first and land in the default
    partition: the events of occurrences in ``kept``, and with ``keep_job_events`` those of no
    occurrence. With an ``archive``, the rows that go are written to it first; if it raises,
    that partition stays whole and the error propagates. Nothing where the table is not
    partitioned."""
    cutoff = _aware(cutoff, "cutoff")
    done = Dropped()
    for part in partitions(alias):
        if part.default or part.end is None or part.end > cutoff:
            continue
        rows = _in_range(alias, part)
        # Read before the lock, once: events are append-only and no insert reaches a past day,
        # so the same rows are archived as go, and the same are copied out as were kept back.
        rescued = _rescued(rows, kept, keep_job_events)
        total = rows.count()
        if archive is not None:
            _archive(archive, alias, part, set(rescued))
        done.lock_seconds += _retrying(partial(_detach_and_drop, alias, part, rescued))
        done.partitions.append(part.name)
        done.rows += total - len(rescued)
        done.rescued += len(rescued)
    return done
