"""The workers table: one row per ``runscheduler`` process, which the status command and the
admin list as live workers. The worker's heartbeat decides when to write it; these are the
writes, so that the worker itself writes no table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from .. import conf
from ..db.dialect import alias_for
from ..models import WorkerHeartbeat
from .leases import Renewals, renew_many


@dataclass(frozen=True)
class WorkerRecord:
    """What a worker's row says of the process, written whole by :func:`record_worker`."""

    worker_id: str
    hostname: str
    pid: int
    concurrency: int
    kinds: list[str]
    started_at: datetime


def record_worker(
    record: WorkerRecord, *, at: datetime, stopped: bool = False, using: str | None = None
) -> None:
    """Write the worker's row whole, seen ``at`` (and stopped then, if ``stopped``): an insert
    the first time, so that a worker whose earlier write failed is listed once this one succeeds."""
    values = {
        "hostname": record.hostname,
        "pid": record.pid,
        "concurrency": record.concurrency,
        "kinds": record.kinds,
        "started_at": record.started_at,
        "last_seen_at": at,
        "stopped_at": at if stopped else None,
    }
    WorkerHeartbeat.objects.using(using).update_or_create(worker_id=record.worker_id, defaults=values)


def beat_worker(worker_id: str, *, at: datetime, stopped: bool = False, using: str | None = None) -> None:
    """Mark the worker's row (written before by :func:`record_worker`) seen ``at``, and
    stopped then if ``stopped``: one UPDATE of two columns, the beat's whole cost."""
    values = {"last_seen_at": at}
    if stopped:
        values["stopped_at"] = at
    WorkerHeartbeat.objects.using(using).filter(worker_id=worker_id).update(**values)


def renew_and_beat(
    held_leases: Sequence[tuple[str, int]],
    *,
    owner: str,
    lease: float | timedelta,
    using: str | None = None,
) -> Renewals:
    """:func:`~.leases.renew_many` and :func:`beat_worker` of ``owner`` in one transaction:
    one commit, so that a worker holding leases has no write of its own to wait for."""
    alias = alias_for(using)
    with transaction.atomic(using=alias):
        renewals = renew_many(held_leases, owner=owner, lease=lease, using=alias)
        beat_worker(owner, at=conf.now(), using=alias)
    return renewals
