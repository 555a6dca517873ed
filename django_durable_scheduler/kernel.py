"""The transactional kernel: the only code that writes occurrence state.

It is five modules, one per concept, gathered here under one name:

- ``jobs``: job definitions and edits (``create_job``, ``update_job``);
- ``enqueuing``: entering and withdrawing occurrences (``enqueue``, ``enqueue_many``,
  ``enqueue_once_per_trigger``, ``retry_dead_letter``, ``run_now``, ``cancel``; a running one
  is asked to stop, by ``cancelling``);
- ``materialize``: schedule slots becoming occurrences (``materialize_due``);
- ``claiming``: taking due occurrences fairly (``claim``, ``claim_batch``, ``has_due``);
- ``leases``: renew, settle, release, and the authority verdicts (``deny``, ``defer``) that
  end a claim.

What each operation may do to an occurrence is a row of ``lifecycle.TRANSITIONS``. Every
operation is one short transaction that also appends the event recording it. They
may run inside a caller's ``transaction.atomic()``: then they join it, and their effects
exist exactly when the caller commits.
"""

from __future__ import annotations

from .claiming import claim, claim_batch, has_due
from .enqueuing import (
    JOB_PAYLOAD,
    cancel,
    enqueue,
    enqueue_many,
    enqueue_once_per_trigger,
    retry_dead_letter,
    run_now,
)
from .events import history
from .identity import MAX_ATTEMPTS_LIMIT
from .jobs import (
    create_job,
    declared_jobs_of,
    get_job,
    get_occurrence,
    set_declared_in,
    undeclare_job,
    update_job,
)
from .leases import (
    backoff_delay_ms,
    check_result,
    dead_letter_expired,
    defer,
    deny,
    record_execution,
    release,
    renew,
    settle,
    settle_many,
    storable_error,
    storable_result,
)
from .materialize import materialize_due, next_due_at

__all__ = [
    "JOB_PAYLOAD",
    "MAX_ATTEMPTS_LIMIT",
    "backoff_delay_ms",
    "cancel",
    "check_result",
    "claim",
    "claim_batch",
    "create_job",
    "dead_letter_expired",
    "declared_jobs_of",
    "defer",
    "deny",
    "enqueue",
    "enqueue_many",
    "enqueue_once_per_trigger",
    "get_job",
    "get_occurrence",
    "has_due",
    "history",
    "materialize_due",
    "next_due_at",
    "record_execution",
    "release",
    "renew",
    "retry_dead_letter",
    "run_now",
    "set_declared_in",
    "settle",
    "settle_many",
    "storable_error",
    "storable_result",
    "undeclare_job",
    "update_job",
]
