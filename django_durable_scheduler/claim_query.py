"""The claim's SQL: which principals have claimable work, and their first due occurrences,
read fairly across principals and locked without blocking other claimers.

Plain SQL where the ORM cannot say it (a loose index scan, a ``UNION ALL`` of per-principal
index ranges); it names only the columns it reads, each quoted from the model's ``_meta``
column names.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Min, Model, Q, Subquery
from django.utils.dateparse import parse_datetime

from .dialect import lock_rows
from .events import OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED
from .models import PENDING_STATUSES, Event, Job, Occurrence, OccurrenceStatus

# How many fair-ordered candidates to consider per wanted row: concurrent claimers skip
# each other's locked rows, and a larger pool lets each still fill its batch.
CANDIDATE_FACTOR = 4


def pending_due(now: datetime) -> Q:
    """Queued or waiting for a retry, and its time has come."""
    return Q(status__in=PENDING_STATUSES, available_at__lte=now)


def reclaim_due(now: datetime) -> Q:
    """Running, but its lease expired with attempts left: another claimer may take it."""
    return Q(status=OccurrenceStatus.RUNNING, lease_expires_at__lte=now, attempt__lt=F("max_attempts"))


# What settling reads of each held row under the lock: its state, lease, attempts and job
# (the returned occurrences load the rest on first access).
LEASE_FIELDS = (
    "occurrence_id",
    "job_id",
    "status",
    "attempt",
    "max_attempts",
    "fence",
    "lease_owner",
    "lease_expires_at",
)
# What a claim reads of each row it takes: the lease fields and what the handler is given.
CLAIM_FIELDS = (
    *LEASE_FIELDS,
    "scheduled_for",
    "available_at",
    "authority",
    "payload",
    "trigger_key",
    "job_revision",
    "idempotency_key",
    "created_at",
    "principal_key",
    "priority",
)


def column(connection: BaseDatabaseWrapper, model: type[Model], name: str) -> str:
    """The quoted column of ``model``'s field ``name``."""
    return connection.ops.quote_name(str(model._meta.get_field(name).column))  # type: ignore[union-attr]


# (occurrence_id, kind, principal_key, due_at, scheduled_for, priority, job timeout_ms) of one
# candidate.
Candidate = tuple[str, str, str, datetime, datetime, int, int | None]


