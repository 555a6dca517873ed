"""Database-specific SQL behind one small interface, with a portable fallback.

- PostgreSQL, MySQL 8 / MariaDB 10.6+: row locks with ``FOR UPDATE SKIP LOCKED`` so
  concurrent claimers each take different rows without waiting on each other.
- SQLite has no row locks and one writer at a time. Every kernel transaction takes the
  database write lock as its first act (``transaction_mode=IMMEDIATE``, or a no-op write
  when the project did not configure it). From then on no other writer can commit until
  we do, so what the claim reads is the latest committed state and the rows it updates
  cannot be claimed by anyone else in between: one occurrence, one owner.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import F, JSONField, Min, Model, Q, QuerySet
from django.db.models.fields import AutoFieldMixin
from django.utils.dateparse import parse_datetime

from . import wakeup
from .identity import json_text, to_ms
from .models import PENDING_STATUSES, Event, Occurrence, OccurrenceStatus

# PostgreSQL channel on which enqueues announce new work (LISTEN/NOTIFY wake-ups).
CHANNEL = "durable_scheduler"

# How many fair-ordered candidates to consider per wanted row: concurrent claimers skip
# each other's locked rows, and a larger pool lets each still fill its batch.
CANDIDATE_FACTOR = 4


def _immediate(connection: BaseDatabaseWrapper) -> bool:
    mode = str(connection.settings_dict.get("OPTIONS", {}).get("transaction_mode", ""))
    return mode.upper() == "IMMEDIATE"


def take_write_lock(connection: BaseDatabaseWrapper) -> None:
    """On SQLite without IMMEDIATE transactions, take the write lock now (see module doc)."""
    if connection.vendor == "sqlite" and not _immediate(connection):
        with connection.cursor() as cursor:
            # A write that touches nothing still opens a write transaction, waiting for the
            # lock with the busy timeout rather than failing later on a lock upgrade.
            cursor.execute("UPDATE durable_scheduler_jobs SET revision = revision WHERE 0 = 1")


def supports_skip_locked(alias: str) -> bool:
    features = connections[alias].features
    return bool(features.has_select_for_update and features.has_select_for_update_skip_locked)


def lock_rows(qs: QuerySet[Any], alias: str) -> QuerySet[Any]:
    """Lock the rows ``qs`` returns, skipping rows other transactions hold."""
    if connections[alias].vendor == "sqlite":
        return qs  # the transaction already holds the database write lock
    if supports_skip_locked(alias):
        of = ("self",) if connections[alias].features.has_select_for_update_of else ()
        return qs.select_for_update(skip_locked=True, of=of)
    return qs.select_for_update()


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
)

# (occurrence_id, kind, principal_key, due_at, scheduled_for) of one candidate.
Candidate = tuple[str, str, str, datetime, datetime]


class _Arms:
    """The claim's candidate reads as plain SQL, prepared once per claim: one arm per
    (principal, waiting status), each an index range in due order with a LIMIT, plus the
    expired leases of everyone, sent as one ``UNION ALL`` of derived tables (a form that
    PostgreSQL, SQLite and MySQL/MariaDB all accept), so a round of any number of
    principals is one round trip and no ORM compilation."""

    def __init__(self, alias: str, now: datetime, kinds: list[str] | None) -> None:
        connection = connections[alias]
        quote = connection.ops.quote_name
        o = {name: "o." + quote(name) for name in _OCCURRENCE_COLUMNS}
        self.now = connection.ops.adapt_datetimefield_value(now)
        jobs = quote(Occurrence._meta.get_field("job").related_model._meta.db_table)
        tail = f" AND j.{quote('enabled')} = %s"
        self.tail_params: list[Any] = [True]
        if kinds is not None:
            tail += f" AND j.{quote('kind')} IN ({', '.join(['%s'] * len(kinds))})" if kinds else " AND 1 = 0"
            self.tail_params += kinds
        select = (
            f"SELECT {o['occurrence_id']}, j.{quote('kind')}, {o['principal_key']},"
            f" {{due}}, {o['scheduled_for']}"
            f" FROM {quote(Occurrence._meta.db_table)} o{{hint}}"
            f" INNER JOIN {jobs} j ON j.{quote('job_id')} = {o['job_id']}"
        )
        hint, self.literal = _fair_hint(connection)
        status = "'{status}'" if self.literal else "%s"
        self.pending = (
            select.format(due=o["available_at"], hint=hint)
            + f" WHERE {o['principal_key']} = %s AND {o['status']} = {status} AND {o['available_at']} <= %s"
            + tail
            + f" ORDER BY {o['available_at']}, {o['scheduled_for']}, {o['occurrence_id']} LIMIT %s"
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

    def add_pending(self, principal: str, status: str, limit: int) -> None:
        if self.literal:  # one of our own status constants, never outside input
            assert status in PENDING_STATUSES
            self.parts.append(self.pending.format(status=status))
            self.params += [principal, self.now, *self.tail_params, limit]
        else:
            self.parts.append(self.pending)
            self.params += [principal, status, self.now, *self.tail_params, limit]

    def add_reclaims(self, limit: int) -> None:
        self.parts.append(self.reclaim)
        self.params += [OccurrenceStatus.RUNNING.value, self.now, *self.tail_params, limit]

    def fetch(self) -> list[Candidate]:
        sql = " UNION ALL ".join(f"SELECT * FROM ({part}) a{n}" for n, part in enumerate(self.parts))
        with self.connection.cursor() as cursor:
            cursor.execute(sql, self.params)
            rows = cursor.fetchall()
        self.parts, self.params = [], []
        return [(pk, kind, key, _as_datetime(due), _as_datetime(at)) for pk, kind, key, due, at in rows]


_OCCURRENCE_COLUMNS = (
    "occurrence_id",
    "job_id",
    "principal_key",
    "status",
    "available_at",
    "scheduled_for",
    "lease_expires_at",
    "attempt",
    "max_attempts",
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
        table, key = quote(Occurrence._meta.db_table), quote("principal_key")
        status, available = quote("status"), quote("available_at")
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
        expires, attempt = quote("lease_expires_at"), quote("attempt")
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
            f" WHERE {status} = %s AND {expires} <= %s AND {attempt} < {quote('max_attempts')}"
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


def claim_candidates(
    alias: str,
    now: datetime,
    kinds: list[str] | None,
    limit: int,
    after_principal: str | None = None,
    waiting: dict[str, datetime] | None = None,
) -> list[Occurrence]:
    """Lock and return up to ``limit`` claimable occurrences, fair across principals.

    Fairness: rank each principal's due occurrences by due time and take rank 1 of every
    principal before rank 2 of any, so one principal's backlog cannot starve another's.
    Among principals of equal rank, those after ``after_principal`` (the last one this
    claimer served) come first: a claimer taking one at a time goes round the principals
    instead of serving the earliest-due backlog again and again; without one, principals
    come in the order their earliest occurrence became due.

    The cost does not grow with one principal's backlog: the principals with work are
    listed by :func:`waiting_principals`, then each principal's first few due rows
    are read through ``dsch_occurrences_fair`` (principal, status, due time) with a LIMIT,
    queued and retry_wait arms apart so that each is one index range in due order, plus
    the expired leases (a reclaim) of everyone; one UNION ALL round trip (``_Arms``).
    The pool is then locked in rank order, ``limit`` rows at a time, re-checking
    the due state under the lock: only rows that are returned stay locked, so a
    concurrent claimer is never kept from rows this one does not take. ``waiting``: the
    principals, when the caller has listed them already (a hint: every row is re-checked).
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
    by_principal: dict[str, list[Candidate]] = {}
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
                arms.add_pending(key, status, quota)
        if start == 0:
            arms.add_reclaims(want)
        for row in arms.fetch():
            by_principal.setdefault(row[2], []).append(row)
            found += 1
        if found >= want:
            break
    order = {key: index for index, key in enumerate(principals)}
    ranked: list[tuple[int, int, Candidate]] = []
    for key, rows in by_principal.items():
        rows.sort(key=lambda row: (row[3], row[4], row[0]))
        position = order.get(key, len(order))
        ranked += [(rank, position, row) for rank, row in enumerate(rows[:per_principal])]
    if after_principal is None:
        ranked.sort(key=lambda item: (item[0], item[2][3], item[2][4], item[2][0]))
    else:
        ranked.sort(key=lambda item: (item[0], item[1], item[2][3], item[2][4], item[2][0]))
    pool = [row for _, _, row in ranked[:want]]
    kind_of = {row[0]: row[1] for row in pool}
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
    return got


