"""The reads that keep a chain real and finite: every job a chain names exists, and the
follow-ups jobs declare lead back to none of them (``rules.chains`` states the specs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..exceptions import InvalidArgument, NotFound
from ..models import Job
from ..rules.chains import EDGES, jobs_named, of_job


def check_jobs_exist(follow_ups: Mapping[str, Any] | None, alias: str, *, skip: str | None = None) -> None:
    """``NotFound`` naming the first job a chain names that does not exist (``skip``: one
    that is being created)."""
    named = jobs_named(follow_ups) - {skip}
    if not named:
        return
    present = set(Job.objects.using(alias).filter(pk__in=sorted(named)).values_list("pk", flat=True))
    missing = sorted(named - present)
    if missing:
        field = next(edge for edge in EDGES if missing[0] in jobs_named({edge: (follow_ups or {}).get(edge)}))
        raise NotFound(f"{field}: job {missing[0]!r} does not exist", {"field": field, "job_id": missing[0]})


def check_no_cycle(job_id: str, declared: Mapping[str, Any] | None, alias: str) -> None:
    """Refuse job follow-ups that lead back to ``job_id`` through the follow-ups the other
    jobs declare: every occurrence would then enqueue another, forever."""
    parent = {name: job_id for name in jobs_named(declared)}
    frontier, seen = set(parent), {job_id}
    while frontier:
        if job_id in frontier:
            path, node = [job_id], parent[job_id]
            while node != job_id:
                path.append(node)
                node = parent[node]
            path = [job_id, *reversed(path)]
            # The field is the edge of this job's own that the cycle leaves by.
            field = next(edge for edge in EDGES if path[1] in jobs_named({edge: (declared or {}).get(edge)}))
            raise InvalidArgument(field, f"makes a cycle of follow-ups: {' -> '.join(path)}", {"cycle": path})
        seen |= frontier
        found: set[str] = set()
        for row in Job.objects.using(alias).filter(pk__in=sorted(frontier)).only("job_id", *EDGES):
            for target in jobs_named(of_job(row)):
                if target == job_id or target not in seen:
                    parent.setdefault(target, row.job_id)
                    found.add(target)
        frontier = found