class _Arms:
    """The claim's candidate reads as plain SQL, prepared once per claim: one arm per
    (principal, waiting status), each an index range in due order with a LIMIT, plus the
    expired leases of everyone, sent as one ``UNION ALL`` of derived tables (a form that
    PostgreSQL, SQLite and MySQL/MariaDB all accept), so a round of any number of
    principals is one round trip and no ORM compilation."""

    def __init__(self, alias: str, now: datetime, kinds: list[str] | None) -> None:
        connection = connections[alias]
        quote = connection.ops.quote_name
        o = {name: "o." + column(connection, Occurrence, name) for name in _OCCURRENCE_COLUMNS}
        j = {name: "j." + column(connection, Job, name) for name in _JOB_COLUMNS}
        self.now = connection.ops.adapt_datetimefield_value(now)
        tail = f" AND {j['enabled']} = %s"
        self.tail_params: list[Any] = [True]
        if kinds is not None:
            tail += f" AND {j['kind']} IN ({', '.join(['%s'] * len(kinds))})" if kinds else " AND 1 = 0"
            self.tail_params += kinds
        select = (
            f"SELECT {o['occurrence_id']}, {j['kind']}, {o['principal_key']},"
            f" {{due}}, {o['scheduled_for']}, {o['priority']}, {j['timeout_ms']}"
            f" FROM {quote(Occurrence._meta.db_table)} o{{hint}}"
            f" INNER JOIN {quote(Job._meta.db_table)} j ON {j['job_id']} = {o['job']}"
        )
        hint, self.literal = _fair_hint(connection)
        status = "'{status}'" if self.literal else "%s"
        self.pending = (
            select.format(due=o["available_at"], hint=hint)
            + f" WHERE {o['principal_key']} = %s AND {o['status']} = {status} AND {o['available_at']} <= %s"
            + tail
            + f" ORDER BY {o['available_at']}, {o['scheduled_for']}, {o['occurrence_id']} LIMIT %s"
        )
        # A principal's prioritized waiting rows (priority != 0), highest first, through the
        # partial index that holds only them: together with the pending arms restricted to
        # priority 0, each principal's first rows by (priority, due time) are in the pool.
        waiting = f"({o['status']} = %s OR {o['status']} = %s)"
        if self.literal:
            waiting = waiting.replace("%s", "'{}'").format(*PENDING_STATUSES)
        self.prioritized = (
            select.format(due=o["available_at"], hint=_index_hint(connection, PRIORITY_INDEX))
            + f" WHERE {o['principal_key']} = %s AND {waiting} AND NOT ({o['priority']} = 0)"
            + f" AND {o['available_at']} <= %s"
            + tail
            + f" ORDER BY {o['priority']} DESC, {o['available_at']}, {o['scheduled_for']},"
            + f" {o['occurrence_id']} LIMIT %s"
        )
        self.unprioritized = self.pending.replace(
            f" AND {o['available_at']} <= %s", f" AND {o['priority']} = 0 AND {o['available_at']} <= %s", 1
        )
        self.reclaim = (
            select.format(due=o["lease_expires_at"], hint="")
            + f" WHERE {o['status']} = %s AND {o['lease_expires_at']} <= %s"
            + f" AND {o['attempt']} < {o['max_attempts']}"
            + tail
            + f" ORDER BY {o['lease_expires_at']}, {o['scheduled_for']}, {o['occurrence_id']} LIMIT %s"
        )
        self.connection = connection
        self.parts: list[str] = []
        self.params: list[Any] = []

    def add_pending(self, principal: str, status: str, limit: int, *, zero_only: bool = False) -> None:
        """The principal's due rows of ``status`` in due order; ``zero_only``: of priority 0
        only (its prioritized rows come from :meth:`add_prioritized`)."""
        sql = self.unprioritized if zero_only else self.pending
        if self.literal:  # one of our own status constants, never outside input
            assert status in PENDING_STATUSES
            self.parts.append(sql.format(status=status))
            self.params += [principal, self.now, *self.tail_params, limit]
        else:
            self.parts.append(sql)
            self.params += [principal, status, self.now, *self.tail_params, limit]

    def add_prioritized(self, principal: str, limit: int) -> None:
        self.parts.append(self.prioritized)
        statuses = [] if self.literal else [s.value for s in PENDING_STATUSES]
        self.params += [principal, *statuses, self.now, *self.tail_params, limit]

    def add_reclaims(self, limit: int) -> None:
        self.parts.append(self.reclaim)
        self.params += [OccurrenceStatus.RUNNING.value, self.now, *self.tail_params, limit]

    def fetch(self) -> list[Candidate]:
        sql = " UNION ALL ".join(f"SELECT * FROM ({part}) a{n}" for n, part in enumerate(self.parts))
        with self.connection.cursor() as cursor:
            cursor.execute(sql, self.params)
            rows = cursor.fetchall()
        self.parts, self.params = [], []
        return [
            (
                pk,
                kind,
                key,
                _as_datetime(due),
                _as_datetime(at),
                int(priority),
                None if timeout is None else int(timeout),
            )
            for pk, kind, key, due, at, priority, timeout in rows
        ]


_JOB_COLUMNS = ("job_id", "kind", "enabled", "timeout_ms")
_OCCURRENCE_COLUMNS = (
    "occurrence_id",
    "job",
    "principal_key",
    "status",
    "available_at",
    "scheduled_for",
    "lease_expires_at",
    "attempt",
    "max_attempts",
    "priority",
)


# At most this many principals are listed per claim (rotation reaches the others).
MAX_PRINCIPALS = 1000
# A claim without ``after_principal`` reads the first rows of up to this many principals.
STATELESS_PRINCIPALS = 64


def _as_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    parsed = parse_datetime(str(value))  # SQLite hands raw queries text
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


FAIR_INDEX = "dsch_occurrences_fair"
PRIORITY_INDEX = "dsch_occurrences_priority"


