"""The claim's SQL: every statement a claim sends, written out once per purpose, and which
each database gets (``_STATEMENTS``); see docs/design.md, "Fair claiming".

PostgreSQL and SQLite read the partial indexes (a loose index scan over the principals, one
index range per principal and status); MySQL/MariaDB, which have no partial indexes, list
the principals with a ``GROUP BY`` over the claim index (the portable form).
``{o.status}``-style names are the models' columns (``o`` occurrences, ``j`` jobs, ``e``
events, ``p`` paused kinds), filled in from ``_meta`` once per connection; the claim's and the
reclaim's conditions are the lifecycle table's (``{claimable}``, ``{reclaimable}``); the statuses are
written as literals because SQLite uses a partial index only when the query's own terms
imply its predicate; every other value is a bound parameter.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.utils.dateparse import parse_datetime

from .. import conf
from ..db.dialect import concrete_fields, in_list, in_params, model_columns
from ..models import Event, Job, Occurrence, OccurrenceStatus, PausedKind
from ..rules.events import OCCURRENCE_CLAIMED, OCCURRENCE_RECLAIMED
from ..rules.lifecycle import CLAIMABLE_SQL, RECLAIMABLE_SQL, Action, sql_sets
from . import settling

FAIR_INDEX = "dsch_occurrences_fair"  # (principal_key, status, available_at, ...) of waiting rows


PRIORITY_INDEX = "dsch_occurrences_priority"  # waiting rows whose priority is not 0


CLAIM_INDEX = "dsch_occurrences_claim"  # (status, available_at, lease_expires_at, ...): all rows


# At most this many principals are listed per claim (rotation reaches the others).
MAX_PRINCIPALS = 1000


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


# The principals with claimable work (PostgreSQL, SQLite): a loose index scan of the fair
# index, jumping from one principal to the next, with each one's earliest queued and
# retry_wait times; then the principals of expired leases with attempts left, each with its
# earliest first due time (``available_at``, which a claim leaves as it found it). The waiting
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
SELECT {o.principal_key}, MIN({o.available_at}), NULL FROM {occurrences}
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
SELECT {o.principal_key}, MIN({o.available_at}), NULL FROM {occurrences}{by_claim_index}
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


# The principals with claimable work and, in the same round trip, the priority probe: a row
# of NULLs (no principal is NULL) when some waiting row has a priority.
PRINCIPALS_AND_PRIORITY = f"""{PRINCIPALS_LOOSE_SCAN}UNION ALL
SELECT NULL, NULL, NULL FROM ({PRIORITY_PROBE}) prioritized
"""


# The arms of the fair pool, one per (principal, waiting status), each one index range in due
# order; sent together as one UNION ALL. Each leaves out the kinds paused (``pausing.py``):
# checked in the arm itself, so that pausing costs a claim no statement, and every claim
# from the pause's commit on leaves the kind alone. A candidate row is (occurrence_id, kind,
# principal_key, due at, scheduled_for, priority, the job's timeout_ms, job_id,
# concurrency_key, the job's concurrency, the job's throttle).
PENDING_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.available_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}, {j.throttle}
FROM {occurrences}{by_fair_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {o.principal_key} = %s AND {o.status} = {status} AND {o.available_at} <= %s
  AND {j.enabled} = %s{of_kinds}
  AND NOT EXISTS (SELECT 1 FROM {paused_kinds} WHERE {p.kind} = {j.kind})
ORDER BY {o.available_at}, {o.scheduled_for}, {o.occurrence_id}
LIMIT %s
"""


