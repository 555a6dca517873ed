"""The claim's candidates: which principals have claimable work, each one's first due rows
(the fair pool), their fair order, and the lock of the rows a claim takes, with their
concurrency limits (docs/design.md, "Fair claiming"). The statements are ``claim_sql``'s;
the claim transaction that makes the locked rows running is ``claiming``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections
from django.db.models import Q

from ..db.dialect import in_params, read_models
from ..exceptions import InvalidArgument
from ..models import AuthorityPolicy, Occurrence
from ..rules.authority import Principal
from ..rules.throttles import Throttle
from . import claim_sql, concurrency, throttles

# How many fair-ordered candidates to consider per wanted row: concurrent claimers skip
# each other's locked rows, and a larger pool lets each still fill its batch.
CANDIDATE_FACTOR = 4


# A claim without ``after_principal`` reads the first rows of up to this many principals.
STATELESS_PRINCIPALS = 64


def waiting_work(alias: str, now: datetime) -> tuple[dict[str, datetime], bool | None]:
    """The principals with claimable work and, for each, when its earliest claimable
    occurrence became due (due waiting rows, and expired leases with attempts left); and
    whether any waiting occurrence has a priority other than 0 (:func:`has_prioritized`),
    read by the same statement where the database has the priority index, else None. Its
    cost grows with the number of principals, not with the backlog."""
    found: dict[str, datetime] = {}
    sql = claim_sql.sql_of(alias)
    prioritized = False if "priority_probe" in sql else None
    params = {"principals": claim_sql.MAX_PRINCIPALS, "now": claim_sql.adapted(alias, now)}
    for principal, *firsts in claim_sql.fetch(alias, sql["principals"], params):
        if principal is None:  # the priority probe's row
            prioritized = True
            continue
        due = [claim_sql.as_datetime(value) for value in firsts if value is not None]
        if due and min(due) <= now:
            earliest = min(due)
            found[principal] = min(earliest, found.get(principal, earliest))
    return found, prioritized


def has_prioritized(alias: str) -> bool:
    """Whether any waiting occurrence has a priority other than 0: a claim reads the
    prioritized arms only then. False where the database has no partial indexes
    (MySQL/MariaDB): there priority orders each principal's candidate rows, the first ones by
    due time (see :func:`claim_candidates`)."""
    probe = claim_sql.sql_of(alias).get("priority_probe")
    return probe is not None and bool(claim_sql.fetch(alias, probe, []))


def last_claimed_principal(alias: str) -> str | None:
    """The ``principal_key`` of the newest claim among the last ``claim_sql.CURSOR_EVENTS`` events, or
    None: the round-robin cursor of a claimer that keeps none of its own, read from the
    database because many processes claim and each must continue the same rotation."""
    rows = claim_sql.fetch(alias, claim_sql.sql_of(alias)["cursor"], claim_sql.cursor_params())
    return str(rows[0][0]) if rows else None


class Candidate(NamedTuple):
    """One row the fair pool's arms read: a claimable occurrence, what ranks it and what its
    concurrency limits are found by (the claim's columns are read only for the rows locked)."""

    occurrence_id: str
    kind: str
    principal_key: str
    due_at: datetime  # available_at: for a reclaim too, when it first became due
    scheduled_for: datetime
    priority: int
    timeout_ms: int | None  # the job's
    job_id: str
    concurrency_key: str | None
    concurrency: int | None  # the job's
    throttle: Any  # the job's, as the database returns JSON (None: none)

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
        self.sql = claim_sql.sql_of(alias, kinds)
        self.now = claim_sql.adapted(alias, now)
        self.job_params: list[Any] = [True, *(kinds or [])]
        self.parts: list[str] = []
        self.params: list[Any] = []

    def add(self, arm: str, principal: str | None, limit: int) -> None:
        self.parts.append(self.sql[arm])
        self.params += [*([] if principal is None else [principal]), self.now, *self.job_params, limit]

    def fetch(self) -> list[Candidate]:
        sql = " UNION ALL ".join(f"SELECT * FROM ({part}) a{n}" for n, part in enumerate(self.parts))
        rows = claim_sql.fetch(self.alias, sql, self.params)
        self.parts, self.params = [], []
        return [
            Candidate(
                pk,
                kind,
                key,
                claim_sql.as_datetime(due),
                claim_sql.as_datetime(at),
                int(priority),
                None if ms is None else int(ms),
                job,
                limit_key,
                None if limit is None else int(limit),
                throttle,
            )
            for pk, kind, key, due, at, priority, ms, job, limit_key, limit, throttle in rows
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
    alias: str,
    now: datetime,
    kinds: list[str] | None,
    principals: list[str],
    step: int,
    want: int,
    prioritized: bool | None = None,
) -> tuple[dict[str, dict[str, Candidate]], int]:
    """Each principal's first due rows, by principal, in rounds of ``step`` principals until
    ``want`` are found: principals whose waiting work is all of kinds this claimer does not
    run (or of disabled jobs) give no rows, and must not hide the principals after them.
    Also returns how many rows per principal the largest round read. ``prioritized``: what
    :func:`has_prioritized` says, when the caller read it already."""
    pool = _Pool(alias, now, kinds)
    if prioritized is None:
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
    alias: str,
    now: datetime,
    pool: list[Candidate],
    limit: int,
    gate: concurrency.Gate | None = None,
    throttle: throttles.Gate | None = None,
) -> list[Occurrence]:
    """Lock up to ``limit`` of the pool's rows, in pool order, ``limit`` at a time, re-checking
    the due state under the lock: only rows returned stay locked, so a concurrent claimer is
    never kept from rows this one does not take. With a ``gate``, a row over one of its
    concurrency limits is passed over (left as it is) and the next ones are tried; with a
    ``throttle``, a row over its rate is given its own later start (``throttles.Gate.park``)."""
    vendor = connections[alias].vendor
    rank = {row.occurrence_id: index for index, row in enumerate(pool)}
    at = claim_sql.adapted(alias, now)
    got: list[Occurrence] = []
    position = 0
    while len(got) < limit and position < len(pool):
        chunk = [row.occurrence_id for row in pool[position : position + limit - len(got)]]
        position += len(chunk)
        sql = claim_sql.lock_statement(alias, vendor, len(chunk))
        params = [*in_params(connections[alias], chunk), at, at]
        locked = read_models(alias, Occurrence, sql, params)
        if gate is None and throttle is None:
            got += locked
        else:  # in rank order: the first of a limit's candidates take its free places
            ranked = sorted(locked, key=lambda row: rank[row.pk])
            got += [row for row in ranked if _admit(row, gate, throttle)]
    got.sort(key=lambda row: rank[row.pk])
    for occurrence in got:
        row = pool[rank[occurrence.pk]]
        occurrence.claimed_kind = row.kind
        occurrence.claimed_timeout_ms = row.timeout_ms
    return got