def _index_hint(connection: BaseDatabaseWrapper, index: str) -> str:
    return f" INDEXED BY {index}" if connection.vendor == "sqlite" else ""


def has_prioritized(alias: str) -> bool:
    """Whether any waiting occurrence has a priority other than 0 (one probe of the partial
    ``dsch_occurrences_priority`` index, which holds only those): a claim reads the
    prioritized arms only then. False where the database has no partial indexes
    (MySQL/MariaDB): there, without an index to read them by, priority orders each
    principal's candidate rows, the first ones by due time (see ``claim_candidates``)."""
    connection = connections[alias]
    if not connection.features.supports_partial_indexes:
        return False
    quote = connection.ops.quote_name
    status = column(connection, Occurrence, "status")
    priority = column(connection, Occurrence, "priority")
    queued, retry = (f"'{s.value}'" for s in PENDING_STATUSES)  # our own constants
    sql = (
        f"SELECT 1 FROM {quote(Occurrence._meta.db_table)}{_index_hint(connection, PRIORITY_INDEX)}"
        f" WHERE ({status} = {queued} OR {status} = {retry}) AND NOT ({priority} = 0) LIMIT 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone() is not None


def _fair_hint(connection: BaseDatabaseWrapper) -> tuple[str, bool]:
    """(``INDEXED BY`` clause, whether statuses must be literals) for reads that must go
    through the partial ``dsch_occurrences_fair`` index. SQLite can use a partial index
    only when the query's terms, as written, imply its predicate: a ``status = ?``
    parameter does not (unless ANALYZE's stat4 data lets it re-plan with the bound value),
    and without statistics it then picks an index on ``status`` alone and walks the whole
    backlog. So on SQLite the statuses are written as literals (our own constants) and the
    index is named. Elsewhere nothing: PostgreSQL plans client-side-bound literals."""
    if connection.vendor == "sqlite":
        return f" INDEXED BY {FAIR_INDEX}", True
    return "", False


def waiting_principals(alias: str, now: datetime) -> dict[str, datetime]:
    """The principals with claimable work and, for each, when its earliest claimable
    occurrence became due (due waiting rows, and expired leases with attempts left).

    On PostgreSQL and SQLite a loose index scan over the partial ``dsch_occurrences_fair``
    index (waiting rows only, principal first): a recursive query that jumps from one
    principal to the next and reads each one's earliest queued and retry_wait row, so the
    cost grows with the number of principals, not with the backlog; the expired leases
    come from a GROUP BY in the same statement. Elsewhere (no partial indexes) one GROUP BY
    over the due rows through the claim index, and one over the expired leases: the
    portable fallback.
    """
    connection = connections[alias]
    base = Occurrence.objects.using(alias)
    found: dict[str, datetime] = {}
    if connection.vendor in ("postgresql", "sqlite"):
        quote = connection.ops.quote_name
        table, key = quote(Occurrence._meta.db_table), column(connection, Occurrence, "principal_key")
        status, available = (
            column(connection, Occurrence, "status"),
            column(connection, Occurrence, "available_at"),
        )
        queued, retry = OccurrenceStatus.QUEUED.value, OccurrenceStatus.RETRY_WAIT.value
        # Written as the index predicate is (an OR, not IN): SQLite matches partial indexes
        # by their terms, and only against literals (see _fair_hint).
        hint, literal = _fair_hint(connection)
        if literal:
            waiting = f"({status} = '{queued}' OR {status} = '{retry}')"
            first = f"(SELECT MIN({available}) FROM {table}{hint} WHERE {key} = p.k AND {status} = '{{}}')"
        else:
            waiting = f"({status} = %s OR {status} = %s)"
            first = f"(SELECT MIN({available}) FROM {table} WHERE {key} = p.k AND {status} = %s)"
        expires = column(connection, Occurrence, "lease_expires_at")
        attempt = column(connection, Occurrence, "attempt")
        max_attempts = column(connection, Occurrence, "max_attempts")
        # The expired leases (reclaims) of everyone ride along in the same statement.
        firsts = f"{first.format(queued)}, {first.format(retry)}" if literal else f"{first}, {first}"
        sql = (
            f"WITH RECURSIVE p(k) AS ("
            f" SELECT (SELECT MIN({key}) FROM {table}{hint} WHERE {waiting})"
            f" UNION ALL"
            f" SELECT (SELECT MIN({key}) FROM {table}{hint} WHERE {waiting} AND {key} > p.k)"
            f" FROM p WHERE p.k IS NOT NULL"
            f") SELECT * FROM (SELECT k, {firsts} FROM p WHERE k IS NOT NULL LIMIT %s) w"
            f" UNION ALL SELECT {key}, MIN({expires}), NULL FROM {table}"
            f" WHERE {status} = %s AND {expires} <= %s AND {attempt} < {max_attempts}"
            f" GROUP BY {key}"
        )
        params: list[Any] = [] if literal else [queued, retry, queued, retry, queued, retry]
        params.append(MAX_PRINCIPALS)
        params += [OccurrenceStatus.RUNNING.value, connection.ops.adapt_datetimefield_value(now)]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            for principal, *firsts in cursor.fetchall():
                due = [_as_datetime(v) for v in firsts if v is not None]
                if due and min(due) <= now:
                    earliest = min(due)
                    found[principal] = min(earliest, found.get(principal, earliest))
        return found
    rows = (
        base.filter(pending_due(now)).order_by().values("principal_key").annotate(first=Min("available_at"))
    )
    found = {row["principal_key"]: row["first"] for row in rows}
    expired = (
        base.filter(reclaim_due(now))
        .order_by()
        .values("principal_key")
        .annotate(first=Min("lease_expires_at"))
    )
    for row in expired:
        principal = row["principal_key"]
        found[principal] = min(row["first"], found.get(principal, row["first"]))
    return found


# How many of the newest events ``last_claimed_principal`` looks through: a burst of other
# events since the last claim (a bulk enqueue) costs a bounded read, not a walk of the log.
CURSOR_EVENTS = 1000


def last_claimed_principal(alias: str) -> str | None:
    """The ``principal_key`` of the newest claim among the last ``CURSOR_EVENTS`` events, or
    None: the round-robin cursor of a claimer that keeps none of its own, read from the
    database because many processes claim and each must continue the same rotation."""
    events = Event.objects.using(alias)
    newest = events.order_by("-pk").values("pk")[:1]
    latest = (
        events.filter(
            pk__gt=Subquery(newest) - CURSOR_EVENTS,
            event_type__in=(OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED),
        )
        .order_by("-pk")
        .values("occurrence_id")[:1]
    )
    return (
        Occurrence.objects.using(alias)
        .filter(pk=Subquery(latest))
        .order_by()
        .values_list("principal_key", flat=True)
        .first()
    )


def claim_candidates(
    alias: str,
    now: datetime,
    kinds: list[str] | None,
    limit: int,
    after_principal: str | None = None,
    waiting: dict[str, datetime] | None = None,
    before_lock: Callable[[list[str]], None] | None = None,
) -> list[Occurrence]:
    """Lock and return up to ``limit`` claimable occurrences, fair across principals.

    Fairness: rank each principal's due occurrences by due time and take rank 1 of every
    principal before rank 2 of any, so one principal's backlog cannot starve another's.
    Among principals of equal rank, those after ``after_principal`` (the last one served:
    the claimer's own cursor, or :func:`last_claimed_principal`) come first, in
    ``principal_key`` order round the ring: claims taking one at a time go round the
    principals instead of serving the earliest-due backlog again and again; without one
    (no claim yet), principals come in the order their earliest occurrence became due.

    The cost does not grow with one principal's backlog: the principals with work are
    listed by :func:`waiting_principals`, then each principal's first few due rows
    are read through ``dsch_occurrences_fair`` (principal, status, due time) with a LIMIT,
    queued and retry_wait arms apart so that each is one index range in due order, plus
    the expired leases (a reclaim) of everyone; one UNION ALL round trip (``_Arms``).
    The pool is then locked in rank order, ``limit`` rows at a time, re-checking
    the due state under the lock: only rows that are returned stay locked, so a
    concurrent claimer is never kept from rows this one does not take. ``waiting``: the
    principals, when the caller has listed them already (a hint: every row is re-checked).
    ``before_lock``: called with the pool's principal keys (sorted) before any occurrence row
    is locked, so that a caller can lock rows that come before occurrences in the lock order.
    """
    base = Occurrence.objects.using(alias)
    want = limit * CANDIDATE_FACTOR
    due = pending_due(now) | reclaim_due(now)
    if waiting is None:
        waiting = waiting_principals(alias, now)
    if not waiting:
        return []
    if after_principal is None:
        # No claimer history: rank 1 of the principals whose earliest occurrence is due
        # first, ordered by due time like the rest (STATELESS_PRINCIPALS at a time, so that
        # ties between principals go by the occurrences, not by the principals' names).
        principals = sorted(waiting, key=lambda key: (waiting[key], key))
        step = max(want, STATELESS_PRINCIPALS)
    else:
        principals = sorted(waiting)
        cut = sum(1 for key in principals if key <= after_principal)
        principals = principals[cut:] + principals[:cut]
        step = want
    arms = _Arms(alias, now, kinds)
    prioritized = has_prioritized(alias)
    by_principal: dict[str, dict[str, Candidate]] = {}
    # Rounds of ``step`` principals, in order, until the pool is full: principals whose
    # waiting work is all of kinds this claimer does not run (or of disabled jobs) give no
    # rows, and must not hide the principals after them.
    found = 0
    per_principal = 1
    for start in range(0, len(principals), step):
        chunk = principals[start : start + step]
        quota = -(-want // len(chunk))  # rows per principal of this round
        per_principal = max(per_principal, quota)
        for key in chunk:
            for status in PENDING_STATUSES:
                arms.add_pending(key, status, quota, zero_only=prioritized)
            if prioritized:
                arms.add_prioritized(key, quota)
        if start == 0:
            arms.add_reclaims(want)
        for row in arms.fetch():
            rows_of = by_principal.setdefault(row[2], {})
            if row[0] not in rows_of:  # a reclaim arm may list a row a pending arm has
                rows_of[row[0]] = row
                found += 1
        if found >= want:
            break
    order = {key: index for index, key in enumerate(principals)}
    ranked: list[tuple[int, int, Candidate]] = []
    for key, by_id in by_principal.items():
        # Higher priority first within a principal, then due time: ranks, and so the
        # turns principals take, do not depend on priority.
        rows = sorted(by_id.values(), key=lambda row: (-row[5], row[3], row[4], row[0]))
        position = order.get(key, len(order))
        ranked += [(rank, position, row) for rank, row in enumerate(rows[:per_principal])]
    if after_principal is None:
        ranked.sort(key=lambda item: (item[0], item[2][3], item[2][4], item[2][0]))
    else:
        ranked.sort(key=lambda item: (item[0], item[1], item[2][3], item[2][4], item[2][0]))
    pool = [row for _, _, row in ranked[:want]]
    kind_of = {row[0]: row[1] for row in pool}
    timeout_of = {row[0]: row[6] for row in pool}
    if before_lock is not None and pool:
        before_lock(sorted({row[2] for row in pool}))
    rank = {row[0]: index for index, row in enumerate(pool)}
    # The candidate reads join jobs (enabled, kind). Re-checking that under FOR UPDATE would lock
    # job rows too on MySQL (no OF), making claimers skip each other's jobs; so the locking
    # query re-checks only the occurrence's own due state, which is what races.
    got: list[Occurrence] = []
    position = 0
    ids = [row[0] for row in pool]
    while len(got) < limit and position < len(ids):
        chunk = ids[position : position + limit - len(got)]
        position += len(chunk)
        got += lock_rows(base.filter(due, pk__in=chunk).order_by().only(*CLAIM_FIELDS), alias)
    got.sort(key=lambda row: rank[row.pk])
    for occurrence in got:
        occurrence.claimed_kind = kind_of[occurrence.pk]
        occurrence.claimed_timeout_ms = timeout_of[occurrence.pk]
    return got


_COLUMNS: dict[tuple[str, type[Model]], tuple[str, str, list[Any]]] = {}
