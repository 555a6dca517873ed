"""Pausing a kind: while a kind is paused no worker claims its occurrences (nor reclaims
them); they wait, and its running ones finish. A ``django.tasks`` queue is the kind
``django.tasks:<queue>``. See docs/design.md, "Pausing a kind".

The pause is a ``PausedKind`` row, read by every claim inside its own statements
(``claim_sql``), so a claim that starts after the pause commits leaves the kind alone and
plain work pays no statement for it. Each change appends a ``kind_paused`` or
``kind_resumed`` event to every job of the kind, in the same transaction; pausing what is
paused, or resuming what is not, changes nothing and records nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from .. import conf
from ..db import dialect
from ..db.wakeup import notify_new_work
from ..exceptions import NotFound
from ..models import Job, PausedKind, WorkerHeartbeat
from ..rules.events import KIND_PAUSED, KIND_RESUMED
from ..rules.validation import normalize_identifier
from .events import new_event

MAX_KIND = 128  # the column's length
MAX_BY = 256


def pause(kind: str, *, by: str | None = None, using: str | None = None) -> bool:
    """Pause ``kind`` on every worker: from the commit on, no claim takes its occurrences;
    running ones finish. ``by`` says who, for the record. True if this call paused it, False
    if it was paused already (nothing is written then). A kind that no job has and no running
    worker runs is refused (``SCHEDULER_NOT_FOUND``, naming ``kind``): a typo pauses nothing."""
    kind = normalize_identifier(kind, "kind", max_length=MAX_KIND)
    who = "" if by is None else normalize_identifier(by, "by", max_length=MAX_BY)
    now = conf.now()
    with dialect.write_transaction(using) as alias:
        jobs = _jobs_of(kind, alias)
        if not jobs and not _run_by_a_worker(kind, alias):
            raise _unknown(kind)
        try:
            with transaction.atomic(using=alias):
                PausedKind(kind=kind, paused_at=now, paused_by=who).save(using=alias, force_insert=True)
        except IntegrityError:
            return False  # paused already (by this call's twin, if they raced)
        _record(jobs, KIND_PAUSED, {"kind": kind, "by": who}, now, alias)
    return True


def resume(kind: str, *, by: str | None = None, using: str | None = None) -> bool:
    """Resume ``kind``: workers claim its due occurrences again at their next turn (they are
    woken for it). True if this call resumed it, False if it was not paused (nothing is
    written then); a kind neither paused nor known is refused as :func:`pause` refuses it."""
    kind = normalize_identifier(kind, "kind", max_length=MAX_KIND)
    who = "" if by is None else normalize_identifier(by, "by", max_length=MAX_BY)
    now = conf.now()
    with dialect.write_transaction(using) as alias:
        jobs = _jobs_of(kind, alias)
        deleted, _ = PausedKind.objects.using(alias).filter(kind=kind).delete()
        if not deleted:
            if not jobs and not _run_by_a_worker(kind, alias):
                raise _unknown(kind)
            return False
        _record(jobs, KIND_RESUMED, {"kind": kind, "by": who}, now, alias)
        notify_new_work(alias)
    return True


def paused_kinds(*, using: str | None = None) -> list[PausedKind]:
    """The kinds paused now, by kind (each with when and by whom)."""
    return list(PausedKind.objects.using(dialect.alias_for(using)).order_by("kind"))


def _jobs_of(kind: str, alias: str) -> list[str]:
    jobs = Job.objects.using(alias).filter(kind=kind).order_by("job_id")
    return list(jobs.values_list("job_id", flat=True))


def _run_by_a_worker(kind: str, alias: str) -> bool:
    """Whether a worker not stopped lists ``kind`` among those it runs: a queue or a handler
    that no job has used yet is known to the workers that run it."""
    workers = WorkerHeartbeat.objects.using(alias).filter(stopped_at__isnull=True)
    return any(isinstance(kinds, list) and kind in kinds for kinds in workers.values_list("kinds", flat=True))


def _record(jobs: list[str], event_type: str, data: dict[str, Any], now: Any, alias: str) -> None:
    """The change's event on each job of the kind: each job's history shows it."""
    dialect.insert(alias, [new_event(job_id, event_type, now, data=data) for job_id in jobs])


def _unknown(kind: str) -> NotFound:
    return NotFound(
        f"kind {kind!r}: no job has this kind and no running worker runs it",
        {"field": "kind", "kind": kind},
    )
