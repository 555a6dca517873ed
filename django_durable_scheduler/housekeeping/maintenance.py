"""Leases on the periodic tasks that workers share (a ``MaintenanceLease`` row per task): one
worker at a time across hosts runs the task, at most once per period, and a killed holder's
lease runs out so that another worker takes the task over.

Taking is one conditional ``UPDATE`` (or, the first time, one ``INSERT``): of racing workers
exactly one changes the row, on every database, with no lock held beyond that statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from ..models import MaintenanceLease


@dataclass(frozen=True)
class Held:
    """A lease this worker took: renewing or releasing it is refused once another took it."""

    name: str
    owner: str
    started_at: datetime
    alias: str

    def _mine(self) -> Any:
        return MaintenanceLease.objects.using(self.alias).filter(
            name=self.name, owner=self.owner, last_started_at=self.started_at
        )

    def renew(self, now: datetime, lease: timedelta) -> bool:
        """Extend the lease to ``now + lease``; False when it was lost (expired and taken)."""
        return bool(self._mine().filter(expires_at__gt=now).update(expires_at=now + lease))

    def release(self, now: datetime, result: dict[str, Any]) -> bool:
        """Record the run's ``result`` and free the lease; False when it was lost."""
        return bool(self._mine().update(expires_at=None, last_finished_at=now, last_result=result))


def take(
    name: str, owner: str, *, now: datetime, lease: timedelta, period: timedelta, alias: str
) -> Held | None:
    """The lease on task ``name`` for ``owner`` until ``now + lease``, when nobody holds it
    (released, or expired) and the task last started at least ``period`` ago; else None."""
    rows = MaintenanceLease.objects.using(alias)
    current = rows.filter(name=name).first()
    if current is None:
        try:
            with transaction.atomic(using=alias):
                rows.create(name=name, owner=owner, expires_at=now + lease, last_started_at=now)
        except IntegrityError:
            return None  # another worker inserted it first: it holds the lease
        return Held(name, owner, now, alias)
    # Read first: the usual answer (not due yet) costs no write.
    if current.expires_at is not None and current.expires_at > now:
        return None
    if current.last_started_at is not None and current.last_started_at > now - period:
        return None
    free = Q(expires_at__isnull=True) | Q(expires_at__lte=now)
    due = Q(last_started_at__isnull=True) | Q(last_started_at__lte=now - period)
    taken = rows.filter(free, due, name=name).update(owner=owner, expires_at=now + lease, last_started_at=now)
    return Held(name, owner, now, alias) if taken else None


def last_run(name: str, alias: str) -> MaintenanceLease | None:
    """The lease row of task ``name`` (its last run), or None before the first."""
    return MaintenanceLease.objects.using(alias).filter(name=name).first()
