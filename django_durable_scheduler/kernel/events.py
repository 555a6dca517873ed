"""The append-only history: the event a kernel operation appends (in the same transaction as
the change it records), and reading it back. The event types are ``rules.events``'s."""

from __future__ import annotations

import heapq
from datetime import datetime
from typing import Any

from ..db.dialect import alias_for
from ..exceptions import InvalidArgument
from ..models import Event, Occurrence
from ..rules.validation import normalize_bool, normalize_identifier, normalize_int


def new_event(
    job_id: str,
    event_type: str,
    at: datetime,
    *,
    occurrence_id: str | None = None,
    owner_id: str | None = None,
    fence: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """An unsaved event (the caller saves it inside its transaction, alone or in bulk)."""
    return Event(
        job_id=job_id,
        occurrence_id=occurrence_id,
        event_type=event_type,
        occurred_at=at,
        owner_id=owner_id,
        fence=fence,
        data=data or {},
    )


# Occurrences ``history(follow=True)`` reads the events of at most, and ids per statement.
MAX_FOLLOWED = 10_000
_CHUNK = 1000


def history(
    job_id: str | None = None,
    occurrence_id: str | None = None,
    limit: int = 50,
    *,
    follow: bool = False,
    using: str | None = None,
) -> list[Event]:
    """Events newest first, at most ``limit``: of a job, of an occurrence, or of everything
    (given both, the job's events of that occurrence).

    ``follow=True`` (with ``occurrence_id`` only) also reads the events of every occurrence
    the occurrence caused, transitively: its follow-ups (``Occurrence.caused_by``), theirs,
    and so on, found even once the occurrence itself is pruned. A chain is followed to its
    first :data:`MAX_FOLLOWED` occurrences, nearest steps first, so one with an enormous
    fan-out costs a bounded read."""
    limit = normalize_int(limit, "limit", minimum=1, maximum=10_000)
    follow = normalize_bool(follow, "follow")
    if follow and occurrence_id is None:
        raise InvalidArgument("follow", "needs occurrence_id: the occurrence whose chain to follow")
    alias = alias_for(using)
    qs = Event.objects.using(alias).all()
    if job_id is not None:
        qs = qs.filter(job_id=normalize_identifier(job_id, "job_id"))
    if occurrence_id is None:
        return list(qs.order_by("-event_id")[:limit])
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    if not follow:
        return list(qs.filter(occurrence_id=occurrence_id).order_by("-event_id")[:limit])
    found: list[Event] = []
    ids = chain_of(occurrence_id, alias)
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        found.extend(qs.filter(occurrence_id__in=chunk).order_by("-event_id")[:limit])
    return heapq.nlargest(limit, found, key=lambda event: event.event_id)


def chain_of(occurrence_id: str, alias: str, *, limit: int = MAX_FOLLOWED) -> list[str]:
    """``occurrence_id`` and the occurrences it caused, transitively, breadth first (each
    step one read of the ``caused_by`` index per chunk of the step before), at most
    ``limit`` ids."""
    chain, seen = [occurrence_id], {occurrence_id}
    frontier = [occurrence_id]
    while frontier and len(chain) < limit:
        step: list[str] = []
        for start in range(0, len(frontier), _CHUNK):
            causes = frontier[start : start + _CHUNK]
            rows = Occurrence.objects.using(alias).filter(caused_by__in=causes).order_by("pk")
            for pk in rows.values_list("pk", flat=True)[: limit - len(chain)]:
                if pk not in seen:
                    seen.add(pk)
                    step.append(pk)
                    chain.append(pk)
            if len(chain) >= limit:
                break
        frontier = step
    return chain
