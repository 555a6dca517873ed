"""What is waiting to run, for assertions: ``enqueued()``, ``assert_enqueued()``,
``assert_not_enqueued()``.

Read through the test's own connection, so a ``TestCase`` sees what its code enqueued in
the transaction that never commits. The payload is compared in Python, alike on every
database (SQLite has no JSON containment lookup).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..db.dialect import alias_for
from ..exceptions import InvalidArgument
from ..models import PENDING_STATUSES, Occurrence, OccurrenceStatus
from ..rules.validation import normalize_identifier, normalize_int
from .clocks import aware

_UNSET: Any = object()
# The most occurrences a failing assertion lists (then: "and N more").
SHOWN = 20


def _statuses(status: Any) -> list[str]:
    """The statuses to look at: the waiting ones (queued, retry_wait) by default."""
    if status is None:
        return [str(s) for s in PENDING_STATUSES]
    values = [status] if isinstance(status, str) else status
    if not isinstance(values, Iterable) or not values:
        raise InvalidArgument("status", "must be a status or a list of statuses")
    values = list(values)
    unknown = [value for value in values if value not in OccurrenceStatus.values]
    if unknown:
        raise InvalidArgument("status", f"{unknown} not among {', '.join(OccurrenceStatus.values)}")
    return values


def contains(value: Any, part: Any) -> bool:
    """Whether ``value`` holds ``part``: for a dict, each of its keys with a value that holds
    the part's value (recursively); anything else, equal."""
    if isinstance(part, dict):
        return isinstance(value, dict) and all(
            key in value and contains(value[key], item) for key, item in part.items()
        )
    return bool(value == part)


def _filters(
    job: Any, kind: Any, scheduled_for: Any, unique_key: Any, batch: Any, trigger_key: Any
) -> dict[str, Any]:
    """The ORM filters of the arguments, each checked and named when wrong."""
    found: dict[str, Any] = {}
    if job is not None:
        found["job_id"] = normalize_identifier(getattr(job, "job_id", job), "job")
    if kind is not None:
        found["job__kind"] = normalize_identifier(kind, "kind", max_length=128)
    if scheduled_for is not None:
        found["scheduled_for"] = aware(scheduled_for, "scheduled_for")
    if unique_key is not None:
        if not isinstance(unique_key, str) or not unique_key:
            raise InvalidArgument("unique_key", "must be a non-empty string")
        found["unique_key"] = unique_key
    if batch is not None:
        found["batch_id"] = normalize_identifier(getattr(batch, "batch_id", batch), "batch")
    if trigger_key is not None:
        if not isinstance(trigger_key, str) or not trigger_key:
            raise InvalidArgument("trigger_key", "must be a non-empty string")
        found["trigger_key"] = trigger_key
    return found


def enqueued(
    *,
    job: Any = None,
    kind: str | None = None,
    payload: Any = _UNSET,
    payload_contains: dict[str, Any] | None = None,
    scheduled_for: datetime | None = None,
    unique_key: str | None = None,
    batch: Any = None,
    trigger_key: str | None = None,
    status: str | Iterable[str] | None = None,
    using: str | None = None,
) -> list[Occurrence]:
    """The occurrences waiting to run (``queued`` or ``retry_wait``; ``status=`` for
    others) that match every filter given, oldest ``scheduled_for`` first.

    ``job``: a job id or a Job; ``kind``: the job's kind; ``payload``: equal to it;
    ``payload_contains``: a dict whose keys and values the payload has (recursively);
    ``scheduled_for``: an aware datetime; ``unique_key``, ``trigger_key``; ``batch``: a
    batch id or a Batch.
    """
    if payload_contains is not None and not isinstance(payload_contains, dict):
        raise InvalidArgument("payload_contains", "must be a dict of what the payload holds")
    rows = Occurrence.objects.using(alias_for(using)).filter(
        status__in=_statuses(status), **_filters(job, kind, scheduled_for, unique_key, batch, trigger_key)
    )
    found = list(rows.select_related("job").order_by("scheduled_for", "created_at", "pk"))
    if payload is not _UNSET:
        found = [o for o in found if o.payload == payload]
    if payload_contains is not None:
        found = [o for o in found if contains(o.payload, payload_contains)]
    return found


def describe(occurrence: Occurrence) -> str:
    """One line about ``occurrence`` for a failing assertion's message."""
    parts = [
        f"{occurrence.job_id} ({occurrence.job.kind})",
        occurrence.status,
        f"scheduled_for={occurrence.scheduled_for.isoformat()}",
        f"payload={occurrence.payload!r}",
        f"trigger_key={occurrence.trigger_key!r}",
    ]
    if occurrence.unique_key:
        parts.append(f"unique_key={occurrence.unique_key!r}")
    if occurrence.batch_id:
        parts.append(f"batch={occurrence.batch_id}")
    return " ".join(parts)


def listing(using: str | None, status: Any) -> str:
    """What is enqueued (of ``status``), for the message of a failed assertion."""
    every = enqueued(status=status, using=using)
    if not every:
        return "nothing is enqueued"
    lines = [f"  {describe(o)}" for o in every[:SHOWN]]
    if len(every) > SHOWN:
        lines.append(f"  ... and {len(every) - SHOWN} more")
    return f"enqueued ({len(every)}):\n" + "\n".join(lines)


def _asked(filters: dict[str, Any]) -> str:
    given = ", ".join(f"{name}={value!r}" for name, value in filters.items() if value is not _UNSET)
    return given or "anything"


def assert_enqueued(
    *, count: int | None = None, using: str | None = None, **filters: Any
) -> list[Occurrence]:
    """Fail unless something matching ``filters`` (those of :func:`enqueued`) is waiting to
    run (exactly ``count`` of them, if given); returns the matches. The failure lists what
    is enqueued."""
    if count is not None:
        count = normalize_int(count, "count", minimum=0, maximum=1_000_000)
    found = enqueued(using=using, **filters)
    if (count is None and not found) or (count is not None and len(found) != count):
        wanted = "something" if count is None else f"{count}"
        raise AssertionError(
            f"expected {wanted} enqueued matching {_asked(filters)}, found {len(found)}; "
            + listing(using, filters.get("status"))
        )
    return found


def assert_not_enqueued(*, using: str | None = None, **filters: Any) -> None:
    """Fail if anything matching ``filters`` (those of :func:`enqueued`) is waiting to run;
    the failure lists what matched."""
    found = enqueued(using=using, **filters)
    if found:
        lines = "\n".join(f"  {describe(o)}" for o in found[:SHOWN])
        raise AssertionError(
            f"expected nothing enqueued matching {_asked(filters)}, found {len(found)}:\n{lines}"
        )