_COLUMNS: dict[tuple[str, type[Model]], tuple[str, str, list[Any]]] = {}


def _insert_columns(alias: str, model: type[Model]) -> tuple[str, str, list[Any]]:
    """(quoted table, "(columns)", fields) of a plain INSERT into ``model``'s table: every
    concrete column but a database-generated key. Computed once per database and model."""
    key = (alias, model)
    known = _COLUMNS.get(key)
    if known is None:
        connection = connections[alias]
        meta = model._meta
        fields = [
            field
            for field in meta.local_concrete_fields
            if not field.generated and not (field.primary_key and isinstance(field, AutoFieldMixin))
        ]
        quote = connection.ops.quote_name
        columns = "(" + ", ".join(quote(str(field.column)) for field in fields) + ")"
        known = _COLUMNS[key] = (quote(meta.db_table), columns, fields)
    return known


_PLAIN = (str, int, bool, type(None))
_PLAIN_FIELDS = {
    "CharField",
    "TextField",
    "IntegerField",
    "BigIntegerField",
    "SmallIntegerField",
    "PositiveIntegerField",
    "PositiveBigIntegerField",
    "PositiveSmallIntegerField",
    "BooleanField",
}
_PREPARERS: dict[tuple[str, type[Model]], list[tuple[str, Any, bool]]] = {}


def _preparers(alias: str, model: type[Model]) -> list[tuple[str, Any, bool]]:
    """Per insert column: (attname, the field's ``get_db_prep_save``, whether a plain
    str/int/bool/None value is stored as it is: char, integer and boolean fields without
    choices, and foreign keys to them, whose preparation returns such a value unchanged).
    The hot path inserts thousands of rows a second; each field's full preparation chain
    is most of the cost of building a row."""
    key = (alias, model)
    known = _PREPARERS.get(key)
    if known is None:
        _, _, fields = _insert_columns(alias, model)
        connection = connections[alias]
        utc_text = connection.vendor == "sqlite" and connection.timezone is UTC
        known = []
        for field in fields:
            target = field.target_field if field.is_relation else field
            internal = target.get_internal_type()
            plain = internal in _PLAIN_FIELDS and not field.choices
            prep = field.get_db_prep_save
            if utc_text and internal == "DateTimeField":
                prep = _utc_text(prep)
            elif internal == "JSONField" and _plain_json_text(connection, field):
                prep = _json_dumps(prep)
            known.append((field.attname, prep, plain))
        _PREPARERS[key] = known
    return known


def _utc_text(prep: Any) -> Any:
    """``prep`` (a DateTimeField's ``get_db_prep_save``) for SQLite with time zones on and
    the connection in UTC (no ``TIME_ZONE`` of its own), where Django stores an aware
    datetime as the text of its naive UTC value: the kernel's UTC datetimes are written as
    that text directly, skipping the field's chain of steps (the same result); any other
    value takes the chain."""

    last: list[Any] = [None, None]  # rows built together often share a time

    def utc_text(value: Any, connection: BaseDatabaseWrapper) -> Any:
        if type(value) is datetime and value.tzinfo is UTC:
            if value is not last[0]:
                last[:] = value, value.replace(tzinfo=None).isoformat(" ")
            return last[1]
        return prep(value, connection)

    return utc_text


def _plain_json_text(connection: BaseDatabaseWrapper, field: Any) -> bool:
    """Whether ``field`` (a JSONField) is bound as ``json.dumps(value)`` text on this
    database: no encoder of its own, and Django's base ``adapt_json_value`` (SQLite, MySQL,
    MariaDB; PostgreSQL binds a ``Jsonb`` object instead)."""
    return (
        field.encoder is None
        and type(connection.ops).adapt_json_value is BaseDatabaseOperations.adapt_json_value
        and type(field).get_db_prep_save is JSONField.get_db_prep_save
    )


