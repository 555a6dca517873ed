"""django-durable-scheduler: durable scheduling for Django.

    import django_durable_scheduler as scheduler

The public API (stable names) is re-exported here lazily, so importing the package does
not import Django models before the app registry is ready.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # kernel
    "create_job": "kernel",
    "update_job": "kernel",
    "enqueue": "kernel",
    "enqueue_once_per_trigger": "kernel",
    "enqueue_many": "kernel",
    "enqueue_batch": "kernel",
    "open_batch": "kernel",
    "close_batch": "kernel",
    "cancel_batch": "kernel",
    "get_batch": "kernel",
    "batch_progress": "kernel",
    "batch_members": "kernel",
    "cancel": "kernel",
    "retry_dead_letter": "kernel",
    "run_now": "kernel",
    "claim": "kernel",
    "claim_batch": "kernel",
    "renew": "kernel",
    "settle": "kernel",
    "settle_many": "kernel",
    "release": "kernel",
    "history": "kernel",
    "get_job": "kernel",
    "get_occurrence": "kernel",
    "dead_letter_expired": "kernel",
    "materialize_due": "kernel",
    "record_execution": "kernel",
    "record_progress": "kernel",
    "deny": "kernel",
    "defer": "kernel",
    "pause": "kernel",
    "resume": "kernel",
    "paused_kinds": "kernel",
    # the values that cross the API
    "Enqueued": "kernel",
    "OutcomeStatus": "kernel",
    "Verdict": "kernel.authority.reservations",
    "Envelope": "rules.authority",
    "EnvelopePrincipal": "rules.authority",
    "AuthorizationRefs": "rules.authority",
    "Predecessor": "rules.causes",
    "BatchSummary": "rules.causes",
    # authority policies and reservations
    "set_policy": "kernel.authority.policies",
    "change_policy": "kernel.authority.policies",
    "get_policy": "kernel.authority.policies",
    "ensure_policy": "kernel.authority.policies",
    "preview_policy_change": "kernel.authority.binding",
    "policy_history": "kernel.authority.policies",
    "current_usage": "kernel.authority.budgets",
    "bind_to_current_policy": "kernel.authority.policies",
    "PolicyChange": "kernel.authority.policies",
    "WindowUsage": "kernel.authority.budgets",
    "reserve_authority": "kernel.authority.reservations",
    "authorize": "kernel.authority.reservations",
    "authorize_many": "kernel.authority.reservations",
    "get_reservation": "kernel.authority.reservations",
    "audit_budgets": "kernel.authority.budgets",
    "WindowCheck": "kernel.authority.budgets",
    # handlers and the worker
    "handler": "handlers.registry",
    "declare_job": "handlers.declared",
    "Worker": "worker",
    "ExecutionContext": "worker.context",
    # identity
    "canonical_json": "rules.identity",
    "derive_occurrence_identity": "rules.identity",
    # triggers
    "next_fire_times": "rules.triggers.fire_times",
    # exceptions
    "SchedulerError": "exceptions",
    "InvalidArgument": "exceptions",
    "Conflict": "exceptions",
    "RevisionConflict": "exceptions",
    "NotFound": "exceptions",
    "JobDisabled": "exceptions",
    "IdempotencyPayloadMismatch": "exceptions",
    "LeaseLost": "exceptions",
    "InvalidState": "exceptions",
    "DataCorrupt": "exceptions",
    "AuthorityPolicyConflict": "exceptions",
    "AuthorityPolicyRequired": "exceptions",
    "AuthorityPolicyUnbound": "exceptions",
    "AuthorityPolicyStale": "exceptions",
    "AuthorityPermissionDenied": "exceptions",
    "AuthorityBudgetStateInvalid": "exceptions",
    "AuthorityBudgetExhausted": "exceptions",
    "AuthorityReservationMismatch": "exceptions",
    "AuthorityOccurrenceNotRunning": "exceptions",
    "AuthoritySettlementConflict": "exceptions",
    "Retry": "exceptions",
    "PermanentFailure": "exceptions",
    "HandlerTimeout": "exceptions",
    "OccurrenceCancelled": "exceptions",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_durable_scheduler' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


# A runscheduler process records stop signals from here on (Django imports the app while it
# sets up), not only once its command runs: see management/startup.py.
import_module(f"{__name__}.management.startup").install_for_runscheduler()
