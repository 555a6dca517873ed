"""``run_handler()``: call a registered handler with a real context, without a queue.

For a unit test of a handler: no job, occurrence or worker, no database write. The context
is the worker's :class:`~..worker.context.ExecutionContext`; only its ``record_metadata``,
``record_receipt`` and ``report_progress`` keep what they are given on the context (checked
as the kernel checks it; every progress report, unthrottled) instead of writing it to an
occurrence that does not exist.
"""

from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from .. import conf
from ..exceptions import InvalidArgument
from ..handlers import registry
from ..rules.authority import Envelope, default_authority, normalize_authority
from ..rules.causes import BatchSummary, Cause, Predecessor
from ..rules.identity import normalize_json
from ..rules.outcomes import MAX_RESULT_BYTES, storable_result
from ..rules.progress import Progress
from ..rules.validation import MAX_ATTEMPTS_LIMIT, normalize_int
from ..worker.context import ExecutionContext
from .clocks import aware


@dataclass
class HandlerContext(ExecutionContext):
    """The context :func:`run_handler` passes: what the handler recorded stays here."""

    metadata: Any = None  # the last value given to record_metadata
    receipt: Any = None  # the last value given to record_receipt
    progress: Progress | None = None  # the last report given to report_progress
    recorded: list[dict[str, Any]] = field(default_factory=list)  # every call, in order

    def _record(self, **values: Any) -> None:
        checked = {
            name: normalize_json(value, name, max_bytes=MAX_RESULT_BYTES) for name, value in values.items()
        }
        self.recorded.append(checked)
        for name, value in checked.items():
            setattr(self, name, value)

    def _report_progress(self, progress: Progress) -> None:
        self.progress = progress
        self.recorded.append(
            {"progress": {"done": progress.done, "total": progress.total, "note": progress.note}}
        )


@dataclass(frozen=True)
class HandlerCall:
    """What :func:`run_handler` returns: the handler's result and the context it saw."""

    result: Any
    context: HandlerContext


def _cause(predecessor: Any, batch: Any) -> Cause | None:
    """What ``ctx.predecessor`` / ``ctx.batch`` hold: the test's keys over neutral defaults
    (a test names the keys its handler reads, and the handler may read any of them)."""
    if predecessor is not None and batch is not None:
        raise InvalidArgument("batch", "an occurrence follows a predecessor or completes a batch, not both")
    for name, value in (("predecessor", predecessor), ("batch", batch)):
        if value is not None and not isinstance(value, dict):
            raise InvalidArgument(name, f"must be a dict (what ctx.{name} holds) or None")
    if predecessor is not None:
        return cast(
            Predecessor,
            {"occurrence_id": "", "job_id": "", "status": "succeeded", "result": None, **predecessor},
        )
    if batch is not None:
        return cast(
            BatchSummary,
            {"batch_id": "", "description": "", "size": 0, "counts": {}, "cancelled": False, **batch},
        )
    return None


def run_handler(
    kind: str,
    payload: Any = None,
    *,
    attempt: int = 1,
    max_attempts: int = 3,
    authority: Envelope | dict[str, Any] | None = None,
    job_id: str = "testing-job",
    scheduled_for: datetime | None = None,
    fence: int = 1,
    predecessor: dict[str, Any] | None = None,
    batch: dict[str, Any] | None = None,
    cancel_requested: bool = False,
) -> HandlerCall:
    """Call the handler registered for ``kind`` with ``payload``, as the worker would on
    attempt ``attempt`` of ``max_attempts`` (an async handler runs to its end on an event
    loop of its own). Returns a :class:`HandlerCall`; what the handler raises (``Retry``,
    ``PermanentFailure``, any error) propagates, and a result the worker could not store
    raises ``InvalidArgument("result")``.

    ``authority``: the envelope (default: the default principal's, requesting ``kind``);
    ``scheduled_for``: default the scheduler's clock now; ``predecessor`` / ``batch``:
    what ``ctx.predecessor`` / ``ctx.batch`` hold, for a follow-up or a batch's callback;
    ``cancel_requested``: the handler sees a cancel asked for.
    """
    handler = registry.get_handler(kind) if isinstance(kind, str) else None
    if handler is None:
        registered = ", ".join(registry.registered_kinds()) or "none"
        raise InvalidArgument("kind", f"no handler is registered for {kind!r} (registered: {registered})")
    max_attempts = normalize_int(max_attempts, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
    attempt = normalize_int(attempt, "attempt", minimum=1, maximum=max_attempts)
    fence = normalize_int(fence, "fence", minimum=1, maximum=2**62)
    if not isinstance(job_id, str) or not job_id:
        raise InvalidArgument("job_id", "must be a non-empty string")
    envelope = (
        default_authority(kind, conf.settings.DEFAULT_PRINCIPAL)
        if authority is None
        else normalize_authority(authority, "authority")
    )
    if not isinstance(cancel_requested, bool):
        raise InvalidArgument("cancel_requested", "must be True or False")
    ctx = HandlerContext(
        occurrence_id=f"testing-{uuid.uuid4().hex}",
        job_id=job_id,
        kind=kind,
        attempt=attempt,
        max_attempts=max_attempts,
        fence=fence,
        scheduled_for=conf.now() if scheduled_for is None else aware(scheduled_for, "scheduled_for"),
        payload=normalize_json(payload, "payload"),
        authority=envelope,
        owner="testing-run-handler",
        cause=_cause(predecessor, batch),
    )
    if cancel_requested:
        ctx.mark_cancel_requested()
    result = handler.func(ctx)
    if inspect.iscoroutine(result):
        result = ctx.run_coroutine(result)
    return HandlerCall(storable_result(result), ctx)
