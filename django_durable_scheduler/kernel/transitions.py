"""The lifecycle table's writes and conditions as the ORM says them: what
``rules.lifecycle`` states in words and plain values, with the expressions the database
works out from the row (the attempt, the fence, a cancel request's) and the conditions the
expiry sweep and the fenced writes select their rows by.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Case, F, PositiveSmallIntegerField, Q, When

from ..rules import lifecycle
from ..rules.lifecycle import RUNNING, Action, Attempt, Fence

# How the UPDATE computes each derived column (``lifecycle.derived_by``) from the row.
_EXPRESSIONS: dict[Attempt | Fence | str, Any] = {
    Attempt.USES: F("attempt") + 1,
    Attempt.GIVES_BACK: Case(
        When(attempt__gt=0, then=F("attempt") - 1),
        default=F("attempt"),
        output_field=PositiveSmallIntegerField(),
    ),
    Fence.ADVANCES: F("fence") + 1,
    "cancel_requested_fence": F("fence"),
    "max_attempts": F("attempt"),
}


def writes(action: Action, now: datetime, **given: Any) -> dict[str, Any]:
    """The column values the ``action``'s UPDATE writes: exactly its ``sets``
    (:func:`rules.lifecycle.writes`, with the derived columns as expressions)."""
    values = lifecycle.writes(action, now, **given)
    for column, key in lifecycle.derived_by(action):
        values.setdefault(column, _EXPRESSIONS[key])
    return values


def expired(now: datetime) -> Q:
    """The expiry sweep's rows (``expire``, ``expire_cancelled``): running, the lease expired
    on the final attempt (the complement of ``lifecycle.RECLAIMABLE_SQL`` among expired leases)."""
    return Q(status=RUNNING, lease_expires_at__lte=now, attempt__gte=F("max_attempts"))


def held(owner: str, fence: int, now: datetime) -> Q:
    """The fence rule (``lifecycle.holds_lease``) as a condition: ``owner`` holds the running
    occurrence's lease at ``fence``, unexpired. For a write that must not touch a lease it
    lost, made as one UPDATE instead of a read under a lock."""
    return Q(status=RUNNING, lease_owner=owner, fence=fence, lease_expires_at__gt=now)
