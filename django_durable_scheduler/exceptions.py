"""The scheduler's exceptions: one class per stable ``SCHEDULER_*`` code.

Every error raised by the public API is a :class:`SchedulerError`. Its ``code`` is the
stable string code (portable across implementations), ``details`` a JSON-able dict
that names what went wrong (``field`` for bad input, ``expected``/``actual`` for
conflicts).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, ClassVar


class SchedulerError(Exception):
    """The scheduler refused the operation."""

    code: ClassVar[str] = "SCHEDULER_ERROR"

    def __init__(self, message: str | None = None, details: dict[str, Any] | None = None) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.details: dict[str, Any] = dict(details or {})
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidArgument(SchedulerError, ValueError):
    """An argument is invalid."""

    code = "SCHEDULER_INVALID_ARGUMENT"

    def __init__(self, field: str, message: str, details: dict[str, Any] | None = None) -> None:
        self.field = field
        merged = {"field": field, **(details or {})}
        super().__init__(f"{field}: {message}", merged)


class Conflict(SchedulerError):
    """The object already exists."""

    code = "SCHEDULER_CONFLICT"


class RevisionConflict(SchedulerError):
    """The job was changed since the revision the caller read."""

    code = "SCHEDULER_REVISION_CONFLICT"


class NotFound(SchedulerError, LookupError):
    """The job or occurrence does not exist."""

    code = "SCHEDULER_NOT_FOUND"


class JobDisabled(SchedulerError):
    """The job is disabled."""

    code = "SCHEDULER_JOB_DISABLED"


class IdempotencyPayloadMismatch(SchedulerError):
    """The idempotency identity was reused with a different payload."""

    code = "SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH"


class LeaseLost(SchedulerError):
    """The caller no longer holds the occurrence's lease (wrong owner, fence, or expired)."""

    code = "SCHEDULER_LEASE_LOST"


class InvalidState(SchedulerError):
    """The occurrence is not in a state that allows this operation."""

    code = "SCHEDULER_INVALID_STATE"


class DataCorrupt(SchedulerError):
    """Stored scheduler data does not match its identity or invariants."""

    code = "SCHEDULER_DATA_CORRUPT"


class AuthorityPolicyConflict(SchedulerError):
    """The authority policy revision does not match the expected revision."""

    code = "SCHEDULER_AUTHORITY_POLICY_CONFLICT"


class AuthorityPolicyRequired(SchedulerError):
    """The principal has no enabled authority policy."""

    code = "SCHEDULER_AUTHORITY_POLICY_REQUIRED"


class AuthorityPolicyUnbound(SchedulerError):
    """The authority envelope is not bound to a scheduler policy revision."""

    code = "SCHEDULER_AUTHORITY_POLICY_UNBOUND"


class AuthorityPolicyStale(SchedulerError):
    """The authority policy changed since the envelope was bound."""

    code = "SCHEDULER_AUTHORITY_POLICY_STALE"


class AuthorityPermissionDenied(SchedulerError, PermissionError):
    """A requested capability is not granted by the principal's policy."""

    code = "SCHEDULER_AUTHORITY_PERMISSION_DENIED"


class AuthorityBudgetStateInvalid(SchedulerError):
    """Authority usage does not match its reservations."""

    code = "SCHEDULER_AUTHORITY_BUDGET_STATE_INVALID"


class AuthorityBudgetExhausted(SchedulerError):
    """The principal's run or unit budget for the current window is spent."""

    code = "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED"


class AuthorityReservationMismatch(SchedulerError):
    """An existing reservation does not match the requested one."""

    code = "SCHEDULER_AUTHORITY_RESERVATION_MISMATCH"


class AuthorityOccurrenceNotRunning(SchedulerError):
    """Authority may only be reserved for a running occurrence."""

    code = "SCHEDULER_AUTHORITY_OCCURRENCE_NOT_RUNNING"


class AuthoritySettlementConflict(SchedulerError):
    """The authority reservation could not be settled."""

    code = "SCHEDULER_AUTHORITY_SETTLEMENT_CONFLICT"


ERRORS_BY_CODE: dict[str, type[SchedulerError]] = {
    cls.code: cls
    for cls in (
        SchedulerError,
        InvalidArgument,
        Conflict,
        RevisionConflict,
        NotFound,
        JobDisabled,
        IdempotencyPayloadMismatch,
        LeaseLost,
        InvalidState,
        DataCorrupt,
        AuthorityPolicyConflict,
        AuthorityPolicyRequired,
        AuthorityPolicyUnbound,
        AuthorityPolicyStale,
        AuthorityPermissionDenied,
        AuthorityBudgetStateInvalid,
        AuthorityBudgetExhausted,
        AuthorityReservationMismatch,
        AuthorityOccurrenceNotRunning,
        AuthoritySettlementConflict,
    )
}


class Retry(Exception):
    """Raised by a handler to ask for a retry at a chosen time.

    ``at`` is an aware datetime; ``delay`` seconds or a timedelta from now. With neither,
    the job's backoff decides.
    """

    def __init__(
        self,
        message: str = "retry requested",
        *,
        at: datetime | None = None,
        delay: float | timedelta | None = None,
    ) -> None:
        if at is not None and delay is not None:
            raise InvalidArgument("Retry", "give at or delay, not both")
        self.at = at
        self.delay = delay
        super().__init__(message)


class PermanentFailure(Exception):
    """Raised by a handler to dead-letter the occurrence without retrying."""

    def __init__(self, message: str = "permanent failure", *, code: str | None = None) -> None:
        self.code = code
        super().__init__(message)


class HandlerTimeout(Exception):
    """A handler ran past its timeout: the worker failed the run (retried under the job's
    policy) without waiting for it. Never raised inside the handler (Python cannot stop a
    thread); the worker records it, logs it and sends it with its signals."""

    def __init__(self, message: str, *, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(message)


class OccurrenceCancelled(SchedulerError):
    """A cancel was requested for the running occurrence: raised inside its handler by
    ``ctx.raise_if_cancelled()`` (and, in an async handler, at its next ``await``). Let it
    propagate: the worker then records the occurrence ``cancelled``, without a retry."""

    code = "SCHEDULER_CANCELLED"
