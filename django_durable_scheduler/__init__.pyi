"""What type checkers see of the package: the names ``__init__.py`` re-exports lazily,
each from the module it comes from (a test keeps the two in step)."""

__version__: str

from .exceptions import AuthorityBudgetExhausted as AuthorityBudgetExhausted
from .exceptions import AuthorityBudgetStateInvalid as AuthorityBudgetStateInvalid
from .exceptions import AuthorityOccurrenceNotRunning as AuthorityOccurrenceNotRunning
from .exceptions import AuthorityPermissionDenied as AuthorityPermissionDenied
from .exceptions import AuthorityPolicyConflict as AuthorityPolicyConflict
from .exceptions import AuthorityPolicyRequired as AuthorityPolicyRequired
from .exceptions import AuthorityPolicyStale as AuthorityPolicyStale
from .exceptions import AuthorityPolicyUnbound as AuthorityPolicyUnbound
from .exceptions import AuthorityReservationMismatch as AuthorityReservationMismatch
from .exceptions import AuthoritySettlementConflict as AuthoritySettlementConflict
from .exceptions import Conflict as Conflict
from .exceptions import DataCorrupt as DataCorrupt
from .exceptions import HandlerTimeout as HandlerTimeout
from .exceptions import IdempotencyPayloadMismatch as IdempotencyPayloadMismatch
from .exceptions import InvalidArgument as InvalidArgument
from .exceptions import InvalidState as InvalidState
from .exceptions import JobDisabled as JobDisabled
from .exceptions import LeaseLost as LeaseLost
from .exceptions import NotFound as NotFound
from .exceptions import OccurrenceCancelled as OccurrenceCancelled
from .exceptions import PermanentFailure as PermanentFailure
from .exceptions import Retry as Retry
from .exceptions import RevisionConflict as RevisionConflict
from .exceptions import SchedulerError as SchedulerError
from .handlers.declared import declare_job as declare_job
from .handlers.registry import handler as handler
from .kernel import Enqueued as Enqueued
from .kernel import OutcomeStatus as OutcomeStatus
from .kernel import batch_members as batch_members
from .kernel import batch_progress as batch_progress
from .kernel import cancel as cancel
from .kernel import cancel_batch as cancel_batch
from .kernel import claim as claim
from .kernel import claim_batch as claim_batch
from .kernel import close_batch as close_batch
from .kernel import create_job as create_job
from .kernel import dead_letter_expired as dead_letter_expired
from .kernel import defer as defer
from .kernel import deny as deny
from .kernel import enqueue as enqueue
from .kernel import enqueue_batch as enqueue_batch
from .kernel import enqueue_many as enqueue_many
from .kernel import enqueue_once_per_trigger as enqueue_once_per_trigger
from .kernel import get_batch as get_batch
from .kernel import get_job as get_job
from .kernel import get_occurrence as get_occurrence
from .kernel import history as history
from .kernel import materialize_due as materialize_due
from .kernel import open_batch as open_batch
from .kernel import pause as pause
from .kernel import paused_kinds as paused_kinds
from .kernel import record_execution as record_execution
from .kernel import record_progress as record_progress
from .kernel import release as release
from .kernel import renew as renew
from .kernel import resume as resume
from .kernel import retry_dead_letter as retry_dead_letter
from .kernel import run_now as run_now
from .kernel import settle as settle
from .kernel import settle_many as settle_many
from .kernel import update_job as update_job
from .kernel.authority.binding import preview_policy_change as preview_policy_change
from .kernel.authority.budgets import WindowCheck as WindowCheck
from .kernel.authority.budgets import WindowUsage as WindowUsage
from .kernel.authority.budgets import audit_budgets as audit_budgets
from .kernel.authority.budgets import current_usage as current_usage
from .kernel.authority.policies import PolicyChange as PolicyChange
from .kernel.authority.policies import bind_to_current_policy as bind_to_current_policy
from .kernel.authority.policies import change_policy as change_policy
from .kernel.authority.policies import ensure_policy as ensure_policy
from .kernel.authority.policies import get_policy as get_policy
from .kernel.authority.policies import policy_history as policy_history
from .kernel.authority.policies import set_policy as set_policy
from .kernel.authority.reservations import Verdict as Verdict
from .kernel.authority.reservations import authorize as authorize
from .kernel.authority.reservations import authorize_many as authorize_many
from .kernel.authority.reservations import get_reservation as get_reservation
from .kernel.authority.reservations import reserve_authority as reserve_authority
from .rules.authority import AuthorizationRefs as AuthorizationRefs
from .rules.authority import Envelope as Envelope
from .rules.authority import EnvelopePrincipal as EnvelopePrincipal
from .rules.causes import BatchSummary as BatchSummary
from .rules.causes import Predecessor as Predecessor
from .rules.identity import canonical_json as canonical_json
from .rules.identity import derive_occurrence_identity as derive_occurrence_identity
from .rules.triggers.fire_times import next_fire_times as next_fire_times
from .worker import Worker as Worker
from .worker.context import ExecutionContext as ExecutionContext

__all__ = [
    "AuthorityBudgetExhausted",
    "AuthorityBudgetStateInvalid",
    "AuthorityOccurrenceNotRunning",
    "AuthorityPermissionDenied",
    "AuthorityPolicyConflict",
    "AuthorityPolicyRequired",
    "AuthorityPolicyStale",
    "AuthorityPolicyUnbound",
    "AuthorityReservationMismatch",
    "AuthoritySettlementConflict",
    "AuthorizationRefs",
    "BatchSummary",
    "Conflict",
    "DataCorrupt",
    "Enqueued",
    "Envelope",
    "EnvelopePrincipal",
    "ExecutionContext",
    "HandlerTimeout",
    "IdempotencyPayloadMismatch",
    "InvalidArgument",
    "InvalidState",
    "JobDisabled",
    "LeaseLost",
    "NotFound",
    "OccurrenceCancelled",
    "OutcomeStatus",
    "PermanentFailure",
    "PolicyChange",
    "Predecessor",
    "Retry",
    "RevisionConflict",
    "SchedulerError",
    "Verdict",
    "WindowCheck",
    "WindowUsage",
    "Worker",
    "audit_budgets",
    "authorize",
    "authorize_many",
    "batch_members",
    "batch_progress",
    "bind_to_current_policy",
    "cancel",
    "cancel_batch",
    "canonical_json",
    "change_policy",
    "claim",
    "claim_batch",
    "close_batch",
    "create_job",
    "current_usage",
    "dead_letter_expired",
    "declare_job",
    "defer",
    "deny",
    "derive_occurrence_identity",
    "enqueue",
    "enqueue_batch",
    "enqueue_many",
    "enqueue_once_per_trigger",
    "ensure_policy",
    "get_batch",
    "get_job",
    "get_occurrence",
    "get_policy",
    "get_reservation",
    "handler",
    "history",
    "materialize_due",
    "next_fire_times",
    "open_batch",
    "pause",
    "paused_kinds",
    "policy_history",
    "preview_policy_change",
    "record_execution",
    "record_progress",
    "release",
    "renew",
    "reserve_authority",
    "resume",
    "retry_dead_letter",
    "run_now",
    "set_policy",
    "settle",
    "settle_many",
    "update_job",
]
