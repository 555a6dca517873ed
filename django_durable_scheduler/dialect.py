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

import time
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, F, IntegerField, Q, QuerySet, When, Window
from django.db.models.functions import RowNumber

from .models import Occurrence, OccurrenceStatus

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


def _due_at() -> Case:
    # A reclaim is due when its lease expired; anything else when it becomes available.
    return Case(When(status=OccurrenceStatus.RUNNING, then=F("lease_expires_at")), default=F("available_at"))


def claim_candidates(
    alias: str, due: Q, job_filter: Q, limit: int, after_principal: str | None = None
) -> list[Occurrence]:
    """Lock and return up to ``limit`` claimable occurrences, fair across principals.

    Fairness: within the due set, rank each principal's occurrences by due time and take
    rank 1 of every principal before rank 2 of any, so one principal's backlog cannot
    starve another's. Among principals of equal rank, those after ``after_principal`` (the
    last one this claimer served) come first: a claimer taking one at a time goes round
    the principals instead of serving the earliest-due backlog again and again.

    Window functions cannot be combined with FOR UPDATE, so the ranked pool is read first,
    then locked in rank order, ``limit`` rows at a time, re-checking the due state under
    the lock: only rows that are returned stay locked, so a concurrent claimer is never
    kept from rows this one does not take.
    """
    base = Occurrence.objects.using(alias)
    rotation: list[Any] = []
    if after_principal is not None:
        rotation = [
            Case(When(principal_key__gt=after_principal, then=0), default=1, output_field=IntegerField())
        ]
    pool = list(
        base.filter(due & job_filter)
        .annotate(
            due_at=_due_at(),
            fair_rank=Window(
                RowNumber(),
                partition_by=[F("principal_key")],
                order_by=[_due_at().asc(), F("scheduled_for").asc(), F("occurrence_id").asc()],
            ),
        )
        .order_by(
            "fair_rank",
            *rotation,
            *(["principal_key"] if rotation else []),
            "due_at",
            "scheduled_for",
            "occurrence_id",
        )
        .values_list("occurrence_id", "job__kind")[: limit * CANDIDATE_FACTOR]
    )
    kinds = dict(pool)
    rank = {pk: index for index, (pk, _) in enumerate(pool)}
    fields = (
        "occurrence_id",
        "job_id",
        "status",
        "attempt",
        "max_attempts",
        "fence",
        "lease_owner",
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
    # ``job_filter`` joins jobs (enabled, kind). Re-checking it under FOR UPDATE would lock
    # job rows too on MySQL (no OF), making claimers skip each other's jobs; so the locking
    # query re-checks only the occurrence's own due state, which is what races.
    got: list[Occurrence] = []
    position = 0
    ids = [pk for pk, _ in pool]
    while len(got) < limit and position < len(ids):
        chunk = ids[position : position + limit - len(got)]
        position += len(chunk)
        got += lock_rows(base.filter(due, pk__in=chunk).only(*fields), alias)
    got.sort(key=lambda row: rank[row.pk])
    for row in got:
        row.claimed_kind = kinds[row.pk]
    return got


def notify_new_work(alias: str) -> None:
    """On PostgreSQL, tell listening workers that work was enqueued. Sent inside the
    transaction, so PostgreSQL delivers it only if (and when) the transaction commits."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])


class Listener:
    """A dedicated PostgreSQL connection that LISTENs for new work and calls ``wake()``.

    Elsewhere (SQLite, MySQL) ``supported`` is False and the worker polls.
    """

    def __init__(self, alias: str, wake: Any, log: Any) -> None:
        self.alias = alias
        self.wake = wake
        self.log = log
        self.supported = connections[alias].vendor == "postgresql"
        self._stop = False

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
