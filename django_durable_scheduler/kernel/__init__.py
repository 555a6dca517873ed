"""The transactional kernel: the only code that writes occurrence state.

It is a few modules, one per concept, gathered here under one name:

- ``jobs``: job definitions and edits (``create_job``, ``update_job``);
- ``enqueuing``: entering and withdrawing occurrences (``enqueue``, ``enqueue_many``,
  ``enqueue_once_per_trigger``, ``retry_dead_letter``, ``run_now``, ``cancel``; a running one
  is asked to stop, by ``cancelling``);
- ``batches``: sets of occurrences with a callback once all are done (``open_batch``,
  ``close_batch``, ``cancel_batch``, ``enqueue_batch``); ``followups`` enqueues what a chain
  names when an occurrence ends, and ``chaining`` checks the jobs a chain names;
- ``materialize``: schedule slots becoming occurrences (``materialize_due``);
- ``pausing``: a kind that no worker claims for a while (``pause``, ``resume``,
  ``paused_kinds``), which the claim's statements read;
- ``claiming``: taking due occurrences fairly (``claim``, ``claim_batch``, ``has_due``), from
  the pool ``candidates`` reads, with the statements of ``claim_sql``; ``concurrency`` and
  ``authority/`` gate what it takes (limits; policies, binding, budgets and reservations);
- ``leases``: renew held leases (one, or all a worker holds at once), record what a
  handler did, and the expiry sweep; ``progress``: a running handler's progress report;
  ``workers``: the workers table (a worker's row, written whole, then beaten);
- ``settling``: settle, release, and the authority verdicts (``deny``, ``defer``) that end
  a claim; ``cancelling``: the cancel, of one occurrence or a batch's waiting members.

``inserting`` writes a new occurrence for every path that makes one, ``unique`` the unique
and debounced enqueues, ``events`` appends the history and reads it back (``history``), and
``notices`` what is told after a commit. What each operation may do to an occurrence is a row
of ``rules.lifecycle.TRANSITIONS``, written as ``transitions.writes`` says. Every
operation is one short transaction that also appends the event recording it. They
may run inside a caller's ``transaction.atomic()``: then they join it, and their effects
exist exactly when the caller commits.

This module is the kernel's one facade: the worker (and the testing toolkit that drives its
parts) imports these names and no submodule, so what the loop may do to the database is this
list (``tests/test_layers.py`` holds it to that).
"""

from __future__ import annotations

from ..rules.outcomes import (
    Outcome,
    OutcomeStatus,
    backoff_delay_ms,
    check_result,
    storable_error,
    storable_result,
)
from ..rules.validation import MAX_ATTEMPTS_LIMIT
from .authority.reservations import DEFERRED, DENIED, LEASE_LOST, Authorization, AuthorizedClaim, Units
from .batches import close_batch, get_batch, open_batch
from .batches import complete_due as complete_due_batches
from .batches import members as batch_members
from .batches import progress as batch_progress
from .cancelling import cancel, cancel_batch
from .claiming import claim, claim_authorized, claim_batch, has_due
from .enqueuing import (
    enqueue,
    enqueue_batch,
    enqueue_many,
    enqueue_once_per_trigger,
    retry_dead_letter,
    run_now,
)
from .events import history
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
from .pausing import pause, paused_kinds, resume
from .progress import record_progress
from .settling import defer, deny, release, settle, settle_many
from .workers import WorkerRecord, beat_worker, record_worker, renew_and_beat

__all__ = [
    "DEFERRED",
    "DENIED",
    "JOB_PAYLOAD",
    "LEASE_LOST",
    "MAX_ATTEMPTS_LIMIT",
    "Authorization",
    "AuthorizedClaim",
    "Enqueued",
    "Outcome",
    "OutcomeStatus",
    "Renewals",
    "Units",
    "WorkerRecord",
    "abandon",
    "backoff_delay_ms",
    "batch_members",
    "batch_progress",
    "beat_worker",
    "cancel",
    "cancel_batch",
    "check_result",
    "claim",
    "claim_authorized",
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
    "pause",
    "paused_kinds",
    "record_execution",
    "record_progress",
    "record_worker",
    "release",
    "renew",
    "renew_and_beat",
    "renew_many",
    "resume",
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