# The same, of priority 0 only: when prioritized rows exist, those come from PRIORITIZED_ARM.
PENDING_PRIORITY_0_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.available_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}, {j.throttle}
FROM {occurrences}{by_fair_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {o.principal_key} = %s AND {o.status} = {status} AND {o.priority} = 0 AND {o.available_at} <= %s
  AND {j.enabled} = %s{of_kinds}
  AND NOT EXISTS (SELECT 1 FROM {paused_kinds} WHERE {p.kind} = {j.kind})
ORDER BY {o.available_at}, {o.scheduled_for}, {o.occurrence_id}
LIMIT %s
"""


# A principal's due rows of priority other than 0, highest first, through the priority index.
PRIORITIZED_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.available_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}, {j.throttle}
FROM {occurrences}{by_priority_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {o.principal_key} = %s AND ({o.status} = {queued} OR {o.status} = {retry_wait})
  AND NOT ({o.priority} = 0) AND {o.available_at} <= %s
  AND {j.enabled} = %s{of_kinds}
  AND NOT EXISTS (SELECT 1 FROM {paused_kinds} WHERE {p.kind} = {j.kind})
ORDER BY {o.priority} DESC, {o.available_at}, {o.scheduled_for}, {o.occurrence_id}
LIMIT %s
"""


# Everyone's expired leases with attempts left (a reclaim), through the claim index, ranked
# by when each first became due (its ``available_at``, left in place by the claim), not by its
# lease's expiry: stranded work goes before what was enqueued after it. The order is the
# index's own (lease_expires_at sits between available_at and scheduled_for there), so the
# running rows are read in order and the LIMIT stops the read without a sort.
RECLAIM_ARM = """
SELECT {o.occurrence_id}, {j.kind}, {o.principal_key}, {o.available_at}, {o.scheduled_for},
       {o.priority}, {j.timeout_ms}, {o.job}, {o.concurrency_key}, {j.concurrency}, {j.throttle}
FROM {occurrences}{by_claim_index}
JOIN {jobs} ON {j.job_id} = {o.job}
WHERE {reclaimable}
  AND {j.enabled} = %s{of_kinds}
  AND NOT EXISTS (SELECT 1 FROM {paused_kinds} WHERE {p.kind} = {j.kind})
ORDER BY {o.available_at}, {o.lease_expires_at}, {o.scheduled_for}, {o.occurrence_id}
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
WHERE {ids}
  AND CASE WHEN {claimable} THEN 1 = 1 WHEN {reclaimable} THEN 1 = 1 ELSE 1 = 0 END
{for_update}"""


# Whether anything is claimable (a read without locks): a due waiting row or an expired lease
# with attempts left, of an enabled job of these kinds, not paused.
DUE = """
SELECT 1 FROM (
    SELECT {o.occurrence_id} FROM {occurrences}{by_claim_index}
    JOIN {jobs} ON {j.job_id} = {o.job}
    WHERE {claimable}
      AND {j.enabled} = %s{of_kinds}
      AND NOT EXISTS (SELECT 1 FROM {paused_kinds} WHERE {p.kind} = {j.kind})
    LIMIT 1
) due_row
UNION ALL
SELECT 1 FROM (
    SELECT {o.occurrence_id} FROM {occurrences}{by_claim_index}
    JOIN {jobs} ON {j.job_id} = {o.job}
    WHERE {reclaimable}
      AND {j.enabled} = %s{of_kinds}
      AND NOT EXISTS (SELECT 1 FROM {paused_kinds} WHERE {p.kind} = {j.kind})
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
    "principals": (PRINCIPALS_AND_PRIORITY, None),
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
        for field in concrete_fields(model):
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
        "p": columns(PausedKind),
        "occurrences": quote(Occurrence._meta.db_table),
        "jobs": quote(Job._meta.db_table),
        "events": quote(Event._meta.db_table),
        "paused_kinds": quote(PausedKind._meta.db_table),
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


# The claim's columns of the occurrence, which ``dialect.read_models`` matches by name.
CLAIM_COLUMNS = model_columns(Occurrence, CLAIM_FIELDS)


@functools.cache
def lock_statement(alias: str, vendor: str, ids: int) -> str:
    connection = connections[alias]
    names = _names(connection)
    columns = ", ".join(getattr(names["o"], field.name) for field in CLAIM_COLUMNS)
    return LOCK.format(**names, claim_columns=columns, ids=in_list(connection, names["o"].occurrence_id, ids))


@functools.cache
def _claim_update(alias: str, vendor: str, ids: int) -> tuple[str, tuple[Field[Any, Any], ...]]:
    """The claim's UPDATE of ``ids`` rows (the lifecycle table's columns: what the database
    computes from the row as SQL, the rest as parameters), and the fields of its parameters."""
    connection = connections[alias]
    names = _names(connection)
    quote = connection.ops.quote_name
    sets, given = [], []
    for name, computed in sql_sets(Action.CLAIM).items():
        field = Occurrence._meta.get_field(name)
        assert isinstance(field, Field)
        if computed is None:
            sets.append(f"{quote(str(field.column))} = %s")
            given.append(field)
        else:
            sets.append(f"{quote(str(field.column))} = {computed.format(**names)}")
    where = in_list(connection, names["o"].occurrence_id, ids)
    return f"UPDATE {names['occurrences']} SET {', '.join(sets)} WHERE {where}", tuple(given)


def claim_update(alias: str, values: dict[str, Any], ids: list[str]) -> tuple[str, list[Any]]:
    """The write of the claim's ``values`` (``lifecycle.writes``) to the rows ``ids``, which
    the transaction has locked: one statement, built once per alias and size, for
    ``guarded.insert_after`` to send with the claim's events."""
    connection = connections[alias]
    sql, given = _claim_update(alias, connection.vendor, len(ids))
    params = [field.get_db_prep_save(values[field.name], connection) for field in given]
    return sql, [*params, *in_params(connection, ids)]


def sql_of(alias: str, kinds: list[str] | None = None) -> dict[str, str]:
    return _statements(alias, connections[alias].vendor, None if kinds is None else len(kinds))


def statements(alias: str = "default") -> dict[str, tuple[str, list[Any] | dict[str, Any]]]:
    """Every statement a claim sends on ``alias``, by purpose, with sample arguments
    (a principal, now, a lock of two ids): what a test explains to check the plans."""
    now = adapted(alias, conf.now())
    sql = sql_of(alias)
    principal = '["user","sample"]'
    params: dict[str, list[Any] | dict[str, Any]] = {
        "principals": {"principals": MAX_PRINCIPALS, "now": now},
        "priority_probe": [],
        "reclaims": [now, True, 8],
        "due": [now, True, now, True],
        "cursor": cursor_params(),
    }
    found: dict[str, tuple[str, list[Any] | dict[str, Any]]] = {}
    for name, text in sql.items():
        found[name] = (text, params.get(name, [principal, now, True, 8]))
    lock_ids = in_params(connections[alias], ["a", "b"])
    found["lock"] = (lock_statement(alias, connections[alias].vendor, 2), [*lock_ids, now, now])
    return found


def adapted(alias: str, moment: datetime) -> Any:
    return connections[alias].ops.adapt_datetimefield_value(moment)


def as_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    parsed = parse_datetime(str(value))  # SQLite hands raw queries text
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def fetch(alias: str, sql: str, params: list[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of one of these reads."""
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def cursor_params() -> dict[str, Any]:
    return {"window": CURSOR_EVENTS, "claimed": OCCURRENCE_CLAIMED, "reclaimed": OCCURRENCE_RECLAIMED}