_JSON_TYPES = (dict, list, str, int, float, bool)


def _json_dumps(prep: Any) -> Any:
    """``prep`` (a JSONField's ``get_db_prep_save`` where :func:`_plain_json_text`) for the
    kernel's plain JSON values: ``None`` is SQL NULL and any other plain value becomes
    ``json.dumps(value)`` text, what the field's chain of steps returns for it; anything else
    (an expression, a lazy string) takes the chain."""

    def dumps(value: Any, connection: BaseDatabaseWrapper) -> Any:
        if value is None:
            return None
        if type(value) in _JSON_TYPES:
            return _dumps(value)
        return prep(value, connection)

    return dumps


_dumps = json.dumps


def _prepared(obj: Model, prep: list[tuple[str, Any, bool]], connection: BaseDatabaseWrapper) -> list[Any]:
    """``obj``'s values of the ``prep`` columns (from :func:`_preparers`), ready to bind."""
    row = []
    for name, dump, plain in prep:
        value = getattr(obj, name)
        row.append(value if plain and type(value) in _PLAIN else dump(value, connection))
    return row


def _insert_parts(
    alias: str, objs: Sequence[Model], connection: BaseDatabaseWrapper | None = None
) -> tuple[str, str, list[list[Any]]]:
    """(quoted table, "(columns)", one list of prepared values per object) for a plain
    INSERT of ``objs`` (all of one model; no field of ours computes its value on save).
    ``connection``: ``alias``'s, when the caller has it."""
    if connection is None:
        connection = connections[alias]
    table, columns, _ = _insert_columns(alias, type(objs[0]))
    prep = _preparers(alias, type(objs[0]))
    return table, columns, [_prepared(obj, prep, connection) for obj in objs]


class RowTemplate:
    """The prepared INSERT values of a model instance ``proto``, for rows that differ from
    it only in the attnames ``varying``: only those are prepared again for each row. The
    one-by-one enqueue of a remembered job builds each occurrence from the job's first one
    and changes eight of its sixteen columns; the other eight (its authority JSON among
    them) were prepared again on every call."""

    __slots__ = ("base", "varying")

    def __init__(self, alias: str, proto: Model, varying: Sequence[str]) -> None:
        prep = _preparers(alias, type(proto))
        self.base = _prepared(proto, prep, connections[alias])
        self.varying = [(index, *column) for index, column in enumerate(prep) if column[0] in varying]

    def row(self, obj: Model, connection: BaseDatabaseWrapper) -> list[Any]:
        """``obj``'s values, ready to bind; ``obj`` equals ``proto`` outside ``varying``."""
        row = self.base.copy()
        for index, name, dump, plain in self.varying:
            value = getattr(obj, name)
            row[index] = value if plain and type(value) in _PLAIN else dump(value, connection)
        return row


def _one(get: Any) -> Any:
    """``get`` (an attrgetter of one name) returning a 1-tuple, as one of several names does."""
    return lambda obj: (get(obj),)


def _placeholders(row: list[Any]) -> str:
    return "(" + ", ".join(["%s"] * len(row)) + ")"


def _saved(objs: Sequence[Model], alias: str) -> None:
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias


class GuardFailed(Exception):
    """The guard row of :func:`insert_unless_present` no longer holds the expected values."""


def supports_guarded_insert(alias: str) -> bool:
    """Whether :func:`insert_unless_present` can take a ``guard`` on this database."""
    return connections[alias].vendor in ("postgresql", "sqlite")


def guard_for(alias: str, obj: Model, names: Sequence[str]) -> tuple[str, list[Any]]:
    """The guard of :func:`insert_unless_present` for ``obj``'s row: ``SELECT 1 FROM <table>
    WHERE pk = %s AND <field> = %s ...`` (null-safe) with ``obj``'s current values of
    ``names``. Built once and reused while the caller trusts ``obj``."""
    connection = connections[alias]
    meta = obj._meta
    quote = connection.ops.quote_name
    same = "IS" if connection.vendor == "sqlite" else "IS NOT DISTINCT FROM"
    conditions = [f"{quote(str(meta.pk.column))} = %s"]
    params: list[Any] = [meta.pk.get_db_prep_value(obj.pk, connection)]
    concrete = {field.name: field for field in meta.concrete_fields}
    for name in names:
        field = concrete[name]
        conditions.append(f"{quote(str(field.column))} {same} %s")
        params.append(field.get_db_prep_save(getattr(obj, field.attname), connection))
    return f"SELECT 1 FROM {quote(meta.db_table)} WHERE {' AND '.join(conditions)}", params


