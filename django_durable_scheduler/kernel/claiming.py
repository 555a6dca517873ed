"""Claiming: taking due occurrences for a worker, fairly across principals, and handing the
batch to the authority checks before any handler starts (docs/design.md, "Fair claiming").

This module owns the claim from the worker's call to the commit: it reads which principals
have work, reads each one's first due rows, locks them without blocking other claimers, makes
them running and appends their events; :func:`claim_authorized` then has
``reservations.authorize_claimed`` charge or refuse them in the same transaction.

The SQL is written out below, one statement per purpose; ``_STATEMENTS`` says which each
database gets. PostgreSQL and SQLite read the partial indexes (a loose index scan over the
principals, one index range per principal and status); MySQL/MariaDB, which have no partial
indexes, list the principals with a ``GROUP BY`` over the claim index (the portable form).
``{o.status}``-style names are the models' columns (``o`` occurrences, ``j`` jobs, ``e``
events), filled in from ``_meta`` once per connection; the statuses are written as literals
because SQLite uses a partial index only when the query's own terms imply its predicate;
every other value is a bound parameter.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, NamedTuple

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model
from django.utils.dateparse import parse_datetime

from .. import conf
from ..db.dialect import alias_for, insert_rows, write_transaction
from ..exceptions import InvalidArgument
from ..models import Event, Job, Occurrence, OccurrenceStatus
from ..rules.events import OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED, new_event
from ..rules.lifecycle import CLAIMABLE_SQL, RECLAIMABLE_SQL, Action, applied, event_of, writes
from ..rules.validation import iso_ms, normalize_bool, normalize_identifier, normalize_int, to_duration_ms
from . import concurrency, reservations, settling
from .reservations import AuthorizedClaim, Units

FAIR_INDEX = "dsch_occurrences_fair"  # (principal_key, status, available_at, ...) of waiting rows
PRIORITY_INDEX = "dsch_occurrences_priority"  # waiting rows whose priority is not 0
CLAIM_INDEX = "dsch_occurrences_claim"  # (status, available_at, lease_expires_at, ...): all rows

# How many fair-ordered candidates to consider per wanted row: concurrent claimers skip
# each other's locked rows, and a larger pool lets each still fill its batch.
CANDIDATE_FACTOR = 4
# At most this many principals are listed per claim (rotation reaches the others).
MAX_PRINCIPALS = 1000
# A claim without ``after_principal`` reads the first rows of up to this many principals.
STATELESS_PRINCIPALS = 64
# How many of the newest events ``last_claimed_principal`` looks through: a burst of other
# events since the last claim (a bulk enqueue) costs a bounded read, not a walk of the log.
CURSOR_EVENTS = 1000

# What a claim reads of each row it takes: what settling reads and what the handler is given
# (every field ``runs.Run.of`` reads: one left out is loaded by a query per claimed row). Each
# column once, though LEASE_FIELDS names some of them too.
CLAIM_FIELDS = tuple(
    dict.fromkeys(
        (
            *settling.LEASE_FIELDS,
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
            "trace_context",  # the run's span continues the enqueuer's trace (tracing.py)
            "cause",  # what a follow-up or a batch's callback sees (ctx.predecessor, ctx.batch)
        )
    )
)

# --------------------------------------------------------------------------- the SQL

# The principals with claimable work (PostgreSQL, SQLite): a loose index scan of the fair
# index, jumping from one principal to the next, with each one's earliest queued and
# retry_wait times; then the principals of expired leases with attempts left. The waiting
# terms are written as the index predicate is (an OR, not IN).
PRINCIPALS_LOOSE_SCAN = """
WITH RECURSIVE p(k) AS (
    SELECT (SELECT MIN({o.principal_key}) FROM {occurrences}{by_fair_index}
            WHERE ({o.status} = {queued} OR {o.status} = {retry_wait}))
    UNION ALL
    SELECT (SELECT MIN({o.principal_key}) FROM {occurrences}{by_fair_index}
            WHERE ({o.status} = {queued} OR {o.status} = {retry_wait}) AND {o.principal_key} > p.k)
    FROM p WHERE p.k IS NOT NULL
)
SELECT * FROM (
    SELECT k,
        (SELECT MIN({o.available_at}) FROM {occurrences}{by_fair_index}
         WHERE {o.principal_key} = p.k AND {o.status} = {queued}),
        (SELECT MIN({o.available_at}) FROM {occurrences}{by_fair_index}
         WHERE {o.principal_key} = p.k AND {o.status} = {retry_wait})
    FROM p WHERE k IS NOT NULL LIMIT %(principals)s
) w
UNION ALL
SELECT {o.principal_key}, MIN({o.lease_expires_at}), NULL FROM {occurrences}
WHERE {reclaimable_at_now}
GROUP BY {o.principal_key}
"""

# The principals with claimable work (MySQL/MariaDB, and the portable form): due waiting
# rows and expired leases, each grouped through the claim index.
PRINCIPALS_GROUPED = """
SELECT {o.principal_key}, MIN({o.available_at}), NULL FROM {occurrences}{by_claim_index}
WHERE {claimable_at_now}
GROUP BY {o.principal_key}
UNION ALL
SELECT {o.principal_key}, MIN({o.lease_expires_at}), NULL FROM {occurrences}{by_claim_index}
WHERE {reclaimable_at_now}
GROUP BY {o.principal_key}
"""

# Whether any waiting row has a priority other than 0: the first entry of the partial index
# that holds only those (empty unless tasks set a priority).
PRIORITY_PROBE = """
SELECT 1 FROM {occurrences}{by_priority_index}
WHERE ({o.status} = {queued} OR {o.status} = {retry_wait}) AND NOT ({o.priority} = 0)
LIMIT 1
"""

# The arms of the fair pool, one per (principal, waiting status), each one index range in due
# order; sent together as one UNION ALL. A candidate row is (occurrence_id, kind,
# principal_key, due at, scheduled_for, priority, the job's timeout_ms, job_id,
# concurrency_key, the job's concurrency).
PENDING_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.available_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}
FROM {occurrences}{by_fair_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {o.principal_key} = %s AND {o.status} = {status} AND {o.available_at} <= %s
  AND {j.enabled} = %s{of_kinds}
ORDER BY {o.available_at}, {o.scheduled_for}, {o.occurrence_id}
LIMIT %s
"""

