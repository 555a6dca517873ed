"""Django signals that ``runscheduler`` sends as it works, for your own bookkeeping.

Every signal is sent with ``sender`` the :class:`~django_durable_scheduler.worker.Worker`
class (connect with ``sender=Worker`` or without a sender) and these keyword arguments
in common:

- ``worker_id``: the sending process's ``--worker-id``;
- ``occurrence``: the :class:`~django_durable_scheduler.models.Occurrence` as the worker
  claimed it (its fields are those of the claim, not re-read: do not save it);
- ``kind``: the job's kind.

Receivers run in the worker's threads, so keep them quick: the loop thread sends every
signal but ``occurrence_started``, which the handler thread sends just before the handler
runs, and ``occurrence_progressed``, which it sends as a progress report is written. They
are sent with ``send_robust``: a receiver that raises never stops the worker; Django logs
its exception once at ERROR on the ``django.dispatch`` logger. A signal
nobody listens to costs the worker one dictionary look-up.

Occurrences dead-lettered by another path than this worker's (a lease that expired on its
last attempt, found by any worker's sweep; an admin action) send no signal.

The kernel sends two more (:data:`KERNEL`), wherever the work happens (a worker, a web
request, a command), once the transaction that did it has committed (never for one that
rolled back), with ``sender`` the model class of what they announce: ``batch_completed``
and ``follow_up_enqueued``. Also robustly, and also costing one look-up when unheard.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

occurrence_claimed = Signal(use_caching=True)
"""An occurrence was claimed and authorized and is about to be queued for a handler thread
(denied and deferred ones send ``authority_denied``/``budget_deferred`` instead). Extra
keyword arguments: none."""

occurrence_started = Signal(use_caching=True)
"""A handler thread is about to call the handler. Extra keyword arguments: ``attempt``
(1 for the first run) and ``timeout`` (seconds, or None)."""

occurrence_finished = Signal(use_caching=True)
"""The outcome of a run was recorded. Extra keyword arguments: ``outcome`` (the status it
was settled to: ``"succeeded"``, ``"retry_wait"`` or ``"dead_letter"``), ``result`` (the
handler's result, or None), ``error`` (the stored error dict, or None), ``exception`` (what
the handler raised, or None; a :class:`~django_durable_scheduler.exceptions.HandlerTimeout`
for a run that timed out) and ``duration`` (seconds from the claim to the settle)."""

occurrence_progressed = Signal(use_caching=True)
"""A handler's progress report (``ctx.report_progress``) was written: at most about once a
second per run, and once more with the last report when the handler returns, if that one had
been held back. Extra keyword arguments: ``done``, ``total`` (None if not known) and
``note`` (None if none)."""

occurrence_dead_lettered = Signal(use_caching=True)
"""An occurrence was dead-lettered by this worker: its last attempt failed, it failed for
good (``PermanentFailure``, an invalid result) or its authority denied it. Sent after
``occurrence_finished`` or ``authority_denied``. Extra keyword arguments: ``error`` (the
stored error dict) and ``exception`` (what the handler raised, or None)."""

authority_denied = Signal(use_caching=True)
"""The occurrence's principal may not run it: dead-lettered without running (see
``occurrence_dead_lettered``). Extra keyword arguments: ``reason`` (``policy_required``,
``policy_unbound``, ``policy_stale``, ``permission_denied``, ...) and ``error`` (the stored
error dict, whose message names the principal and what is missing)."""

budget_deferred = Signal(use_caching=True)
"""The principal's budget for this window is spent: the occurrence waits, without using an
attempt, until the window ends. Extra keyword arguments: ``reason``
(``"budget_exhausted"``)."""

batch_completed = Signal(use_caching=True)
"""A batch completed: every member ended, and its callback was enqueued. ``sender``:
:class:`~django_durable_scheduler.models.Batch`. Keyword arguments: ``batch`` (the
completed batch: its ``counts``, members by outcome, and ``callback``, the callback
occurrence's id), ``kind`` (the callback job's kind) and ``cancelled`` (whether the batch was
cancelled)."""

follow_up_enqueued = Signal(use_caching=True)
"""A follow-up was enqueued, as its predecessor reached the status its chain names.
``sender``: :class:`~django_durable_scheduler.models.Occurrence`. Keyword arguments:
``occurrence`` (the follow-up), ``kind`` (its job's kind), ``predecessor`` (the id of the
occurrence it follows) and ``on`` (the edge: ``"then"`` or ``"on_dead_letter"``)."""

# The signals the worker sends.
ALL = (
    occurrence_claimed,
    occurrence_started,
    occurrence_progressed,
    occurrence_finished,
    occurrence_dead_lettered,
    authority_denied,
    budget_deferred,
)


# The signals the kernel sends after a commit.
KERNEL = (batch_completed, follow_up_enqueued)


def send(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send ``signal`` robustly (Django logs a receiver's exception at ERROR)."""
    signal.send_robust(sender, **kwargs)