def insert_unless_present(
    alias: str,
    obj: Model,
    *,
    then: Sequence[Model] = (),
    notify: bool = False,
    guard: tuple[str, list[Any]] | None = None,
    template: RowTemplate | None = None,
) -> bool | None:
    """Insert ``obj`` unless a row with one of its unique keys exists, without a savepoint,
    and only if it was inserted, the rows ``then`` (its events) and a wake-up of listening
    workers (``notify``, PostgreSQL): True if inserted, False if a row was there.

    ``guard`` (from :func:`guard_for`): insert only while that row still holds those values,
    else raise :class:`GuardFailed` having written nothing.
    The enqueue fast path uses it to insert from a remembered job row without reading it.
    ``template``: ``obj``'s values are built from it (see :class:`RowTemplate`).

    PostgreSQL: all of it in one statement (``INSERT ... ON CONFLICT DO NOTHING RETURNING``
    with the guard, the dependent inserts and ``pg_notify`` in the same ``WITH``), one round
    trip. SQLite: ``INSERT OR IGNORE ... SELECT ... WHERE EXISTS (guard)``, then the rest.
    None where there is no statement that ignores only duplicates (MySQL's ``INSERT IGNORE``
    also turns other errors into warnings): nothing is written, and the caller inserts in a
    savepoint, catching the error (a guard is refused there)."""
    connection = connections[alias]
    if connection.vendor not in ("postgresql", "sqlite"):
        if guard is not None:
            raise ValueError(f"no guarded insert on {connection.vendor}")
        return None
    if template is None:
        table, columns, (row,) = _insert_parts(alias, [obj])
    else:
        table, columns, _ = _insert_columns(alias, type(obj))
        row = template.row(obj, connection)
    guard_sql, guard_params = guard if guard is not None else ("", [])
    if connection.vendor == "sqlite":
        inserted = _sqlite_insert_unless_present(
            alias, connection, table, columns, row, then=then, notify=notify, guard=guard
        )
        if inserted:
            _saved([obj], alias)
        return inserted
    parts: list[str] = []
    params: list[Any] = []
    if guard is not None:
        parts.append(f"g AS ({guard_sql})")
        params += guard_params
        parts.append(
            f"o AS (INSERT INTO {table} {columns} SELECT {_placeholders(row)[1:-1]} FROM g "
            "ON CONFLICT DO NOTHING RETURNING 1)"
        )
    else:
        values = _placeholders(row)
        parts.append(
            f"o AS (INSERT INTO {table} {columns} VALUES {values} ON CONFLICT DO NOTHING RETURNING 1)"
        )
    params += row
    if then:
        then_table, then_columns, then_rows = _insert_parts(alias, then)
        selects = " UNION ALL ".join(f"SELECT {_placeholders(r)[1:-1]} FROM o" for r in then_rows)
        parts.append(f"t AS (INSERT INTO {then_table} {then_columns} {selects})")
        params += [value for r in then_rows for value in r]
    wake = "(SELECT COUNT(*) FROM (SELECT pg_notify(%s, '') FROM o) AS n)" if notify else "0"
    if notify:
        params.append(CHANNEL)
    held = "(SELECT COUNT(*) FROM g)" if guard is not None else "1"
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT (SELECT COUNT(*) FROM o), {wake}, {held}", params)
        count, _, guard_held = cursor.fetchone()
    if not guard_held:
        raise GuardFailed
    inserted = bool(count > 0)
    if inserted:
        _saved([obj, *then], alias)
    return inserted