# The same, of priority 0 only: when prioritized rows exist, those come from PRIORITIZED_ARM.
PENDING_PRIORITY_0_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.available_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}
FROM {occurrences}{by_fair_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {o.principal_key} = %s AND {o.status} = {status} AND {o.priority} = 0 AND {o.available_at} <= %s
  AND {j.enabled} = %s{of_kinds}
ORDER BY {o.available_at}, {o.scheduled_for}, {o.occurrence_id}
LIMIT %s
"""

# A principal's due rows of priority other than 0, highest first, through the priority index.
PRIORITIZED_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.available_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}
FROM {occurrences}{by_priority_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {o.principal_key} = %s AND ({o.status} = {queued} OR {o.status} = {retry_wait})
  AND NOT ({o.priority} = 0) AND {o.available_at} <= %s
  AND {j.enabled} = %s{of_kinds}
ORDER BY {o.priority} DESC, {o.available_at}, {o.scheduled_for}, {o.occurrence_id}
LIMIT %s
"""

# Everyone's expired leases with attempts left (a reclaim), through the claim index.
RECLAIM_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.lease_expires_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}
FROM {occurrences}{by_claim_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {reclaimable}
  AND {j.enabled} = %s{of_kinds}
ORDER BY {o.lease_expires_at}, {o.scheduled_for}, {o.occurrence_id}
LIMIT %s
"""

# Lock the chosen candidates that are still due, skipping rows another claimer holds. The job
# (enabled, kind) is not re-checked here: on MySQL that would lock job rows too (no OF), and
# claimers would skip each other's jobs; the occurrence's own due state is what races.
# The key is the only condition an index can serve: the due state is re-checked in a CASE,
# which matches no index and no partial index's predicate, so the rows are read through the
# primary key whatever the statistics say (given the status terms, PostgreSQL would read the
# fair and claim indexes instead when its statistics say few rows wait, as they do before
# autovacuum has analyzed a table that grew).
LOCK = """
SELECT {claim_columns} FROM {occurrences}
WHERE {o.occurrence_id} IN ({ids})
  AND CASE WHEN {claimable} THEN 1 WHEN {reclaimable} THEN 1 ELSE 0 END = 1
{for_update}"""

# Whether anything is claimable (a read without locks): a due waiting row or an expired lease
# with attempts left, of an enabled job of these kinds.
DUE = """
SELECT 1 FROM (
    SELECT {o.occurrence_id} FROM {occurrences}{by_claim_index}
    JOIN {jobs} ON {j.job_id} = {o.job}
    WHERE {claimable}
      AND {j.enabled} = %s{of_kinds}
    LIMIT 1
) due_row
UNION ALL
SELECT 1 FROM (
    SELECT {o.occurrence_id} FROM {occurrences}{by_claim_index}
    JOIN {jobs} ON {j.job_id} = {o.job}
    WHERE {reclaimable}
      AND {j.enabled} = %s{of_kinds}
    LIMIT 1
) expired_row
"""

# The principal of the newest claim among the last CURSOR_EVENTS events.
CURSOR = """
SELECT {o.principal_key} FROM {occurrences}
WHERE {o.occurrence_id} = (
    SELECT {e.occurrence} FROM {events}
    WHERE {e.event_id} > (SELECT MAX({e.event_id}) FROM {events}) - %(window)s
      AND {e.event_type} IN (%(claimed)s, %(reclaimed)s)
    ORDER BY {e.event_id} DESC
    LIMIT 1
)
"""

# The statements of each database, by purpose: (text, the status it reads, where one text
# serves two). MySQL/MariaDB have no partial indexes: there, no loose scan and no priority
# probe or arms (priority orders each principal's candidate rows instead).
_EVERYWHERE: dict[str, tuple[str, OccurrenceStatus | None]] = {
    "queued": (PENDING_ARM, OccurrenceStatus.QUEUED),
    "retry_wait": (PENDING_ARM, OccurrenceStatus.RETRY_WAIT),
    "reclaims": (RECLAIM_ARM, None),
    "due": (DUE, None),
    "cursor": (CURSOR, None),
}
_PORTABLE = {**_EVERYWHERE, "principals": (PRINCIPALS_GROUPED, None)}
_PARTIAL_INDEXES = {
    **_EVERYWHERE,
    "principals": (PRINCIPALS_LOOSE_SCAN, None),
    "priority_probe": (PRIORITY_PROBE, None),
    "queued_priority_0": (PENDING_PRIORITY_0_ARM, OccurrenceStatus.QUEUED),
    "retry_wait_priority_0": (PENDING_PRIORITY_0_ARM, OccurrenceStatus.RETRY_WAIT),
    "prioritized": (PRIORITIZED_ARM, None),
}
_STATEMENTS = {"postgresql": _PARTIAL_INDEXES, "sqlite": _PARTIAL_INDEXES, "mysql": _PORTABLE}

# How each database is told which index to read, where its planner may pick one that walks a
# principal's or a job's whole history (SQLite without statistics, and with them for a join;
# MariaDB with them). PostgreSQL plans these well by itself.
_INDEX_HINTS = {"sqlite": " INDEXED BY {}", "mysql": " FORCE INDEX ({})"}


def _names(connection: BaseDatabaseWrapper) -> dict[str, Any]:
    """What the statements' ``{...}`` names stand for on this connection: each model's
    columns by field name (each qualified by its table), the tables,
    the statuses, the index hints (``_INDEX_HINTS``) and the locking clause."""
    quote = connection.ops.quote_name

    def columns(model: type[Model]) -> SimpleNamespace:
        table = quote(model._meta.db_table)
        found = {}
        for field in model._meta.concrete_fields:
            found[field.name] = found[field.attname] = f"{table}.{quote(str(field.column))}"
        return SimpleNamespace(**found)

    hint = _INDEX_HINTS.get(connection.vendor, "")
    if connection.vendor == "sqlite":
        for_update = ""  # the transaction already holds the database's write lock
    elif connection.features.has_select_for_update_skip_locked:
        for_update = "FOR UPDATE SKIP LOCKED"
    else:
        for_update = "FOR UPDATE"
    names = {
        "o": columns(Occurrence),
        "j": columns(Job),
        "e": columns(Event),
        "occurrences": quote(Occurrence._meta.db_table),
        "jobs": quote(Job._meta.db_table),
        "events": quote(Event._meta.db_table),
        **{status.value: f"'{status.value}'" for status in OccurrenceStatus},  # our own constants
        "by_fair_index": hint.format(FAIR_INDEX),
        "by_priority_index": hint.format(PRIORITY_INDEX),
        "by_claim_index": hint.format(CLAIM_INDEX),
        "for_update": for_update,
    }
    # The claim's and the reclaim's conditions (lifecycle.py), with a positional time
    # parameter, or the one named ``now``.
    for name, condition in (("claimable", CLAIMABLE_SQL), ("reclaimable", RECLAIMABLE_SQL)):
        names[name] = condition.format(**names, now="%s")
        names[f"{name}_at_now"] = condition.format(**names, now="%(now)s")
    return names


@functools.cache
def _statements(alias: str, vendor: str, kinds: int | None) -> dict[str, str]:
    """The claim's statements on ``alias``, filled in once: ``kinds`` is how many kinds the
    candidates are restricted to (None: all)."""
    connection = connections[alias]
    names = _names(connection)
    if kinds is None:
        names["of_kinds"] = ""
    elif kinds == 0:
        names["of_kinds"] = " AND 1 = 0"
    else:
        names["of_kinds"] = f" AND {names['j'].kind} IN ({', '.join(['%s'] * kinds)})"
    return {
        name: text.format(**names, status=f"'{status.value}'" if status else "")
        for name, (text, status) in _STATEMENTS.get(vendor, _PORTABLE).items()
    }


@functools.cache
def _lock_statement(alias: str, vendor: str, ids: int) -> str:
    names = _names(connections[alias])
    columns = ", ".join(getattr(names["o"], name) for name in CLAIM_FIELDS)
    return LOCK.format(**names, claim_columns=columns, ids=", ".join(["%s"] * ids))


def _sql(alias: str, kinds: list[str] | None = None) -> dict[str, str]:
    return _statements(alias, connections[alias].vendor, None if kinds is None else len(kinds))


def statements(alias: str = "default") -> dict[str, tuple[str, list[Any] | dict[str, Any]]]:
    """Every statement a claim sends on ``alias``, by purpose, with sample arguments
    (a principal, now, a lock of two ids): what a test explains to check the plans."""
    now = _adapted(alias, conf.now())
    sql = _sql(alias)
    principal = '["user","sample"]'
    params: dict[str, list[Any] | dict[str, Any]] = {
        "principals": {"principals": MAX_PRINCIPALS, "now": now},
        "priority_probe": [],
        "reclaims": [now, True, 8],
        "due": [now, True, now, True],
        "cursor": _cursor_params(),
    }
    found: dict[str, tuple[str, list[Any] | dict[str, Any]]] = {}
    for name, text in sql.items():
        found[name] = (text, params.get(name, [principal, now, True, 8]))
    found["lock"] = (_lock_statement(alias, connections[alias].vendor, 2), ["a", "b", now, now])
    return found


def _adapted(alias: str, moment: datetime) -> Any:
    return connections[alias].ops.adapt_datetimefield_value(moment)


def _as_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    parsed = parse_datetime(str(value))  # SQLite hands raw queries text
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _fetch(alias: str, sql: str, params: list[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


# --------------------------------------------------------------------------- reads


def waiting_principals(alias: str, now: datetime) -> dict[str, datetime]:
    """The principals with claimable work and, for each, when its earliest claimable
    occurrence became due (due waiting rows, and expired leases with attempts left). Its cost
    grows with the number of principals, not with the backlog (``principals`` above)."""
    found: dict[str, datetime] = {}
    params = {"principals": MAX_PRINCIPALS, "now": _adapted(alias, now)}
    for principal, *firsts in _fetch(alias, _sql(alias)["principals"], params):
        due = [_as_datetime(value) for value in firsts if value is not None]
        if due and min(due) <= now:
            earliest = min(due)
            found[principal] = min(earliest, found.get(principal, earliest))
    return found


def has_prioritized(alias: str) -> bool:
    """Whether any waiting occurrence has a priority other than 0: a claim reads the
    prioritized arms only then. False where the database has no partial indexes
    (MySQL/MariaDB): there priority orders each principal's candidate rows, the first ones by
    due time (see :func:`claim_candidates`)."""
    probe = _sql(alias).get("priority_probe")
    return probe is not None and bool(_fetch(alias, probe, []))


def _cursor_params() -> dict[str, Any]:
    return {"window": CURSOR_EVENTS, "claimed": OCCURRENCE_CLAIMED, "reclaimed": OCCURRENCE_RECLAIMED}


def last_claimed_principal(alias: str) -> str | None:
    """The ``principal_key`` of the newest claim among the last ``CURSOR_EVENTS`` events, or
    None: the round-robin cursor of a claimer that keeps none of its own, read from the
    database because many processes claim and each must continue the same rotation."""
    rows = _fetch(alias, _sql(alias)["cursor"], _cursor_params())
    return str(rows[0][0]) if rows else None


class Candidate(NamedTuple):
    """One row the fair pool's arms read: a claimable occurrence, what ranks it and what its
    concurrency limits are found by (the claim's columns are read only for the rows locked)."""

    occurrence_id: str
    kind: str
    principal_key: str
    due_at: datetime  # available_at, or lease_expires_at for a reclaim
    scheduled_for: datetime
    priority: int
    timeout_ms: int | None  # the job's
    job_id: str
    concurrency_key: str | None
    concurrency: int | None  # the job's

    @property
    def due_order(self) -> tuple[datetime, datetime, str]:
        """The order of a principal's candidates of equal priority: the claim's ORDER BY."""
        return self.due_at, self.scheduled_for, self.occurrence_id


class _Pool:
    """One round of the fair pool's arms, sent as one ``UNION ALL`` of derived tables (a form
    PostgreSQL, SQLite and MySQL/MariaDB all accept): one round trip for any number of
    principals."""

    def __init__(self, alias: str, now: datetime, kinds: list[str] | None) -> None:
        self.alias = alias
        self.sql = _sql(alias, kinds)
        self.now = _adapted(alias, now)
        self.job_params: list[Any] = [True, *(kinds or [])]
        self.parts: list[str] = []
        self.params: list[Any] = []

    def add(self, arm: str, principal: str | None, limit: int) -> None:
        self.parts.append(self.sql[arm])
        self.params += [*([] if principal is None else [principal]), self.now, *self.job_params, limit]

    def fetch(self) -> list[Candidate]:
        sql = " UNION ALL ".join(f"SELECT * FROM ({part}) a{n}" for n, part in enumerate(self.parts))
        rows = _fetch(self.alias, sql, self.params)
        self.parts, self.params = [], []
        return [
            Candidate(
                pk,
                kind,
                key,
                _as_datetime(due),
                _as_datetime(at),
                int(priority),
                None if ms is None else int(ms),
                job,
                limit_key,
                None if limit is None else int(limit),
            )
            for pk, kind, key, due, at, priority, ms, job, limit_key, limit in rows
        ]


def _rotation(waiting: dict[str, datetime], after_principal: str | None, want: int) -> tuple[list[str], int]:
    """The principals in the order they take turns, and how many to read per round."""
    if after_principal is None:
        # No claimer history: rank 1 of the principals whose earliest occurrence is due
        # first, ordered by due time like the rest (STATELESS_PRINCIPALS at a time, so that
        # ties between principals go by the occurrences, not by the principals' names).
        return sorted(waiting, key=lambda key: (waiting[key], key)), max(want, STATELESS_PRINCIPALS)
    principals = sorted(waiting)
    cut = sum(1 for key in principals if key <= after_principal)
    return principals[cut:] + principals[:cut], want


def _read_pool(
    alias: str, now: datetime, kinds: list[str] | None, principals: list[str], step: int, want: int
) -> tuple[dict[str, dict[str, Candidate]], int]:
    """Each principal's first due rows, by principal, in rounds of ``step`` principals until
    ``want`` are found: principals whose waiting work is all of kinds this claimer does not
    run (or of disabled jobs) give no rows, and must not hide the principals after them.
    Also returns how many rows per principal the largest round read."""
    pool = _Pool(alias, now, kinds)
    prioritized = has_prioritized(alias)
    pending = ("queued_priority_0", "retry_wait_priority_0") if prioritized else ("queued", "retry_wait")
    by_principal: dict[str, dict[str, Candidate]] = {}
    found = 0
    per_principal = 1
    for start in range(0, len(principals), step):
        chunk = principals[start : start + step]
        quota = -(-want // len(chunk))  # rows per principal of this round
        per_principal = max(per_principal, quota)
        for key in chunk:
            for arm in pending:
                pool.add(arm, key, quota)
            if prioritized:
                pool.add("prioritized", key, quota)
        if start == 0:
            pool.add("reclaims", None, want)
        for row in pool.fetch():
            rows_of = by_principal.setdefault(row.principal_key, {})
            if row.occurrence_id not in rows_of:  # a reclaim arm may list a row a pending arm has
                rows_of[row.occurrence_id] = row
                found += 1
        if found >= want:
            break
    return by_principal, per_principal


def _ranked(
    by_principal: dict[str, dict[str, Candidate]],
    per_principal: int,
    principals: list[str],
    by_due_time: bool,
) -> list[Candidate]:
    """The candidates in fair order: rank 1 of every principal before rank 2 of any; within a
    rank, in turn order (or by due time, ``by_due_time``, for a claimer without history)."""
    order = {key: index for index, key in enumerate(principals)}
    ranked: list[tuple[int, int, Candidate]] = []
    for key, by_id in by_principal.items():
        # Higher priority first within a principal, then due time: ranks, and so the
        # turns principals take, do not depend on priority.
        rows = sorted(by_id.values(), key=lambda row: (-row.priority, *row.due_order))
        position = order.get(key, len(order))
        ranked += [(rank, position, row) for rank, row in enumerate(rows[:per_principal])]
    if by_due_time:
        ranked.sort(key=lambda item: (item[0], *item[2].due_order))
    else:
        ranked.sort(key=lambda item: (item[0], item[1], *item[2].due_order))
    return [row for _, _, row in ranked]


def _lock_pool(
    alias: str, now: datetime, pool: list[Candidate], limit: int, gate: concurrency.Gate | None = None
) -> list[Occurrence]:
    """Lock up to ``limit`` of the pool's rows, in pool order, ``limit`` at a time, re-checking
    the due state under the lock: only rows returned stay locked, so a concurrent claimer is
    never kept from rows this one does not take. With a ``gate``, a row over one of its
    concurrency limits is passed over (left as it is) and the next ones are tried."""
    vendor = connections[alias].vendor
    rank = {row.occurrence_id: index for index, row in enumerate(pool)}
    at = _adapted(alias, now)
    got: list[Occurrence] = []
    position = 0
    while len(got) < limit and position < len(pool):
        chunk = [row.occurrence_id for row in pool[position : position + limit - len(got)]]
        position += len(chunk)
        sql = _lock_statement(alias, vendor, len(chunk))
        locked = Occurrence.objects.raw(sql, [*chunk, at, at], using=alias)
        if gate is None:
            got += locked
        else:  # in rank order: the first of a limit's candidates take its free places
            got += [row for row in sorted(locked, key=lambda row: rank[row.pk]) if gate.admit(row)]
    got.sort(key=lambda row: rank[row.pk])
    for occurrence in got:
        row = pool[rank[occurrence.pk]]
        occurrence.claimed_kind = row.kind
        occurrence.claimed_timeout_ms = row.timeout_ms
    return got


def claim_candidates(
    alias: str,
    now: datetime,
    kinds: list[str] | None,
    limit: int,
    after_principal: str | None = None,
    waiting: dict[str, datetime] | None = None,
    before_lock: Callable[[list[str]], None] | None = None,
    max_running_of: Callable[[list[str]], dict[str, int]] | None = None,
) -> list[Occurrence]:
    """Lock and return up to ``limit`` claimable occurrences, fair across principals.

    Fairness: rank each principal's due occurrences by due time and take rank 1 of every
    principal before rank 2 of any, so one principal's backlog cannot starve another's.
    Among principals of equal rank, those after ``after_principal`` (the last one served:
    the claimer's own cursor, or :func:`last_claimed_principal`) come first, in
    ``principal_key`` order round the ring; without one (no claim yet), principals come in
    the order their earliest occurrence became due.

    The cost does not grow with one principal's backlog: the principals with work are listed
    by :func:`waiting_principals`, then each one's first few due rows are read (``_Pool``),
    ``limit * CANDIDATE_FACTOR`` of them, and locked in rank order. ``waiting``: the
    principals, when the caller has listed them already (a hint: every row is re-checked).
    ``before_lock``: called with the pool's principal keys (sorted) before any occurrence row
    is locked, so that a caller can lock rows that come before occurrences in the lock order.
    ``max_running_of``: the principals' running caps (default: read from their policies);
    with any limit among the pool, its slots are locked next (:class:`concurrency.Gate`).
    """
    want = limit * CANDIDATE_FACTOR
    if waiting is None:
        waiting = waiting_principals(alias, now)
    if not waiting:
        return []
    principals, step = _rotation(waiting, after_principal, want)
    by_principal, per_principal = _read_pool(alias, now, kinds, principals, step, want)
    pool = _ranked(by_principal, per_principal, principals, after_principal is None)[:want]
    if not pool:
        return []
    principal_keys = sorted({row.principal_key for row in pool})
    if before_lock is not None:
        before_lock(principal_keys)
    gate = _gate(alias, now, pool, principal_keys, max_running_of)
    got = _lock_pool(alias, now, pool, limit, gate)
    if gate is not None:
        gate.save()
    return got


def _keys_at_claim(alias: str, pool: list[Candidate]) -> dict[str, str | None]:
    """The handler's concurrency key of candidates enqueued where their handler was not
    registered (a process that never imported it): computed here from the payload, one read
    for those only; a payload it cannot key counts under the kind as a whole."""
    unkeyed = [
        row.occurrence_id
        for row in pool
        if row.concurrency_key is None and concurrency.key_spec_of(None, row.kind) is not None
    ]
    if not unkeyed:
        return {}
    kinds = {row.occurrence_id: row.kind for row in pool}
    found: dict[str, str | None] = {}
    for pk, payload in Occurrence.objects.using(alias).filter(pk__in=unkeyed).values_list("pk", "payload"):
        try:
            found[pk] = concurrency.render_key(concurrency.key_spec_of(None, kinds[pk]), payload)
        except InvalidArgument:
            found[pk] = None
    return found


def _gate(
    alias: str,
    now: datetime,
    pool: list[Candidate],
    principal_keys: list[str],
    max_running_of: Callable[[list[str]], dict[str, int]] | None,
) -> concurrency.Gate | None:
    """The pool's concurrency limits, their slots locked; None (nothing sent) when no
    candidate has one."""
    if max_running_of is None:
        capped = concurrency.max_running_of(principal_keys, alias)
    else:
        capped = max_running_of(principal_keys)
    keys = _keys_at_claim(alias, pool)
    limits = {}
    for row in pool:
        key = keys.get(row.occurrence_id, row.concurrency_key)
        cap = capped.get(row.principal_key)
        found = concurrency.scopes_of(row.principal_key, row.job_id, row.kind, key, row.concurrency, cap)
        if found:
            limits[row.occurrence_id] = found
    if not limits:
        return None
    gate = concurrency.Gate(alias, now, limits)
    gate.lock()
    return gate


# --------------------------------------------------------------------------- claims


def _kinds(kinds: Any) -> list[str] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise InvalidArgument("kinds", "must be a list of kinds or None")
    return sorted({normalize_identifier(k, f"kinds[{i}]", max_length=128) for i, k in enumerate(kinds)})


@dataclass(frozen=True)
class ClaimPlan:
    """A checked claim request and what was read before its transaction (see
    :func:`plan_claim`)."""

    owner: str
    now: datetime
    expires: datetime
    kinds: list[str] | None
    limit: int
    after_principal: str | None
    waiting: dict[str, datetime]


def plan_claim(
    *,
    owner: str,
    lease: float | timedelta,
    limit: int = 1,
    kinds: Iterable[str] | None = None,
    after_principal: str | None = None,
    sweep_expired: bool = True,
    using: str | None = None,
) -> ClaimPlan | None:
    """The arguments of :func:`claim_batch` checked, and the principals with work read
    before the transaction; None when nobody has any (an idle worker's every turn is then one
    statement and no transaction). The rows are re-checked under the lock anyway."""
    owner = normalize_identifier(owner, "owner")
    lease_ms = to_duration_ms(lease, "lease", minimum_ms=1, maximum_ms=settling.MAX_LEASE_MS)
    limit = normalize_int(limit, "limit", minimum=1, maximum=conf.settings.MAX_CLAIM_BATCH)
    kind_list = _kinds(kinds)
    if after_principal is not None and not isinstance(after_principal, str):
        # Only compared with principal keys in Python, never stored or sent to the database.
        raise InvalidArgument("after_principal", "must be a principal key (a string) or None")
    if normalize_bool(sweep_expired, "sweep_expired"):
        # The worker sweeps on its own schedule instead of before every claim.
        settling.dead_letter_expired(using=using)
    now = conf.now()
    waiting = waiting_principals(alias_for(using), now)
    if not waiting:
        return None
    if after_principal is None and len(waiting) > 1:  # with one principal there is no turn to take
        after_principal = last_claimed_principal(alias_for(using))
    return ClaimPlan(
        owner, now, now + timedelta(milliseconds=lease_ms), kind_list, limit, after_principal, waiting
    )


def claim_planned(
    plan: ClaimPlan,
    alias: str,
    *,
    before_lock: Callable[[list[str]], None] | None = None,
    max_running_of: Callable[[list[str]], dict[str, int]] | None = None,
) -> list[Occurrence]:
    """The body of :func:`claim_batch`, inside the caller's write transaction on ``alias``:
    lock the fair batch, make it running and append its events. ``before_lock`` is called
    with the candidates' principal keys before any occurrence row is locked (see
    :func:`claim_candidates`)."""
    owner, now, expires = plan.owner, plan.now, plan.expires
    rows = claim_candidates(
        alias,
        now,
        plan.kinds,
        plan.limit,
        plan.after_principal,
        plan.waiting,
        before_lock=before_lock,
        max_running_of=max_running_of,
    )
    if not rows:
        return []
    # Claim and reclaim set the same columns (lifecycle.TRANSITIONS): one UPDATE for both.
    values = writes(Action.CLAIM, now, lease_owner=owner, lease_expires_at=expires)
    Occurrence.objects.using(alias).filter(pk__in=[row.pk for row in rows]).update(**values)
    events = []
    for row in rows:
        reclaimed = row.status == OccurrenceStatus.RUNNING
        data: dict[str, Any] = {
            "attempt": row.attempt + 1,
            "maxAttempts": row.max_attempts,
            "leaseExpiresAt": iso_ms(expires),
        }
        if reclaimed:
            data.update(previousOwner=row.lease_owner, previousFence=row.fence)
        events.append(
            new_event(
                row.job_id,
                event_of(Action.RECLAIM if reclaimed else Action.CLAIM),
                now,
                occurrence_id=row.pk,
                owner_id=owner,
                fence=row.fence + 1,
                data=data,
            )
        )
        applied(Action.CLAIM, row, values)
    insert_rows(alias, events)
    return rows


def claim_batch(
    *,
    owner: str,
    lease: float | timedelta,
    limit: int = 1,
    kinds: Iterable[str] | None = None,
    after_principal: str | None = None,
    sweep_expired: bool = True,
    using: str | None = None,
) -> list[Occurrence]:
    """Claim up to ``limit`` due occurrences in one transaction, fairly across principals:
    the first due occurrence of every principal before the second of any, principals in
    round-robin order after ``after_principal`` (the ``principal_key`` served last). Without
    one, the rotation continues after the principal of the newest claim in the event log,
    so separate calls from any number of processes go round the principals too.

    Due: queued/retry_wait whose time has come, or running with an expired lease and
    attempts left (a reclaim). Each becomes running with attempt+1 and fence+1.
    """
    plan = plan_claim(
        owner=owner,
        lease=lease,
        limit=limit,
        kinds=kinds,
        after_principal=after_principal,
        sweep_expired=sweep_expired,
        using=using,
    )
    if plan is None:
        return []
    with write_transaction(using) as alias:
        return claim_planned(plan, alias)


def claim(
    *, owner: str, lease: float | timedelta, kinds: Iterable[str] | None = None, using: str | None = None
) -> Occurrence | None:
    """Claim the next due occurrence, or return None when nothing is due: a batch of one
    (:func:`claim_batch`), so successive claims go round the principals with due work."""
    rows = claim_batch(owner=owner, lease=lease, limit=1, kinds=kinds, using=using)
    return rows[0] if rows else None


def has_due(*, kinds: Iterable[str] | None = None, using: str | None = None) -> bool:
    """Whether anything is claimable now (a read without locks: rows another claimer holds
    count too)."""
    kind_list = _kinds(kinds)
    alias = alias_for(using)
    now = _adapted(alias, conf.now())
    job = [True, *(kind_list or [])]
    return bool(_fetch(alias, _sql(alias, kind_list)["due"], [now, *job, now, *job]))


def claim_authorized(
    *,
    owner: str,
    lease: float | timedelta,
    limit: int = 1,
    kinds: Iterable[str] | None = None,
    units_of: Callable[[Occurrence], Units] | None = None,
    after_principal: str | None = None,
    sweep_expired: bool = True,
    using: str | None = None,
) -> AuthorizedClaim:
    """:func:`claim_batch`, then ``reservations.authorize_claimed``, in one transaction (one
    commit between a due occurrence and its handler's start): the batch is claimed fairly,
    then each claimed occurrence is authorized, denied (dead-lettered) or deferred (queued
    again until its window ends, no attempt used) before the commit. What the worker calls.

    ``units_of(occurrence)`` gives the units of the occurrence's handler registration (an
    int or a function of the occurrence, as ``reservations.resolve_units`` takes); default 1.
    It runs inside the transaction, while it holds its locks: it should only look at the
    occurrence. The principals' policy rows are locked before any occurrence row, the order
    ``set_policy`` and ``reservations.authorize`` use, so neither can wait on this in a cycle.
    """
    if units_of is not None and not callable(units_of):
        raise InvalidArgument("units_of", "must be a function of the occurrence or None")
    plan = plan_claim(
        owner=owner,
        lease=lease,
        limit=limit,
        kinds=kinds,
        after_principal=after_principal,
        sweep_expired=sweep_expired,
        using=using,
    )
    if plan is None:
        return AuthorizedClaim([], [], [], [])
    policies: reservations.LockedPolicies = {}
    with write_transaction(using) as alias:

        def lock_policies(keys: list[str]) -> None:
            policies.update(reservations.lock_policies_of(keys, alias))

        def max_running(keys: list[str]) -> dict[str, int]:
            # The policies just locked: a claim that caps nothing reads nothing more.
            return {
                concurrency.principal_key_of(*principal): policy.max_running
                for principal, policy in policies.items()
                if policy.max_running is not None
            }

        claimed = claim_planned(plan, alias, before_lock=lock_policies, max_running_of=max_running)
        return reservations.authorize_claimed(claimed, units_of, plan.owner, policies, alias)