def _admit(row: Occurrence, gate: concurrency.Gate | None, throttle: throttles.Gate | None) -> bool:
    """Whether the locked ``row`` starts now: a token of each of its throttles (else it is
    given a later start) and a place in each of its concurrency limits (else it stays)."""
    if throttle is not None and row.pk in throttle.throttles:
        if not throttle.admit(row, take=False):
            throttle.park(row)
            return False
        if gate is not None and not gate.admit(row):
            return False
        return throttle.admit(row)
    return gate is None or gate.admit(row)


def claim_candidates(
    alias: str,
    now: datetime,
    kinds: list[str] | None,
    limit: int,
    after_principal: str | None = None,
    waiting: dict[str, datetime] | None = None,
    before_lock: Callable[[list[str]], None] | None = None,
    max_running_of: Callable[[list[str]], dict[str, int]] | None = None,
    prioritized: bool | None = None,
    throttles_of: Callable[[list[str]], dict[str, Throttle]] | None = None,
    waits: list[datetime] | None = None,
) -> list[Occurrence]:
    """Lock and return up to ``limit`` claimable occurrences, fair across principals.

    Fairness: rank each principal's due occurrences by due time and take rank 1 of every
    principal before rank 2 of any, so one principal's backlog cannot starve another's.
    Among principals of equal rank, those after ``after_principal`` (the last one served:
    the claimer's own cursor, or :func:`last_claimed_principal`) come first, in
    ``principal_key`` order round the ring; without one (no claim yet), principals come in
    the order their earliest occurrence became due.

    The cost does not grow with one principal's backlog: the principals with work are listed
    by :func:`waiting_work`, then each one's first few due rows are read (``_Pool``),
    ``limit * CANDIDATE_FACTOR`` of them, and locked in rank order. ``waiting``: the
    principals, when the caller has listed them already (a hint: every row is re-checked).
    ``before_lock``: called with the pool's principal keys (sorted) before any occurrence row
    is locked, so that a caller can lock rows that come before occurrences in the lock order.
    ``max_running_of``: the principals' running caps (default: read from their policies);
    with any limit among the pool, its slots are locked next (:class:`concurrency.Gate`).
    ``prioritized``: whether any waiting row has a priority, when read with ``waiting``.
    ``throttles_of``: the principals' throttles (default: read from their policies); with any
    throttle among the pool, its buckets are locked after the slots (:class:`throttles.Gate`),
    and the earliest start it found or gave work over the rate is appended to ``waits``.
    """
    want = limit * CANDIDATE_FACTOR
    if waiting is None:
        waiting, prioritized = waiting_work(alias, now)
    if not waiting:
        return []
    principals, step = _rotation(waiting, after_principal, want)
    by_principal, per_principal = _read_pool(alias, now, kinds, principals, step, want, prioritized)
    pool = _ranked(by_principal, per_principal, principals, after_principal is None)[:want]
    if not pool:
        return []
    principal_keys = sorted({row.principal_key for row in pool})
    if before_lock is not None:
        before_lock(principal_keys)
    if max_running_of is None and throttles_of is None:  # a claim that locked no policy: one read
        capped, throttled = _read_policies(principal_keys, alias)
        max_running_of, throttles_of = (lambda keys: capped), (lambda keys: throttled)
    gate = _gate(alias, now, pool, principal_keys, max_running_of)
    throttle = _throttle_gate(alias, now, pool, principal_keys, throttles_of)
    got = _lock_pool(alias, now, pool, limit, gate, throttle)
    if gate is not None:
        gate.save()
    if throttle is not None:
        throttle.save()
        if waits is not None and throttle.wake_at is not None:
            waits.append(throttle.wake_at)
    return got


