"""Binding jobs and occurrences to policy revisions: which of a principal's jobs and pending
occurrences a policy covers, rebinding them when it changes (``policies.change_policy``, in
its transaction), the read-only preview of a change, and the jobs whose principal has no
policy at all (``docs/design.md``, "Authority checks").

Rebinding runs after the policy row is locked and locks the job rows, then the occurrence
rows, in keyset pages: the lock order of ``policies.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from django.db.models import Model, QuerySet

from ... import conf
from ...db.dialect import alias_for
from ...models import PENDING_STATUSES, AuthorityPolicy, Job, Occurrence
from ...rules.authority import (
    Envelope,
    Principal,
    bind,
    bound_revision,
    missing_capabilities,
    normalize_capabilities,
)
from ...rules.lifecycle import Action, applied
from ...rules.validation import normalize_bool
from ..transitions import writes
from ..writing import writing

M = TypeVar("M", bound=Model)

# Rows read (and locked) per batch while rebinding: memory stays bounded by this.
REBIND_BATCH = 500


def covers(enabled: bool, capabilities: Iterable[str], authority: Envelope) -> bool:
    """True when an enabled policy with ``capabilities`` grants everything ``authority`` asks for."""
    return enabled and not missing_capabilities(list(capabilities), authority)


def _pages(base: QuerySet[M], key: str, lock: bool) -> Iterator[list[M]]:
    """``base`` (ordered by ``key``) in keyset pages of ``REBIND_BATCH`` rows, each locked
    when ``lock``: memory stays bounded whatever the principal holds."""
    last: Any = None
    while True:
        page = base if last is None else base.filter(**{f"{key}__gt": last})
        if lock:
            page = page.select_for_update()
        rows = list(page[:REBIND_BATCH])
        if not rows:
            return
        yield rows
        last = getattr(rows[-1], key)


def _job_batches(principal: Principal, alias: str, *, lock: bool) -> Iterator[list[Job]]:
    # Jobs have no principal column: a JSON key lookup narrows the scan, and the principal
    # is re-checked in Python. Keyset pages keep memory bounded.
    base = (
        Job.objects.using(alias)
        .filter(authority__principal__type=principal.type, authority__principal__id=principal.id)
        .only("job_id", "authority")
        .order_by("job_id")
    )
    for rows in _pages(base, "job_id", lock):
        yield [row for row in rows if Principal.found_in(row.authority) == principal]


def _occurrence_batches(principal: Principal, alias: str, *, lock: bool) -> Iterator[list[Occurrence]]:
    base = (
        Occurrence.objects.using(alias)
        .filter(principal_key=principal.key, status__in=PENDING_STATUSES)
        .only("occurrence_id", "authority", "status")
        .order_by("occurrence_id")
    )
    for rows in _pages(base, "occurrence_id", lock):
        # Re-checked under the lock: a claim may have taken a row since it was listed.
        yield [
            row
            for row in rows
            if row.status in PENDING_STATUSES and Principal.found_in(row.authority) == principal
        ]


def _follows_the_policy(authority: Envelope, before: AuthorityPolicy | None) -> bool:
    """Whether an envelope the new revision does not cover moves to it anyway: one bound to
    no revision, or to the previous revision that did not grant it either, was never
    granted, so it has no grant to lose; bound to the current revision, the worker then
    names what is missing (``permission_denied``) instead of a stale binding."""
    bound = bound_revision(authority)
    return bound is None or (
        before is not None
        and bound == before.revision
        and not covers(before.enabled, before.capabilities, authority)
    )


def _rebind_jobs(rows: list[Job], revision: int, alias: str) -> None:
    for row in rows:
        row.authority = bind(row.authority, revision)
    Job.objects.using(alias).bulk_update(rows, ["authority"])


def _rebind_occurrences(rows: list[Occurrence], revision: int, alias: str) -> None:
    """The ``rebind`` transition of the lifecycle table, for each of ``rows`` (some), in one
    UPDATE."""
    now = conf.now()
    for row in rows:
        values = writes(Action.REBIND, now, authority=bind(row.authority, revision))
        applied(Action.REBIND, row, values)
    with writing(Action.REBIND):
        Occurrence.objects.using(alias).bulk_update(rows, list(values))


def rebind(
    principal: Principal,
    *,
    enabled: bool,
    capabilities: list[str],
    alias: str,
    rebind_to: int | None,
    before: AuthorityPolicy | None = None,
) -> dict[str, int]:
    """Count (and with ``rebind_to``, rebind) the principal's covered jobs and pending
    occurrences; the uncovered ones are counted stale, and those that were never granted
    move to ``rebind_to`` too (``before``: the previous revision). Without ``rebind_to``
    nothing is locked or written (a preview)."""
    counts = {"rebound_jobs": 0, "stale_jobs": 0, "rebound_occurrences": 0, "stale_occurrences": 0}
    lock = rebind_to is not None
    sources: list[tuple[str, Iterator[list[Any]], Callable[[list[Any], int, str], None]]] = [
        ("jobs", _job_batches(principal, alias, lock=lock), _rebind_jobs),
        ("occurrences", _occurrence_batches(principal, alias, lock=lock), _rebind_occurrences),
    ]
    for label, batches, write in sources:
        for rows in batches:
            changed = []
            for row in rows:
                if covers(enabled, capabilities, row.authority):
                    counts[f"rebound_{label}"] += 1
                else:
                    counts[f"stale_{label}"] += 1
                    if not _follows_the_policy(row.authority, before):
                        continue
                if rebind_to is not None and bound_revision(row.authority) != rebind_to:
                    changed.append(row)
            if changed and rebind_to is not None:
                write(changed, rebind_to, alias)
    return counts


def preview_policy_change(
    principal_type: str,
    principal_id: str,
    *,
    capabilities: Any,
    enabled: bool = True,
    using: str | None = None,
) -> dict[str, int]:
    """Read-only: how many of the principal's jobs and pending occurrences a change to
    ``capabilities``/``enabled`` would rebind, and how many it would leave stale."""
    principal = Principal.parse((principal_type, principal_id))
    caps = normalize_capabilities(capabilities, "capabilities")
    active = normalize_bool(enabled, "enabled")
    return rebind(principal, enabled=active, capabilities=caps, alias=alias_for(using), rebind_to=None)


def jobs_without_policy(*, using: str | None = None) -> dict[Principal, list[str]]:
    """The enabled jobs whose principal has no policy, by principal: every run of theirs is
    denied ``policy_required`` until one is set."""
    alias = alias_for(using)
    having = set(AuthorityPolicy.objects.using(alias).values_list("principal_type", "principal_id"))
    found: dict[Principal, list[str]] = {}
    jobs = Job.objects.using(alias).filter(enabled=True).order_by("job_id")
    for job_id, authority in jobs.values_list("job_id", "authority").iterator():
        principal = Principal.found_in(authority)
        if principal is None:
            continue
        key = Principal(str(principal.type), str(principal.id))
        if key not in having:
            found.setdefault(key, []).append(job_id)
    return found