def in_autocommit(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is outside any transaction: no atomic block, autocommit on."""
    return not connection.in_atomic_block and connection.get_autocommit()


def _sqlite_insert_unless_present(
    alias: str,
    connection: BaseDatabaseWrapper,
    table: str,
    columns: str,
    row: list[Any],
    *,
    then: Sequence[Model],
    notify: bool,
    guard: tuple[str, list[Any]] | None,
) -> bool:
    """:func:`insert_unless_present` on SQLite: ``INSERT OR IGNORE`` (from a ``SELECT``
    that checks the guard), then the rows ``then``.

    Outside an atomic block these statements run in a transaction of their own, begun with
    ``BEGIN IMMEDIATE`` and committed here, and the wake-up is sent once it has committed:
    the one-by-one enqueue, as user code calls it, pays for no savepoint machinery and no
    autocommit switching (``transaction.atomic`` cost about a tenth of a call). Inside one,
    they are part of the caller's transaction (and the wake-up waits for its commit).
    Either way they go through Django's cursor, so query logging and execute wrappers see
    them."""
    alone = in_autocommit(connection)
    with connection.cursor() as cursor:
        if alone:
            cursor.execute("BEGIN IMMEDIATE")
        try:
            if guard is None:
                cursor.execute(f"INSERT OR IGNORE INTO {table} {columns} VALUES {_placeholders(row)}", row)
            else:
                guard_sql, guard_params = guard
                cursor.execute(
                    f"INSERT OR IGNORE INTO {table} {columns} SELECT {_placeholders(row)[1:-1]} "
                    f"WHERE EXISTS ({guard_sql})",
                    [*row, *guard_params],
                )
            inserted = bool(cursor.rowcount > 0)
            if not inserted and guard is not None:
                cursor.execute(*guard)
                if cursor.fetchone() is None:
                    raise GuardFailed
            if inserted:
                insert_rows(alias, then, cursor=cursor)
            if alone:
                cursor.execute("COMMIT")
        except BaseException:
            if alone and connection.connection.in_transaction:
                cursor.execute("ROLLBACK")
            raise
    if inserted and notify:
        notify_new_work(alias)  # at once after our own COMMIT above, else at the caller's commit
    return inserted


# The stored function of migration 0015 (PostgreSQL) and the view of migration 0016 (SQLite):
# one occurrence's enqueue as one statement. Version 1 (migration 0011, PostgreSQL) is there
# for processes started before 0015; this code calls version 2 only.
ENQUEUE_FUNCTION = "durable_scheduler_enqueue_v2"
_ENQUEUE_CALL = (
    f"SELECT {ENQUEUE_FUNCTION}(%s::text, %s::text, %s::integer, %s::text, %s::text,"
    " %s::timestamptz, %s::timestamptz, %s::smallint, %s::jsonb, %s::jsonb, %s::text,"
    " %s::timestamptz, %s::jsonb, %s::integer, %s::text)"
)
_ENQUEUE_INSERT = (
    f"INSERT INTO {ENQUEUE_FUNCTION} (occurrence_id, job_id, job_revision, idempotency_key,"
    " trigger_key, scheduled_for, available_at, max_attempts, authority, payload, principal_key,"
    " now, event_data, guard) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# SQLite, when an insert through the view wrote nothing under a guard: whether the guard
# holds and whether the occurrence is there (what the function's -1 tells on PostgreSQL).
_ENQUEUE_GUARD = (
    "SELECT EXISTS (SELECT 1 FROM durable_scheduler_jobs WHERE job_id = %s AND revision = %s"
    " AND enabled AND max_attempts = %s AND authority = %s AND (%s = 1 OR payload IS %s)),"
    " EXISTS (SELECT 1 FROM durable_scheduler_occurrences WHERE occurrence_id = %s"
    " OR idempotency_key = %s)"
)
# Per Django connection: (its driver connection when asked, whether it sees the function or
# view). Keyed by the wrapper, whose driver connection changes on reconnect (SQLite's
# connection objects take no weak references).
_HAS_ENQUEUE_FUNCTION: weakref.WeakKeyDictionary[BaseDatabaseWrapper, tuple[Any, bool]] = (
    weakref.WeakKeyDictionary()
)


def has_enqueue_function(alias: str) -> bool:
    """Whether :func:`insert_enqueued` can be used: PostgreSQL with migration 0015 applied,
    SQLite with migration 0016 applied (and Django's own JSON text, which the view's guard
    compares). Asked once per database connection (a test database built without
    migrations, or a project that has not migrated yet, takes the plain statements
    instead)."""
    connection = connections[alias]
    vendor = connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        return False
    connection.ensure_connection()
    raw = connection.connection
    known = _HAS_ENQUEUE_FUNCTION.get(connection)
    if known is not None and known[0] is raw:
        return known[1]
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SELECT to_regproc(%s) IS NOT NULL", [ENQUEUE_FUNCTION])
        else:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = %s)",
                [f"{ENQUEUE_FUNCTION}_insert"],
            )
        found = bool(cursor.fetchone()[0])
    if vendor == "sqlite":
        found = (
            found
            and all(
                _plain_json_text(connection, Occurrence._meta.get_field(name))
                for name in ("authority", "payload")
            )
            and _plain_json_text(connection, Event._meta.get_field("data"))
        )
    _HAS_ENQUEUE_FUNCTION[connection] = (raw, found)
    return found


def enqueue_json(alias: str, value: Any) -> str:
    """``value`` (plain JSON) as :func:`insert_enqueued` binds it: PostgreSQL parses it
    into ``jsonb``; SQLite stores the text, so it is the text Django stores (``json.dumps``),
    which the view's guard compares with the job's columns."""
    return json_text(value) if connections[alias].vendor == "postgresql" else _dumps(value)


def _binding_cursor(alias: str) -> Any:
    """A cursor for a statement that returns no times, Django's wrapper (query logging,
    execute wrappers, error translation) around a psycopg 3 cursor that sends the
    parameters apart from the statement. Django's own psycopg 3 cursors bind them
    client-side into the statement's text: the client quotes each one and the server lexes
    it as a literal. Sent apart, the server reads them with the types' input functions
    (one-by-one enqueue on PostgreSQL: 0.07 ms less a call, a tenth). Still no prepared
    statement (Django's setting, for transaction-mode poolers). Django's own cursor where
    it binds server-side already, or the connection is not psycopg 3's."""
    connection = connections[alias]
    if connection.settings_dict["OPTIONS"].get("server_side_binding") is True:
        return connection.cursor()
    connection.ensure_connection()
    raw = connection.connection
    cursor_class = _BINDING_CURSORS.get(type(raw))
    if cursor_class is None:
        cursor_class = _BINDING_CURSORS[type(raw)] = _binding_cursor_class(raw)
    if cursor_class is False:
        return connection.cursor()
    # What connection.cursor() does with the cursor it creates (thread check, wrapper).
    return connection._prepare_cursor(cursor_class(raw))  # type: ignore[attr-defined]


# Per driver connection class: the cursor class that binds server-side, or False (psycopg2).
_BINDING_CURSORS: dict[type, Any] = {}


def _binding_cursor_class(raw: Any) -> Any:
    try:
        import psycopg
    except ImportError:
        return False
    return psycopg.Cursor if isinstance(raw, psycopg.Connection) else False


def insert_enqueued(
    alias: str,
    occurrence: Occurrence,
    *,
    event_data: dict[str, Any],
    guard: int,
    notify: bool,
    authority_text: str | None = None,
) -> bool:
    """Insert a new queued ``occurrence`` (attempt 0, fence 0, updated when created) with
    its ``occurrence_enqueued`` event (``event_data``) and, if ``notify``, a wake-up, in
    one statement: the function of migration 0015 (PostgreSQL) or the view of migration
    0016 (SQLite), only where :func:`has_enqueue_function`. True if inserted, False if an
    occurrence with its id or idempotency key was there (nothing written). ``guard``: 0,
    none; 1, the job row must still hold the occurrence's revision, ``max_attempts`` and
    authority and be enabled; 2, and its payload too; else :class:`GuardFailed`, nothing
    written. ``authority_text``: the occurrence's authority as :func:`enqueue_json` gives
    it, when the caller has it already."""
    o = occurrence
    if o.status != OccurrenceStatus.QUEUED or o.attempt or o.fence or o.updated_at != o.created_at:
        raise ValueError(f"insert_enqueued writes new queued occurrences, not {o.occurrence_id!r} as it is")
    connection = connections[alias]
    if connection.vendor == "sqlite":
        inserted = _sqlite_insert_enqueued(alias, connection, o, event_data, guard, authority_text)
        if inserted and notify:
            notify_new_work(alias)  # at once in autocommit, else at the caller's commit
        return inserted
    payload = o.payload
    params: list[Any] = [
        o.occurrence_id,
        o.job_id,
        o.job_revision,
        o.idempotency_key,
        o.trigger_key,
        o.scheduled_for,
        o.available_at,
        o.max_attempts,
        authority_text if authority_text is not None else json_text(o.authority),
        None if payload is None else json_text(payload),
        o.principal_key,
        o.created_at,
        json_text(event_data),
        guard,
        CHANNEL if notify else None,
    ]
    with _binding_cursor(alias) as cursor:
        cursor.execute(_ENQUEUE_CALL, params)
        (outcome,) = cursor.fetchone()
    if outcome < 0:
        raise GuardFailed
    if outcome:
        _saved([o], alias)
    return bool(outcome)


_TIME_PREPARERS: dict[str, Any] = {}


def _sqlite_insert_enqueued(
    alias: str,
    connection: BaseDatabaseWrapper,
    o: Occurrence,
    event_data: dict[str, Any],
    guard: int,
    authority_text: str | None,
) -> bool:
    """:func:`insert_enqueued` on SQLite: one ``INSERT`` into the view of migration 0016.
    The view answers nothing, so what it wrote is read from the driver's count of changed
    rows (triggers' included; 2 inserted, 0 not), and, when it wrote nothing under a guard,
    one more query tells a failed guard from a present occurrence."""
    time_text = _TIME_PREPARERS.get(alias)
    if time_text is None:
        preparers = {name: prep for name, prep, _ in _preparers(alias, Occurrence)}
        time_text = _TIME_PREPARERS[alias] = preparers["scheduled_for"]
    payload = None if o.payload is None else _dumps(o.payload)
    authority = authority_text if authority_text is not None else _dumps(o.authority)
    available = o.available_at
    scheduled = time_text(o.scheduled_for, connection)
    params = [
        o.occurrence_id,
        o.job_id,
        o.job_revision,
        o.idempotency_key,
        o.trigger_key,
        scheduled,
        scheduled if available is o.scheduled_for else time_text(available, connection),
        o.max_attempts,
        authority,
        payload,
        o.principal_key,
        time_text(o.created_at, connection),
        _dumps(event_data),
        guard,
    ]
    raw = connection.connection
    with connection.cursor() as cursor:
        before = raw.total_changes
        cursor.execute(_ENQUEUE_INSERT, params)
        inserted = bool(raw.total_changes != before)
        if not inserted and guard:
            job: list[Any] = [o.job_id, o.job_revision, o.max_attempts, authority, guard, payload]
            cursor.execute(_ENQUEUE_GUARD, [*job, o.occurrence_id, o.idempotency_key])
            holds, present = cursor.fetchone()
            if not (holds and present):
                raise GuardFailed
    if inserted:
        _saved([o], alias)
    return inserted


def supports_insert_enqueued_many(alias: str) -> bool:
    """Whether :func:`insert_enqueued_many` can be used: PostgreSQL; SQLite where
    :func:`insert_many` reports what it inserted and the events' data is Django's own JSON
    text (which it writes as text)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return True
    return supports_insert_many(alias) and _plain_json_text(connection, Event._meta.get_field("data"))


def supports_insert_many(alias: str) -> bool:
    """Whether :func:`insert_many` can report which rows it inserted on this database
    (PostgreSQL; SQLite 3.35+, for ``RETURNING``)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return True
    return connection.vendor == "sqlite" and bool(connection.features.can_return_rows_from_bulk_insert)


def _sqlite_variable_limit(connection: BaseDatabaseWrapper) -> int:
    """How many ``?`` one SQLite statement may hold: the library's own limit (32766 since
    SQLite 3.32) where Python can read it, else Django's conservative 999."""
    connection.ensure_connection()
    getlimit = getattr(connection.connection, "getlimit", None)  # Python 3.11+
    if getlimit is not None:
        import sqlite3

        return int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
    return int(connection.features.max_query_params or 999)


def insert_many(
    alias: str, objs: Sequence[Model], *, varying: Sequence[str], skip_present: bool = False
) -> set[Any]:
    """Insert ``objs`` (all of one model) with a few multi-row statements.

    Columns (attnames) not in ``varying`` take ``objs[0]``'s value for every row, bound once
    per statement, so a bulk enqueue sends each row's few own values and not its job's
    authority again and again: ``INSERT INTO t (...) SELECT v.a, %s, v.b, ... FROM <rows> v``,
    where the rows are one ``jsonb_to_recordset`` parameter on PostgreSQL (one parameter
    instead of thousands to bind client-side) and a ``VALUES`` list on SQLite.
    ``skip_present``: rows whose unique keys exist already are skipped (``ON CONFLICT DO
    NOTHING`` / ``INSERT OR IGNORE``), and the primary keys of the rows inserted are
    returned (else an empty set: a generated key is not read back).
    PostgreSQL and SQLite only (see :func:`supports_insert_many`)."""
    return _insert_many(alias, objs, varying=varying, skip_present=skip_present)


def insert_enqueued_many(
    alias: str, objs: Sequence[Occurrence], *, varying: Sequence[str], event: Model
) -> set[Any]:
    """:func:`insert_many` of new queued occurrences ``objs`` with ``skip_present``, and for
    each occurrence inserted (in the order inserted), its ``occurrence_enqueued`` event:
    ``event``'s values (job, type, time, owner, fence) with the occurrence's id and, as data,
    the occurrence's ``{"jobRevision", "scheduledFor"`` (epoch milliseconds),
    ``"triggerKey"}`` (what the kernel writes for one occurrence). No event objects.
    PostgreSQL: in the same statement, the data built by the database from the row it
    inserted. SQLite (no ``INSERT`` in a ``WITH``): a second statement per chunk, its rows
    one JSON parameter of (occurrence id, data text) pairs, instead of a ``VALUES`` list of
    two parameters a row. See :func:`supports_insert_enqueued_many`."""
    connection = connections[alias]
    if connection.vendor == "sqlite":
        return _sqlite_insert_enqueued_many(alias, connection, objs, varying, event)
    if connection.vendor != "postgresql":
        raise ValueError(f"no insert_enqueued_many on {connection.vendor}")
    quote = connection.ops.quote_name
    table, columns, fields = _insert_columns(alias, type(event))
    select: list[str] = []
    params: list[Any] = []
    for field in fields:
        if field.attname == "occurrence_id":
            select.append("ins.occurrence_id")
        elif field.attname == "data":
            select.append(
                "jsonb_build_object('jobRevision', ins.job_revision, 'scheduledFor',"
                " (extract(epoch FROM ins.scheduled_for) * 1000)::bigint, 'triggerKey', ins.trigger_key)"
            )
        else:
            select.append(f"%s::{field.cast_db_type(connection)}")
            params.append(field.get_db_prep_save(getattr(event, field.attname), connection))
    returned = ", ".join(
        quote(name) for name in ("occurrence_id", "job_revision", "scheduled_for", "trigger_key")
    )

    def then(insert: str) -> tuple[str, list[Any]]:
        return (
            f"WITH ins AS ({insert} RETURNING {returned}), "
            f"ev AS (INSERT INTO {table} {columns} SELECT {', '.join(select)} FROM ins) "
            "SELECT occurrence_id FROM ins",
            params,
        )

    return _insert_many(alias, objs, varying=varying, skip_present=True, then=then)


def _sqlite_insert_enqueued_many(
    alias: str,
    connection: BaseDatabaseWrapper,
    objs: Sequence[Occurrence],
    varying: Sequence[str],
    event: Model,
) -> set[Any]:
    """:func:`insert_enqueued_many` on SQLite: the occurrences with :func:`insert_many`,
    then the events of those it inserted, in ``objs``' order, each chunk's rows read by
    ``json_each`` from one parameter. The data is stored as the text Django stores for it
    (``json.dumps`` of the dict the kernel writes for one occurrence), formatted here."""
    inserted = _insert_many(alias, objs, varying=varying, skip_present=True)
    if not inserted:
        return inserted
    table, columns, fields = _insert_columns(alias, type(event))
    select: list[str] = []
    constants: list[Any] = []
    prep = {name: dump for name, dump, _ in _preparers(alias, type(event))}
    for field in fields:
        if field.attname == "occurrence_id":
            select.append("json_extract(j.value, '$[0]')")
        elif field.attname == "data":
            select.append("json_extract(j.value, '$[1]')")
        else:
            select.append("%s")
            constants.append(prep[field.attname](getattr(event, field.attname), connection))
    sql = f"INSERT INTO {table} {columns} SELECT {', '.join(select)} FROM json_each(%s) AS j ORDER BY j.key"
    times: dict[datetime, int] = {}  # rows built together often share their time
    pairs: list[tuple[str, str]] = []
    for o in objs:
        if o.occurrence_id not in inserted:
            continue
        scheduled = o.scheduled_for
        ms = times.get(scheduled)
        if ms is None:
            ms = times[scheduled] = to_ms(scheduled, "scheduled_for")
        pairs.append((o.occurrence_id, enqueued_data_text(o.job_revision, ms, o.trigger_key)))
    with connection.cursor() as cursor:
        for start in range(0, len(pairs), 5000):
            cursor.execute(sql, [*constants, _dumps(pairs[start : start + 5000], ensure_ascii=False)])
    return inserted


def enqueued_data_text(job_revision: int, scheduled_ms: int, trigger_key: str) -> str:
    """``json.dumps({"jobRevision": job_revision, "scheduledFor": scheduled_ms,
    "triggerKey": trigger_key})`` (the text Django stores for an ``occurrence_enqueued``
    event's data), formatted without building the dict (0.6 us against 2.1 us)."""
    key = _dumps(trigger_key)
    return f'{{"jobRevision": {job_revision:d}, "scheduledFor": {scheduled_ms:d}, "triggerKey": {key}}}'


def _insert_many(
    alias: str,
    objs: Sequence[Model],
    *,
    varying: Sequence[str],
    skip_present: bool,
    then: Callable[[str], tuple[str, list[Any]]] | None = None,
) -> set[Any]:
    """:func:`insert_many`; ``then`` (PostgreSQL, with ``skip_present``): turns each ``INSERT
    ... ON CONFLICT DO NOTHING`` (without ``RETURNING``) into the statement to run, which
    returns the primary keys inserted, and gives the parameters it adds after the insert's."""
    if not objs:
        return set()
    connection = connections[alias]
    table, columns, fields = _insert_columns(alias, type(objs[0]))
    vary = set(varying)
    moving = [field for field in fields if field.attname in vary]
    if len(moving) != len(vary):
        raise ValueError(f"unknown or generated columns in {sorted(vary)}")
    postgres = connection.vendor == "postgresql"
    first = objs[0]
    select: list[str] = []
    constants: list[Any] = []
    for field in fields:
        if field.attname in vary:
            index = moving.index(field)
            select.append(f"v.c{index}" if postgres else f"v.column{index + 1}")
        else:
            select.append(f"%s::{field.cast_db_type(connection)}" if postgres else "%s")
            constants.append(field.get_db_prep_save(getattr(first, field.attname), connection))
    pk = objs[0]._meta.pk
    assert pk is not None
    # Per row: its values in one attrgetter call, then the few columns that need preparing.
    get = attrgetter(*(field.attname for field in moving))
    if len(moving) == 1:
        get = _one(get)
    width = len(moving)
    if postgres:
        per_statement = 5000
        # The rows as JSON records: datetimes as ISO text (rows built together often share
        # one), every other value as the JSON it is.
        keys = [f"c{index}" for index in range(width)]
        stamps = [index for index, field in enumerate(moving) if field.get_internal_type() == "DateTimeField"]
        last: list[Any] = [None, None]
        record = ", ".join(f"c{index} {field.cast_db_type(connection)}" for index, field in enumerate(moving))
        source = f"jsonb_to_recordset(%s::jsonb) AS v({record})"
        head, tail = "INSERT INTO", " ON CONFLICT DO NOTHING" if skip_present else ""
    else:
        limit = _sqlite_variable_limit(connection)
        per_statement = max(1, min(1000, (limit - len(constants)) // len(moving)))
        head, tail = ("INSERT OR IGNORE INTO" if skip_present else "INSERT INTO"), ""
        row = "(" + ", ".join(["%s"] * len(moving)) + ")"
        # Bound as they are: plain values of plain columns; the rest prepared.
        prep = {name: (dump, plain) for name, dump, plain in _preparers(alias, type(first))}
        dumps = [(index, *prep[field.attname]) for index, field in enumerate(moving)]
    if skip_present and then is None:
        tail += f" RETURNING {connection.ops.quote_name(str(pk.column))}"
    inserted: set[Any] = set()
    for start in range(0, len(objs), per_statement):
        chunk = objs[start : start + per_statement]
        params = list(constants)
        if postgres:
            records = []
            for obj in chunk:
                values: list[Any] = list(get(obj))
                for index in stamps:
                    value = values[index]
                    if isinstance(value, datetime):
                        if value is not last[0]:
                            last[:] = value, value.isoformat()
                        values[index] = last[1]
                records.append(dict(zip(keys, values, strict=True)))
            params.append(json.dumps(records, ensure_ascii=False, separators=(",", ":")))
        else:
            source = "(VALUES " + ", ".join([row] * len(chunk)) + ") AS v"
            for obj in chunk:
                bound: tuple[Any, ...] = get(obj)
                params += bound
                for index, dump, plain in dumps:
                    value = bound[index]
                    if not plain or type(value) not in _PLAIN:
                        params[index - width] = dump(value, connection)
        sql = f"{head} {table} {columns} SELECT {', '.join(select)} FROM {source}{tail}"
        if then is not None:
            sql, more = then(sql)
            params += more
        # PostgreSQL: the rows' one JSON parameter (a megabyte for 5,000) sent as it is,
        # not quoted into the statement and lexed back.
        with _binding_cursor(alias) if postgres else connection.cursor() as cursor:
            cursor.execute(sql, params)
            if skip_present:
                inserted.update(found[0] for found in cursor.fetchall())
    if skip_present:
        key = attrgetter(pk.attname)
        objs = [obj for obj in objs if key(obj) in inserted]
    _saved(objs, alias)
    return inserted


def settle_reserved(
    alias: str, occurrence_ids: list[str], status: str, outcome: Any, now: datetime
) -> list[tuple[str, int, int]] | None:
    """Mark the ``reserved`` reservations of ``occurrence_ids`` settled (``status``, the
    outcome, ``now``) with one ``UPDATE ... RETURNING`` and return (occurrence id, policy
    revision, units) of each row it changed. None where ``UPDATE`` cannot return rows
    (MySQL/MariaDB): the caller locks, reads and updates instead."""
    connection = connections[alias]
    if connection.vendor not in ("postgresql", "sqlite"):
        return None
    from .models import AuthorityReservation, ReservationStatus

    meta = AuthorityReservation._meta
    quote = connection.ops.quote_name
    outcome_field = meta.get_field("outcome")
    settled_field = meta.get_field("settled_at")
    placeholders = ", ".join(["%s"] * len(occurrence_ids))
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {quote('status')} = %s, {quote('outcome')} = %s,"
        f" {quote('settled_at')} = %s"
        f" WHERE {quote('status')} = %s AND {quote('occurrence_id')} IN ({placeholders})"
        f" RETURNING {quote('occurrence_id')}, {quote('policy_revision')}, {quote('units')}"
    )
    params = [
        status,
        outcome_field.get_db_prep_save(outcome, connection),
        settled_field.get_db_prep_save(now, connection),
        ReservationStatus.RESERVED.value,
        *occurrence_ids,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(pk, int(revision), int(units)) for pk, revision, units in cursor.fetchall()]


def insert_rows(alias: str, objs: Sequence[Model], *, cursor: Any = None) -> None:
    """Insert ``objs`` (all of one model), for the hot path's events and reservations, where
    nothing reads the new rows' keys back (an auto-increment key is left to the database
    and not set on the objects). PostgreSQL: one statement (:func:`insert_many`, the
    columns that differ between the rows sent as one ``jsonb_to_recordset`` parameter),
    parsed and planned once instead of once per row. Elsewhere one prepared ``INSERT`` run
    for all of them (``executemany``: SQLite steps one compiled statement, mysqlclient
    sends one multi-row statement). ``cursor``: an open cursor of ``alias`` to run it on."""
    if not objs:
        return
    connection = connections[alias] if cursor is None else cursor.db
    if connection.vendor == "postgresql" and len(objs) > 1:
        _, _, fields = _insert_columns(alias, type(objs[0]))
        first = objs[0]
        varying = [
            field.attname
            for field in fields
            if any(getattr(obj, field.attname) != getattr(first, field.attname) for obj in objs)
        ]
        if varying:
            insert_many(alias, objs, varying=varying)
            return
    table, columns, rows = _insert_parts(alias, objs, connection)
    sql = f"INSERT INTO {table} {columns} VALUES {_placeholders(rows[0])}"
    with nullcontext(cursor) if cursor is not None else connection.cursor() as run:
        if len(rows) == 1:  # an enqueue's one event: no executemany machinery for one row
            run.execute(sql, rows[0])
        else:
            run.executemany(sql, rows)
    _saved(objs, alias)


def update_rows(alias: str, objs: list[Model], fields: list[str]) -> None:
    """Write ``fields`` of each of ``objs`` to its row (by primary key) with one prepared
    ``UPDATE`` run for all of them (``executemany``; pipelined by psycopg). Portable, and
    much cheaper than ``bulk_update``'s ``CASE WHEN`` statement, which Django compiles anew
    for every batch."""
    if not objs:
        return
    connection = connections[alias]
    meta = objs[0]._meta
    concrete = {field.name: field for field in meta.concrete_fields}
    columns = [concrete[name] for name in fields]
    pk = concrete[meta.pk.name]
    quote = connection.ops.quote_name
    sql = "UPDATE {} SET {} WHERE {} = %s".format(
        quote(meta.db_table),
        ", ".join(f"{quote(str(field.column))} = %s" for field in columns),
        quote(str(pk.column)),
    )
    rows = [
        [field.get_db_prep_save(getattr(obj, field.attname), connection) for field in columns]
        + [pk.get_db_prep_save(obj.pk, connection)]
        for obj in objs
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def notify_new_work(alias: str) -> None:
    """Tell listening workers that work was enqueued. PostgreSQL: ``pg_notify``, sent
    inside the transaction, so PostgreSQL delivers it only if (and when) the transaction
    commits. SQLite: a datagram to each worker's wake-up socket (:mod:`.wakeup`), sent once
    the transaction has committed (at once in autocommit)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    elif connection.vendor == "sqlite":
        if in_autocommit(connection):
            wakeup.announce(alias)  # what on_commit does here, without its machinery
        else:
            transaction.on_commit(lambda: wakeup.announce(alias), using=alias)


def listener(alias: str, wake: Any, log: Any) -> Listener | wakeup.SocketListener:
    """The wake-up listener for database ``alias``: LISTEN on PostgreSQL, a datagram
    socket for a file-backed SQLite database; ``supported`` is False elsewhere."""
    if connections[alias].vendor == "sqlite":
        return wakeup.SocketListener(alias, wake, log)
    return Listener(alias, wake, log)


class Listener:
    """A dedicated PostgreSQL connection that LISTENs for new work and calls ``wake()``.

    Elsewhere ``supported`` is False (see :func:`listener` for SQLite).
    """

    def __init__(self, alias: str, wake: Any, log: Any) -> None:
        self.alias = alias
        self.wake = wake
        self.log = log
        self.supported = connections[alias].vendor == "postgresql"
        self._stop = False

    def open(self) -> bool:
        return self.supported

    def stop(self) -> None:
        self._stop = True

    def run(self) -> None:
        import psycopg

        failures = 0
        while not self._stop:
            try:
                params = connections[self.alias].get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    failures = 0
                    self.wake()  # work may have arrived while we were not listening
                    while not self._stop:
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self.wake()
            except Exception:
                failures += 1
                self.log.warning("LISTEN connection lost; polling until it is back", exc_info=True)
                time.sleep(min(30.0, 0.5 * 2 ** min(failures, 6)))