def _read_policies(principal_keys: list[str], alias: str) -> tuple[dict[str, int], dict[str, Throttle]]:
    """The principals' ``max_running`` and throttles where set, read (not locked) in one
    statement: what a claim outside the worker, which locks no policy, holds them to (the
    slot and bucket rows it locks are what makes them exact)."""
    match = Q()
    for key in principal_keys:
        principal = Principal.from_key(key)
        if principal is not None:
            match |= Q(**principal.columns())
    if not match:
        return {}, {}
    rows = (
        AuthorityPolicy.objects.using(alias)
        .filter(match)
        .filter(Q(max_running__isnull=False) | Q(throttle__isnull=False))
    )
    found = list(rows.only("principal_type", "principal_id", "max_running", "throttle"))
    capped = {
        Principal.of_row(policy).key: policy.max_running for policy in found if policy.max_running is not None
    }
    return capped, throttles.policy_throttles(found)


def _throttle_gate(
    alias: str,
    now: datetime,
    pool: list[Candidate],
    principal_keys: list[str],
    throttles_of: Callable[[list[str]], dict[str, Throttle]] | None,
) -> throttles.Gate | None:
    """The pool's throttles, their buckets locked; None (nothing sent) when no candidate has
    one, which is known from what the claim holds already (the job's throttle read with each
    candidate, the handlers' registry, the principals' policies)."""
    by_principal = {} if throttles_of is None else throttles_of(principal_keys)
    if not by_principal:
        kinds = throttles.throttled_kinds()
        if not any(row.throttle is not None or row.kind in kinds for row in pool):
            return None
    return throttles.gate_for(alias, now, pool, by_principal)


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
    candidate has one. Whether one has is known from what the claim holds already (the
    job's limit read with each candidate, the handlers' registry, the principals' caps):
    a pool without limits costs one look at each, no statement and no slot."""
    if max_running_of is None:
        capped = concurrency.max_running_of(principal_keys, alias)
    else:
        capped = max_running_of(principal_keys)
    if not capped:
        kinds = concurrency.limited_kinds()
        if not any(row.concurrency is not None or row.kind in kinds for row in pool):
            return None
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
