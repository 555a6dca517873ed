"""The transactional kernel: the only code that writes occurrence state.

It is a few modules, one per concept, gathered here under one name:

- ``jobs``: job definitions and edits (``create_job``, ``update_job``);
- ``enqueuing``: entering and withdrawing occurrences (``enqueue``, ``enqueue_many``,
  ``enqueue_once_per_trigger``, ``retry_dead_letter``, ``run_now``, ``cancel``; a running one
  is asked to stop, by ``cancelling``);
- ``batches``: sets of occurrences with a callback once all are done (``open_batch``,
  ``close_batch``, ``cancel_batch``, ``enqueue_batch``); ``followups`` enqueues what a chain
  names (``chains``) when an occurrence ends;
- ``materialize``: schedule slots becoming occurrences (``materialize_due``);
- ``claiming``: taking due occurrences fairly (``claim``, ``claim_batch``, ``has_due``), from
  the pool ``candidates`` reads, with the statements of ``claim_sql``; ``concurrency`` and
  ``reservations`` gate what it takes (limits, authority and budgets: ``budgets``,
  ``policies``, ``binding``);
- ``leases``: renew held leases (one, or all a worker holds at once), record what a
  handler did, and the expiry sweep;
- ``settling``: settle, release, and the authority verdicts (``deny``, ``defer``) that end
  a claim; ``cancelling``: the cancel, of one occurrence or a batch's waiting members.

``inserting`` writes a new occurrence for every path that makes one, ``unique`` the unique
and debounced enqueues, and ``notices`` what is told after a commit. What each operation may
do to an occurrence is a row of ``rules.lifecycle.TRANSITIONS``. Every
operation is one short transaction that also appends the event recording it. They
may run inside a caller's ``transaction.atomic()``: then they join it, and their effects
exist exactly when the caller commits.
"""

from __future__ import annotations

from ..rules.events import history
from ..rules.outcomes import Outcome, OutcomeStatus, check_result, storable_error, storable_result
from ..rules.validation import MAX_ATTEMPTS_LIMIT
from .batches import close_batch, get_batch, open_batch
from .batches import complete_due as complete_due_batches
from .batches import members as batch_members
from .batches import progress as batch_progress
from .cancelling import cancel, cancel_batch
from .claiming import claim, claim_batch, has_due
from .enqueuing import (
    enqueue,
    enqueue_batch,
    enqueue_many,
    enqueue_once_per_trigger,
    retry_dead_letter,
    run_now,
)
from .inserting import JOB_PAYLOAD, Enqueued
from .jobs import (
    create_job,
    declared_jobs_of,
    get_job,
    get_occurrence,
    set_declared_in,
    undeclare_job,
    update_job,
)
from .leases import Renewals, abandon, dead_letter_expired, record_execution, renew, renew_many
from .materialize import materialize_due, next_due_at
from .settling import backoff_delay_ms, defer, deny, release, settle, settle_many

__all__ = [
    "JOB_PAYLOAD",
    "MAX_ATTEMPTS_LIMIT",
    "Enqueued",
    "Outcome",
    "OutcomeStatus",
    "Renewals",
    "abandon",
    "backoff_delay_ms",
    "batch_members",
    "batch_progress",
    "cancel",
    "cancel_batch",
    "check_result",
    "claim",
    "claim_batch",
    "close_batch",
    "complete_due_batches",
    "create_job",
    "dead_letter_expired",
    "declared_jobs_of",
    "defer",
    "deny",
    "enqueue",
    "enqueue_batch",
    "enqueue_many",
    "enqueue_once_per_trigger",
    "get_batch",
    "get_job",
    "get_occurrence",
    "has_due",
    "history",
    "materialize_due",
    "next_due_at",
    "open_batch",
    "record_execution",
    "release",
    "renew",
    "renew_many",
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
