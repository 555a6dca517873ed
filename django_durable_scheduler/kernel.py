"""The transactional kernel: the only code that writes occurrence state.

Every operation is one short transaction that also appends the event recording it.
They may run inside a caller's ``transaction.atomic()``: then they join it, and their
effects exist exactly when the caller commits.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import Case, F, PositiveSmallIntegerField, Q, When
from django.db.models.base import ModelState
from django.db.models.functions import Greatest

from . import conf, dialect
from .authority import normalize_authority, principal_key, settle_reservations
from .exceptions import (
    Conflict,
    DataCorrupt,
    IdempotencyPayloadMismatch,
    InvalidArgument,
    InvalidState,
    JobDisabled,
    LeaseLost,
    NotFound,
    RevisionConflict,
)
from .identity import (
    IDEMPOTENCY_KEY_PREFIX,
    OCCURRENCE_ID_PREFIX,
    canonical_json,
    derive_occurrence_identity,
    from_ms,
    identity_digester,
    iso_ms,
    normalize_bool,
    normalize_identifier,
    normalize_int,
    normalize_json,
    to_duration_ms,
    to_ms,
)
from .models import (
    ACTIVE_STATUSES,
    PENDING_STATUSES,
    Event,
    Job,
    Occurrence,
    OccurrenceStatus,
)
from .schedules import initial_fire_time, plan_slots
from .triggers import slot_trigger_key

MAX_LEASE_MS = 24 * 60 * 60 * 1000
MAX_RESULT_BYTES = 64 * 1024
MAX_ERROR_MESSAGE = 4096
MAX_CANCEL_REASON = 1024
MAX_ATTEMPTS_LIMIT = 32
SUPERSEDED = "superseded"
_UNSET: Any = object()

# Event types: the seed's nine and ours.
JOB_CREATED = "job_created"
JOB_UPDATED = "job_updated"
OCCURRENCE_ENQUEUED = "occurrence_enqueued"
OCCURRENCE_CLAIMED = "occurrence_claimed"
OCCURRENCE_RECLAIMED = "occurrence_reclaimed"
OCCURRENCE_RENEWED = "occurrence_renewed"
OCCURRENCE_SUCCEEDED = "occurrence_succeeded"
OCCURRENCE_RETRY_SCHEDULED = "occurrence_retry_scheduled"
OCCURRENCE_DEAD_LETTERED = "occurrence_dead_lettered"
OCCURRENCE_CANCELLED = "occurrence_cancelled"
OCCURRENCE_RELEASED = "occurrence_released"
SLOT_SKIPPED = "slot_skipped"
AUTHORITY_DENIED = "authority_denied"
AUTHORITY_DEFERRED = "authority_deferred"
# At most this many slot_skipped events per job and pass; the rest are counted in one more.
MAX_SKIP_EVENTS = 1000


# --------------------------------------------------------------------------- helpers


@contextmanager
def _write(using: str | None = None) -> Iterator[str]:
    """One kernel transaction; inside a caller's transaction, a savepoint, so that an error
    undoes only this operation and leaves the caller's transaction usable."""
    alias = using or DEFAULT_DB_ALIAS
    with transaction.atomic(using=alias):
        dialect.take_write_lock(connections[alias])
        yield alias


def _event(
    job_id: str,
    event_type: str,
    at: datetime,
    *,
    occurrence_id: str | None = None,
    owner_id: str | None = None,
    fence: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    # Cloned from a blank Event: the hot path builds two events per occurrence.
    event: Event = _clone(
        _blank(Event),
        job_id=job_id,
        occurrence_id=occurrence_id,
        event_type=event_type,
        occurred_at=at,
        owner_id=owner_id,
        fence=fence,
        data=data or {},
    )
    return event


_BLANKS: dict[type, Any] = {}


def _blank(model: type) -> Any:
    """An unsaved instance of ``model`` with its field defaults, to clone (see _clone)."""
    blank = _BLANKS.get(model)
    if blank is None:
        blank = _BLANKS[model] = model()
    return blank


def _lease_ms(lease: Any) -> int:
    return to_duration_ms(lease, "lease", minimum_ms=1, maximum_ms=MAX_LEASE_MS)


def _owner(owner: Any) -> str:
    return normalize_identifier(owner, "owner")


def _kinds(kinds: Any) -> list[str] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise InvalidArgument("kinds", "must be a list of kinds or None")
    return sorted({normalize_identifier(k, f"kinds[{i}]", max_length=128) for i, k in enumerate(kinds)})


def _job_fields(changes: dict[str, Any], *, creating: bool) -> dict[str, Any]:
    """Validate job attributes; returns model field values."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if key == "kind":
            out["kind"] = normalize_identifier(value, "kind", max_length=128)
        elif key == "trigger":
            from .triggers import validate_trigger

            out["trigger"] = validate_trigger({} if value is None else value, "trigger")
        elif key == "payload":
            out["payload"] = normalize_json(value, "payload")
        elif key == "authority":
            out["authority"] = normalize_authority(value, "authority")
        elif key == "enabled":
            out["enabled"] = normalize_bool(value, "enabled")
        elif key == "max_attempts":
            out["max_attempts"] = normalize_int(value, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
        elif key == "retry_base_delay":
            out["retry_base_delay_ms"] = to_duration_ms(value, "retry_base_delay", maximum_ms=MAX_LEASE_MS)
        elif key == "retry_max_delay":
            out["retry_max_delay_ms"] = to_duration_ms(value, "retry_max_delay", maximum_ms=31 * MAX_LEASE_MS)
        else:
            raise InvalidArgument(
                key, "is not a job attribute that can be " + ("set" if creating else "changed")
            )
    return out


def _bind_current(authority: dict[str, Any], alias: str) -> dict[str, Any]:
    """An envelope that names no policy revision is bound to its principal's current policy
    when that policy covers it (else it stays unbound and the worker denies it)."""
    if (authority.get("authorizationRefs") or {}).get("schedulerPolicyRevision") is not None:
        return authority
    from .policies import bind_to_current_policy

    return bind_to_current_policy(authority, using=alias)


def _check_retry_delays(base_ms: int, max_ms: int) -> None:
    if max_ms < base_ms:
        raise InvalidArgument("retry_max_delay", "must not be shorter than retry_base_delay")


def get_job(job_id: str, *, using: str | None = None) -> Job:
    job_id = normalize_identifier(job_id, "job_id")
    try:
        return Job.objects.using(using or DEFAULT_DB_ALIAS).get(pk=job_id)
    except Job.DoesNotExist:
        raise NotFound(f"job {job_id!r} does not exist", {"job_id": job_id}) from None


def get_occurrence(occurrence_id: str, *, using: str | None = None) -> Occurrence:
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    try:
        return Occurrence.objects.using(using or DEFAULT_DB_ALIAS).get(pk=occurrence_id)
    except Occurrence.DoesNotExist:
        raise NotFound(
            f"occurrence {occurrence_id!r} does not exist", {"occurrence_id": occurrence_id}
        ) from None


# --------------------------------------------------------------------------- jobs


def create_job(
    job_id: str,
    kind: str,
    *,
    authority: dict[str, Any],
    trigger: dict[str, Any] | None = None,
    payload: Any = None,
    enabled: bool = True,
    max_attempts: int = 3,
    retry_base_delay: float | timedelta | None = None,
    retry_max_delay: float | timedelta | None = None,
    using: str | None = None,
) -> Job:
    """Create a job at revision 1. ``SCHEDULER_CONFLICT`` if the id is taken."""
    job_id = normalize_identifier(job_id, "job_id")
    fields = _job_fields(
        {
            "kind": kind,
            "trigger": trigger,
            "payload": payload,
            "authority": authority,
            "enabled": enabled,
            "max_attempts": max_attempts,
            "retry_base_delay": conf.settings.RETRY_BASE_DELAY
            if retry_base_delay is None
            else retry_base_delay,
            "retry_max_delay": conf.settings.RETRY_MAX_DELAY if retry_max_delay is None else retry_max_delay,
        },
        creating=True,
    )
    _check_retry_delays(fields["retry_base_delay_ms"], fields["retry_max_delay_ms"])
    now = conf.now()
    with _write(using) as alias:
        if Job.objects.using(alias).filter(pk=job_id).exists():
            raise Conflict(f"job {job_id!r} already exists", {"job_id": job_id})
        job = Job(job_id=job_id, revision=1, created_at=now, updated_at=now, **fields)
        job.authority = _bind_current(job.authority, alias)
        job.next_fire_at = initial_fire_time(job.trigger, now=now, anchor=now)
        try:
            with transaction.atomic(using=alias):
                job.save(using=alias, force_insert=True)
        except IntegrityError:
            if Job.objects.using(alias).filter(pk=job_id).exists():
                raise Conflict(f"job {job_id!r} already exists", {"job_id": job_id}) from None
            raise
        _event(job_id, JOB_CREATED, now, data={"revision": 1, "kind": job.kind}).save(using=alias)
    return job


def update_job(job_id: str, *, expected_revision: int, using: str | None = None, **changes: Any) -> Job:
    """Compare-and-set update: applies ``changes`` only if the job is at ``expected_revision``.

    A trigger change cancels (``superseded``) the queued/retry_wait occurrences that the
    old trigger materialized; explicitly enqueued ones keep their snapshot.
    """
    job_id = normalize_identifier(job_id, "job_id")
    expected = normalize_int(expected_revision, "expected_revision", minimum=1)
    if not changes:
        raise InvalidArgument("changes", "give at least one attribute to change")
    fields = _job_fields(changes, creating=False)
    now = conf.now()
    with _write(using) as alias:
        try:
            job = Job.objects.using(alias).select_for_update().get(pk=job_id)
        except Job.DoesNotExist:
            raise NotFound(f"job {job_id!r} does not exist", {"job_id": job_id}) from None
        if job.revision != expected:
            raise RevisionConflict(
                f"job {job_id!r} is at revision {job.revision}, not {expected}",
                {"job_id": job_id, "expected_revision": expected, "actual_revision": job.revision},
            )
        _check_retry_delays(
            fields.get("retry_base_delay_ms", job.retry_base_delay_ms),
            fields.get("retry_max_delay_ms", job.retry_max_delay_ms),
        )
        changed = sorted(
            name
            for name, value in fields.items()
            if canonical_json(getattr(job, name)) != canonical_json(value)
        )
        if "authority" in fields:
            fields["authority"] = _bind_current(fields["authority"], alias)
            changed = sorted(
                name
                for name, value in fields.items()
                if canonical_json(getattr(job, name)) != canonical_json(value)
            )
        if not changed:
            return job  # nothing differs: no new revision, no event
        for name, value in fields.items():
            setattr(job, name, value)
        job.revision += 1
        job.updated_at = now
        job.save(using=alias)
        superseded: list[str] = []
        if "trigger" in changed:
            superseded = _supersede_schedule(job, now, alias)
            # From now on, and never at or before a slot already materialized.
            after = now if job.last_slot_at is None else max(now, job.last_slot_at)
            job.next_fire_at = initial_fire_time(job.trigger, now=after, anchor=job.created_at)
            job.save(using=alias, update_fields=["next_fire_at"])
        _event(
            job_id,
            JOB_UPDATED,
            now,
            data={
                "revision": job.revision,
                "previousRevision": expected,
                "changed": changed,
                "superseded": len(superseded),
            },
        ).save(using=alias)
    return job


def _settle_cancelled(ids: list[str], reason: str | None, now: datetime, alias: str) -> None:
    """A cancelled retry_wait occurrence may hold the reservation of its earlier attempt:
    it is terminal now, so the reservation settles (failed)."""
    settle_reservations(
        ids, OccurrenceStatus.CANCELLED, {"status": "cancelled", "reason": reason}, now, alias
    )


def _supersede_schedule(job: Job, now: datetime, alias: str) -> list[str]:
    pending = list(
        Occurrence.objects.using(alias)
        .select_for_update()
        .filter(job=job, status__in=PENDING_STATUSES, trigger_key__startswith="schedule:")
        .values_list("pk", "status")
    )
    ids = [pk for pk, _ in pending]
    if ids:
        Occurrence.objects.using(alias).filter(pk__in=ids).update(
            status=OccurrenceStatus.CANCELLED,
            settled_at=now,
            updated_at=now,
            last_error={"code": "SCHEDULER_CANCELLED", "message": SUPERSEDED},
        )
        _settle_cancelled(ids, SUPERSEDED, now, alias)
        Event.objects.using(alias).bulk_create(
            [
                _event(
                    job.job_id,
                    OCCURRENCE_CANCELLED,
                    now,
                    occurrence_id=pk,
                    data={"reason": SUPERSEDED, "previousStatus": status},
                )
                for pk, status in pending
            ]
        )
    return ids


# --------------------------------------------------------------------------- enqueue


def _enqueue_args(
    job_id: Any, scheduled_for: Any, trigger_key: Any, available_at: Any
) -> tuple[str, int, str, int]:
    return (normalize_identifier(job_id, "job_id"), *_slot_args(scheduled_for, trigger_key, available_at))


def _slot_args(scheduled_for: Any, trigger_key: Any, available_at: Any) -> tuple[int, str, int]:
    scheduled_ms = to_ms(scheduled_for, "scheduled_for")
    key = normalize_identifier(trigger_key, "trigger_key")
    available_ms = scheduled_ms if available_at is None else to_ms(available_at, "available_at")
    return scheduled_ms, key, available_ms


def _new_occurrence(
    job: Job, *, scheduled_ms: int, trigger_key: str, available_ms: int, payload: Any, now: datetime
) -> Occurrence:
    """A queued occurrence of ``job``'s current revision (not saved), with the seed's identity."""
    identity = derive_occurrence_identity(job.job_id, job.revision, scheduled_ms, trigger_key)
    scheduled = from_ms(scheduled_ms)
    # Cloned from a blank Occurrence (every field set here or immutable by default): the
    # one-by-one enqueue path is a few hundred microseconds, and Model() was a tenth of it.
    occurrence: Occurrence = _clone(
        _blank(Occurrence),
        occurrence_id=identity.occurrence_id,
        job_id=job.job_id,
        job_revision=job.revision,
        idempotency_key=identity.idempotency_key,
        trigger_key=trigger_key,
        scheduled_for=scheduled,
        available_at=scheduled if available_ms == scheduled_ms else from_ms(available_ms),
        status=OccurrenceStatus.QUEUED,
        attempt=0,
        max_attempts=job.max_attempts,
        fence=0,
        authority=job.authority,
        payload=payload,
        principal_key=principal_key(job.authority),
        created_at=now,
        updated_at=now,
    )
    occurrence._state.fields_cache["job"] = job
    return occurrence


def _enqueued_data(job_revision: int, scheduled_ms: int, trigger_key: str) -> dict[str, Any]:
    return {"jobRevision": job_revision, "scheduledFor": scheduled_ms, "triggerKey": trigger_key}


def _enqueued_event(occurrence: Occurrence, now: datetime) -> Event:
    return _event(
        occurrence.job_id,
        OCCURRENCE_ENQUEUED,
        now,
        occurrence_id=occurrence.occurrence_id,
        data=_enqueued_data(
            occurrence.job_revision, to_ms(occurrence.scheduled_for, "scheduled_for"), occurrence.trigger_key
        ),
    )


def _insert_occurrence(
    job: Job,
    *,
    scheduled_ms: int,
    trigger_key: str,
    available_ms: int,
    payload: Any,
    now: datetime,
    alias: str,
    known: _KnownJob | None = None,
) -> tuple[Occurrence, bool]:
    """Insert a queued occurrence of ``job`` with its event, or find the one with its
    identity. ``known``: ``job`` is a remembered row, not one read in this transaction;
    insert only if the stored row still has every value the occurrence copies from it
    (else :class:`dialect.GuardFailed`, nothing written)."""
    if not job.enabled:
        raise JobDisabled(f"job {job.job_id!r} is disabled", {"job_id": job.job_id})
    default_payload = payload is _UNSET
    payload_value = job.payload if default_payload else normalize_json(payload, "payload")
    new = _new_occurrence if known is None else known.new_occurrence
    occurrence = new(
        job,
        scheduled_ms=scheduled_ms,
        trigger_key=trigger_key,
        available_ms=available_ms,
        payload=payload_value,
        now=now,
    )
    if dialect.has_enqueue_function(alias):
        created: bool | None = dialect.insert_enqueued(
            alias,
            occurrence,
            event_data=_enqueued_data(occurrence.job_revision, scheduled_ms, trigger_key),
            guard=0 if known is None else 2 if default_payload else 1,
            notify=True,
            authority_text=None if known is None else known.authority_text(alias),
        )
    else:
        event = _enqueued_event(occurrence, now)
        guard = template = None
        if known is not None:
            guard = known.guard(alias, default_payload=default_payload)
            template = known.template(alias)
        created = dialect.insert_unless_present(
            alias, occurrence, then=[event], notify=True, guard=guard, template=template
        )
        if created is None:
            try:
                # A savepoint so that losing an insert race does not abort the caller's transaction.
                with transaction.atomic(using=alias):
                    occurrence.save(using=alias, force_insert=True)
                created = True
            except IntegrityError:
                created = False
            if created:
                dialect.notify_new_work(alias)
                dialect.insert_rows(alias, [event])
    if known is not None:
        # Not the remembered job object: it may be stale in columns the guard does not cover.
        occurrence._state.fields_cache.pop("job", None)
    if not created:
        existing = Occurrence.objects.using(alias).filter(idempotency_key=occurrence.idempotency_key).first()
        if existing is None:
            raise IntegrityError(f"occurrence {occurrence.occurrence_id!r} was neither inserted nor found")
        if existing.occurrence_id != occurrence.occurrence_id:
            raise DataCorrupt("occurrence idempotency identity does not match stored data")
        if canonical_json(existing.payload) != canonical_json(payload_value, "payload"):
            raise _payload_mismatch(job, trigger_key)
        return existing, True
    return occurrence, False


# The job fields an enqueued occurrence copies (its identity comes from the revision): the
# enqueue fast path inserts from a remembered job only while the stored row still has these
# values, so it writes exactly what reading the job first would have written. The enqueue
# function of migration 0015 (PostgreSQL) checks the same columns.
_JOB_GUARD = ("revision", "enabled", "max_attempts", "authority")
# The columns in which a remembered job's occurrences differ from its first one.
_PER_OCCURRENCE = (
    "occurrence_id",
    "idempotency_key",
    "trigger_key",
    "scheduled_for",
    "available_at",
    "payload",
    "created_at",
    "updated_at",
)


class _KnownJob:
    """A job row this process read, and the guards (built once) that check it is unchanged."""

    __slots__ = ("authority", "digest_of", "guards", "job", "proto", "row_template")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.guards: dict[bool, tuple[str, list[Any]]] = {}
        self.authority: str | None = None
        self.digest_of: Callable[[int, str], str] | None = None
        self.proto: Occurrence | None = None
        self.row_template: dialect.RowTemplate | None = None

    def new_occurrence(
        self, job: Job, *, scheduled_ms: int, trigger_key: str, available_ms: int, payload: Any, now: datetime
    ) -> Occurrence:
        """What :func:`_new_occurrence` builds, cloned from the job's first one (its identity
        function, principal key and the columns it copies from the job are computed once)."""
        if self.proto is None or self.digest_of is None:  # set together, on the first call
            self.digest_of = identity_digester(job.job_id, job.revision)
            self.proto = _new_occurrence(
                job,
                scheduled_ms=scheduled_ms,
                trigger_key=trigger_key,
                available_ms=available_ms,
                payload=payload,
                now=now,
            )
            self.proto._state.fields_cache.pop("job", None)
            first: Occurrence = _clone(self.proto)
            return first
        scheduled = from_ms(scheduled_ms)
        available = scheduled if available_ms == scheduled_ms else from_ms(available_ms)
        return _sibling(
            self.proto,
            self.digest_of(scheduled_ms, trigger_key),
            trigger_key,
            scheduled,
            available,
            payload,
            now,
        )

    def authority_text(self, alias: str) -> str:
        """The job's authority as :func:`dialect.enqueue_json` binds it, encoded once (every
        occurrence copies it; a remembered job belongs to one database)."""
        if self.authority is None:
            self.authority = dialect.enqueue_json(alias, self.job.authority)
        return self.authority

    def template(self, alias: str) -> dialect.RowTemplate | None:
        """The prepared values of the job's first occurrence, to build the next ones' rows
        from (None before :meth:`new_occurrence` has built it)."""
        if self.row_template is None and self.proto is not None:
            self.row_template = dialect.RowTemplate(alias, self.proto, _PER_OCCURRENCE)
        return self.row_template

    def guard(self, alias: str, *, default_payload: bool) -> tuple[str, list[Any]]:
        guard = self.guards.get(default_payload)
        if guard is None:
            names = (*_JOB_GUARD, "payload") if default_payload else _JOB_GUARD
            guard = self.guards[default_payload] = dialect.guard_for(alias, self.job, names)
        return guard


_KNOWN_JOBS: dict[tuple[str, str], _KnownJob] = {}
_KNOWN_JOBS_MAX = 1024


def _remember_job(alias: str, job: Job) -> None:
    if dialect.supports_guarded_insert(alias):
        if len(_KNOWN_JOBS) >= _KNOWN_JOBS_MAX:
            _KNOWN_JOBS.clear()
        _KNOWN_JOBS[(alias, job.job_id)] = _KnownJob(job)


def enqueue(
    job_id: str,
    *,
    scheduled_for: datetime | int,
    trigger_key: str,
    available_at: datetime | int | None = None,
    payload: Any = _UNSET,
    using: str | None = None,
) -> tuple[Occurrence, bool]:
    """Insert an occurrence, or return the existing one with the same identity.

    Returns ``(occurrence, deduplicated)``. The identity is derived from the job's
    current revision, ``scheduled_for`` and ``trigger_key``; reusing it with another
    payload raises ``SCHEDULER_IDEMPOTENCY_PAYLOAD_MISMATCH``.

    On PostgreSQL and SQLite, enqueueing a job this process has enqueued before is one
    statement (no job read, no transaction of its own: the insert and its event commit
    together, and the wake-up with them), guarded so that it inserts only if the job row is
    still as remembered. It calls the stored function of migration 0015 (PostgreSQL, whose
    plans it keeps per session) or inserts into the view of migration 0016 (SQLite).
    """
    job_id, scheduled_ms, key, available_ms = _enqueue_args(job_id, scheduled_for, trigger_key, available_at)
    now = conf.now()
    alias = using or DEFAULT_DB_ALIAS
    args: dict[str, Any] = {
        "scheduled_ms": scheduled_ms,
        "trigger_key": key,
        "available_ms": available_ms,
        "payload": payload,
    }
    known = _KNOWN_JOBS.get((alias, job_id))
    if known is not None and known.job.enabled:
        try:
            # One statement, atomic by itself (PostgreSQL; SQLite with migration 0016). Else
            # SQLite's two, in a transaction of their own (see dialect.insert_unless_present)
            # or in a savepoint in the caller's.
            connection = connections[alias]
            alone = (
                connection.vendor != "sqlite"
                or dialect.in_autocommit(connection)
                or dialect.has_enqueue_function(alias)
            )
            with nullcontext() if alone else _write(alias):
                return _insert_occurrence(known.job, now=now, alias=alias, known=known, **args)
        except dialect.GuardFailed:
            _KNOWN_JOBS.pop((alias, job_id), None)
    with _write(alias):
        job = get_job(job_id, using=alias)
        _remember_job(alias, job)
        return _insert_occurrence(job, now=now, alias=alias, **args)


def enqueue_many(
    job_id: str,
    items: Iterable[dict[str, Any]],
    *,
    using: str | None = None,
) -> list[tuple[Occurrence, bool]]:
    """Enqueue many occurrences of one job in one transaction (bulk insert).

    Each item is a dict with ``scheduled_for``, ``trigger_key`` and optionally
    ``available_at`` and ``payload``; the result is ``(occurrence, deduplicated)`` per item,
    in order, with the same dedupe and payload-mismatch rules as :func:`enqueue`.
    """
    job_id = normalize_identifier(job_id, "job_id")
    if isinstance(items, dict | str) or not isinstance(items, Iterable):
        raise InvalidArgument("items", "must be a list of dicts")
    parsed: list[tuple[int, str, int, Any]] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidArgument(f"items[{index}]", "must be a dict")
        unknown = set(item) - {"scheduled_for", "trigger_key", "available_at", "payload"}
        if unknown:
            raise InvalidArgument(f"items[{index}].{sorted(unknown)[0]}", "is not an enqueue argument")
        scheduled_ms, key, available_ms = _slot_args(
            item.get("scheduled_for"), item.get("trigger_key"), item.get("available_at")
        )
        payload = normalize_json(item["payload"], f"items[{index}].payload") if "payload" in item else _UNSET
        parsed.append((scheduled_ms, key, available_ms, payload))
    now = conf.now()
    with _write(using) as alias:
        job = get_job(job_id, using=alias)
        if not job.enabled:
            raise JobDisabled(f"job {job_id!r} is disabled", {"job_id": job_id})
        rows = _new_occurrences(job, parsed, now)
        if dialect.supports_insert_many(alias):
            results = _insert_many_new(job, rows, now, alias)
        else:
            results = _insert_many_portable(job, rows, now, alias)
    return results


def _clone(proto: Any, **values: Any) -> Any:
    """A new unsaved model instance with ``proto``'s field values but ``values``: for rows
    built by the thousand (a fraction of the cost of ``Model(**fields)``)."""
    cls: Any = type(proto)
    obj = cls.__new__(cls)
    fields = obj.__dict__
    fields.update(proto.__dict__)
    fields.update(values)
    fields["_state"] = ModelState()
    return obj


def _sibling(
    first: Occurrence,
    digest: str,
    trigger_key: str,
    scheduled: datetime,
    available: datetime,
    payload: Any,
    now: datetime,
) -> Occurrence:
    """An occurrence of ``first``'s job revision for another slot: a clone of ``first`` with
    its own identity (``digest``), slot, payload and times, the _PER_OCCURRENCE columns."""
    occurrence: Occurrence = _clone(
        first,
        occurrence_id=OCCURRENCE_ID_PREFIX + digest,
        idempotency_key=IDEMPOTENCY_KEY_PREFIX + digest,
        trigger_key=trigger_key,
        scheduled_for=scheduled,
        available_at=available,
        payload=payload,
        created_at=now,
        updated_at=now,
    )
    return occurrence


def _new_occurrences(job: Job, parsed: list[tuple[int, str, int, Any]], now: datetime) -> list[Occurrence]:
    """Queued occurrences of ``job`` for ``(scheduled_ms, trigger_key, available_ms,
    payload)`` items (checked; not saved): what :func:`_new_occurrence` builds, one clone
    of the first each (a bulk enqueue builds thousands)."""
    rows: list[Occurrence] = []
    digest_of = identity_digester(job.job_id, job.revision)
    times: dict[int, datetime] = {}  # items often share their times
    first: Occurrence | None = None
    for scheduled_ms, key, available_ms, payload in parsed:
        value = job.payload if payload is _UNSET else payload
        if first is None:
            first = _new_occurrence(
                job,
                scheduled_ms=scheduled_ms,
                trigger_key=key,
                available_ms=available_ms,
                payload=value,
                now=now,
            )
            rows.append(first)
            continue
        digest = digest_of(scheduled_ms, key)
        scheduled = times.get(scheduled_ms) or times.setdefault(scheduled_ms, from_ms(scheduled_ms))
        available = scheduled
        if available_ms != scheduled_ms:
            available = times.get(available_ms) or times.setdefault(available_ms, from_ms(available_ms))
        row = _sibling(first, digest, key, scheduled, available, value, now)
        row._state.fields_cache["job"] = job
        rows.append(row)
    return rows


def _payload_mismatch(job: Job, trigger_key: str) -> IdempotencyPayloadMismatch:
    return IdempotencyPayloadMismatch(
        "occurrence identity was reused with a different payload",
        {"field": "payload", "job_id": job.job_id, "trigger_key": trigger_key},
    )


def _present(alias: str, ids: list[str]) -> dict[str, Occurrence]:
    """The stored occurrences among ``ids``, read 500 keys per query."""
    present: dict[str, Occurrence] = {}
    for start in range(0, len(ids), 500):
        present.update(Occurrence.objects.using(alias).in_bulk(ids[start : start + 500]))
    return present


def _split_fresh(job: Job, rows: list[Occurrence]) -> tuple[dict[str, Occurrence], list[Occurrence]]:
    """The first row of each identity, and per row the row standing for it; a repeated
    identity with another payload is refused."""
    fresh: dict[str, Occurrence] = {}
    firsts: list[Occurrence] = []
    for row in rows:
        prior = fresh.get(row.occurrence_id)
        if prior is None:
            fresh[row.occurrence_id] = prior = row
        elif canonical_json(prior.payload) != canonical_json(row.payload):
            raise _payload_mismatch(job, row.trigger_key)
        firsts.append(prior)
    return fresh, firsts


def _judge_present(
    job: Job, rows: list[Occurrence], firsts: list[Occurrence], present: dict[str, Occurrence]
) -> list[tuple[Occurrence, bool]]:
    results: list[tuple[Occurrence, bool]] = []
    seen: set[str] = set()
    for row, first in zip(rows, firsts, strict=True):
        prior = present.get(row.occurrence_id)
        if prior is not None and canonical_json(prior.payload) != canonical_json(row.payload):
            raise _payload_mismatch(job, row.trigger_key)
        if prior is not None:
            results.append((prior, True))
        else:
            results.append((first, first.occurrence_id in seen))
            seen.add(first.occurrence_id)
    return results


def _enqueued_events(rows: Iterable[Occurrence], now: datetime) -> list[Event]:
    """The ``occurrence_enqueued`` event of each of ``rows`` (not saved): what
    :func:`_enqueued_event` builds, one clone of the first each."""
    events: list[Event] = []
    first: Event | None = None
    times: dict[datetime, int] = {}
    for row in rows:
        if first is None:
            first = _enqueued_event(row, now)
            events.append(first)
            continue
        scheduled = row.scheduled_for
        scheduled_ms = times.get(scheduled)
        if scheduled_ms is None:
            scheduled_ms = times[scheduled] = to_ms(scheduled, "scheduled_for")
        data = _enqueued_data(row.job_revision, scheduled_ms, row.trigger_key)
        events.append(_clone(first, occurrence_id=row.occurrence_id, data=data))
    return events


def _in_key_order(rows: dict[str, Occurrence]) -> list[Occurrence]:
    """``rows`` (by occurrence id) in key order: a bulk enqueue inserts new occurrences, and
    writes their events, in this order. Both unique indexes (the ids and the idempotency
    keys share their digest) then take the new entries each next to the last instead of at
    random places (SQLite bulk enqueue +15%; PostgreSQL's insert statement 12% faster;
    InnoDB clusters the table on the key); and the order of one bulk's events does not
    depend on how the caller happened to list the items."""
    return [rows[key] for key in sorted(rows)]


def _insert_many_new(
    job: Job, rows: list[Occurrence], now: datetime, alias: str
) -> list[tuple[Occurrence, bool]]:
    """Bulk enqueue where the database says which rows it inserted (PostgreSQL, SQLite):
    insert all, skipping identities present; only those are read back (to compare
    payloads), and only the inserted rows get events."""
    if not rows:
        return []
    fresh, firsts = _split_fresh(job, rows)
    ordered = _in_key_order(fresh)
    if dialect.supports_insert_enqueued_many(alias):
        # PostgreSQL: the statement that inserts the rows writes their events too, from the
        # rows (the data _enqueued_data gives), in the order inserted; SQLite: a statement
        # after it, without an Event object per row.
        event = _enqueued_event(rows[0], now)
        inserted = dialect.insert_enqueued_many(alias, ordered, varying=_VARYING, event=event)
    else:
        inserted = dialect.insert_many(alias, ordered, varying=_VARYING, skip_present=True)
        new = [row for row in ordered if row.occurrence_id in inserted]
        dialect.insert_many(alias, _enqueued_events(new, now), varying=["occurrence_id", "data"])
    missing = [pk for pk in fresh if pk not in inserted]
    present = _present(alias, missing)
    if len(present) != len(missing):
        raise IntegrityError("occurrences were neither inserted nor found")
    results = _judge_present(job, rows, firsts, present)
    if inserted:
        dialect.notify_new_work(alias)
    return results


# The columns in which a bulk enqueue's rows differ (the rest are the job's, the same for all).
_VARYING = ["occurrence_id", "idempotency_key", "trigger_key", "scheduled_for", "available_at", "payload"]


def _insert_many_portable(
    job: Job, rows: list[Occurrence], now: datetime, alias: str
) -> list[tuple[Occurrence, bool]]:
    """Bulk enqueue elsewhere (MySQL/MariaDB): read which identities exist, then insert
    the others with ``bulk_create``."""
    fresh, firsts = _split_fresh(job, rows)
    present = _present(alias, list(fresh))
    results = _judge_present(job, rows, firsts, present)
    new = _in_key_order({pk: row for pk, row in fresh.items() if pk not in present})
    if new:
        Occurrence.objects.using(alias).bulk_create(new, batch_size=500)
        Event.objects.using(alias).bulk_create(_enqueued_events(new, now), batch_size=500)
        dialect.notify_new_work(alias)
    return results


def enqueue_once_per_trigger(
    job_id: str,
    *,
    scheduled_for: datetime | int,
    trigger_key: str,
    available_at: datetime | int | None = None,
    payload: Any = _UNSET,
    using: str | None = None,
) -> tuple[Occurrence, bool]:
    """Like :func:`enqueue`, but dedupes on (job, trigger_key) across job revisions."""
    job_id, scheduled_ms, key, available_ms = _enqueue_args(job_id, scheduled_for, trigger_key, available_at)
    if payload is not _UNSET:
        payload = normalize_json(payload, "payload")
    now = conf.now()
    with _write(using) as alias:
        try:
            # The job row lock serializes once-per-trigger enqueues of one job, so two
            # racing callers at different revisions cannot both insert.
            job = Job.objects.using(alias).select_for_update().get(pk=job_id)
        except Job.DoesNotExist:
            raise NotFound(f"job {job_id!r} does not exist", {"job_id": job_id}) from None
        prior = list(
            Occurrence.objects.using(alias).filter(job=job, trigger_key=key).order_by("created_at", "pk")[:2]
        )
        if len(prior) > 1:
            raise DataCorrupt(
                "several occurrences exist for a once-per-trigger key", {"job_id": job_id, "trigger_key": key}
            )
        if prior:
            return prior[0], True
        return _insert_occurrence(
            job,
            scheduled_ms=scheduled_ms,
            trigger_key=key,
            available_ms=available_ms,
            payload=payload,
            now=now,
            alias=alias,
        )


# --------------------------------------------------------------------------- schedules


def materialize_due(*, limit: int = 50, using: str | None = None) -> int:
    """Write the occurrences of every enabled job whose next fire time has come, and advance
    its next fire time in the same transaction. Returns the number of occurrences written.

    Each slot fires at most once, ever: the job rows are locked (SKIP LOCKED, so racing
    schedulers split the jobs between them; SQLite serializes writers), the next fire time
    only moves forward, and ``last_slot_at`` refuses any slot at or before one already
    materialized, across edits and pruning.
    """
    limit = normalize_int(limit, "limit", minimum=1, maximum=1000)
    now = conf.now()
    alias = using or DEFAULT_DB_ALIAS
    due = Job.objects.using(alias).filter(enabled=True, next_fire_at__lte=now)
    # The common case, nothing due, costs this one indexed query and no write transaction.
    if not due.exists():
        return 0
    written = 0
    with _write(using) as alias:
        jobs = list(dialect.lock_rows(due.order_by("next_fire_at", "job_id"), alias)[:limit])
        for job in jobs:
            written += _materialize_job(job, now, alias)
    return written


def _materialize_job(job: Job, now: datetime, alias: str) -> int:
    assert job.next_fire_at is not None
    overlap_active = (
        job.trigger.get("overlap") == "skip"
        and Occurrence.objects.using(alias).filter(job=job, status__in=ACTIVE_STATUSES).exists()
    )
    plan = plan_slots(
        job.trigger,
        next_fire_at=job.next_fire_at,
        now=now,
        anchor=job.created_at,
        last_slot_at=job.last_slot_at,
        overlap_active=overlap_active,
    )
    written = 0
    for slot in plan.fire:
        slot_ms = to_ms(slot, "slot")
        _, deduplicated = _insert_occurrence(
            job,
            scheduled_ms=slot_ms,
            trigger_key=slot_trigger_key(slot),
            available_ms=slot_ms,
            payload=_UNSET,
            now=now,
            alias=alias,
        )
        written += not deduplicated
    events = [
        _event(job.job_id, SLOT_SKIPPED, now, data={"slot": iso_ms(slot), "reason": reason})
        for slot, reason in plan.skipped[:MAX_SKIP_EVENTS]
    ]
    if len(plan.skipped) > MAX_SKIP_EVENTS:
        rest = plan.skipped[MAX_SKIP_EVENTS:]
        events.append(
            _event(
                job.job_id,
                SLOT_SKIPPED,
                now,
                data={
                    "reason": "many",
                    "count": len(rest),
                    "from": iso_ms(rest[0][0]),
                    "to": iso_ms(rest[-1][0]),
                },
            )
        )
    if plan.bulk_skipped is not None:
        after, until = plan.bulk_skipped
        events.append(
            _event(
                job.job_id,
                SLOT_SKIPPED,
                now,
                data={"reason": "scan_limit", "after": iso_ms(after), "until": iso_ms(until)},
            )
        )
    Event.objects.using(alias).bulk_create(events)
    last = (
        plan.last_slot_at
        if job.last_slot_at is None or plan.last_slot_at is None
        else max(plan.last_slot_at, job.last_slot_at)
    )
    Job.objects.using(alias).filter(pk=job.pk).update(next_fire_at=plan.next_fire_at, last_slot_at=last)
    job.next_fire_at, job.last_slot_at = plan.next_fire_at, last
    return written


def next_due_at(*, using: str | None = None) -> datetime | None:
    """The earliest next fire time of any enabled job (for the worker's sleep)."""
    row = (
        Job.objects.using(using or DEFAULT_DB_ALIAS)
        .filter(enabled=True, next_fire_at__isnull=False)
        .order_by("next_fire_at")
        .values_list("next_fire_at", flat=True)
        .first()
    )
    return row


# --------------------------------------------------------------------------- cancel


def cancel(occurrence_id: str, *, reason: str | None = None, using: str | None = None) -> Occurrence:
    """Cancel a queued or retry_wait occurrence. Running ones cannot be cancelled."""
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    if reason is not None:
        if not isinstance(reason, str):
            raise InvalidArgument("reason", "must be a string or None")
        reason = normalize_json(reason, "reason")
        if len(reason.encode("utf-8")) > MAX_CANCEL_REASON:
            raise InvalidArgument("reason", f"must be at most {MAX_CANCEL_REASON} bytes")
    now = conf.now()
    with _write(using) as alias:
        try:
            occurrence = Occurrence.objects.using(alias).select_for_update().get(pk=occurrence_id)
        except Occurrence.DoesNotExist:
            raise NotFound(
                f"occurrence {occurrence_id!r} does not exist", {"occurrence_id": occurrence_id}
            ) from None
        if occurrence.status not in PENDING_STATUSES:
            raise InvalidState(
                f"occurrence {occurrence_id!r} is {occurrence.status}; "
                "only queued or retry_wait occurrences can be cancelled",
                {"occurrence_id": occurrence_id, "status": occurrence.status},
            )
        previous = occurrence.status
        occurrence.status = OccurrenceStatus.CANCELLED
        occurrence.settled_at = now
        occurrence.updated_at = now
        occurrence.last_error = {"code": "SCHEDULER_CANCELLED", "message": reason}
        occurrence.save(using=alias, update_fields=["status", "settled_at", "updated_at", "last_error"])
        _settle_cancelled([occurrence_id], reason, now, alias)
        _event(
            occurrence.job_id,
            OCCURRENCE_CANCELLED,
            now,
            occurrence_id=occurrence_id,
            data={"reason": reason, "previousStatus": previous},
        ).save(using=alias)
    return occurrence


# --------------------------------------------------------------------------- claim


def _dead_letter_rows(rows: Sequence[Occurrence], now: datetime, alias: str, *, reason: str) -> None:
    error = {"code": "SCHEDULER_LEASE_EXPIRED", "message": "lease expired on the final attempt"}
    ids = [row.pk for row in rows]
    Occurrence.objects.using(alias).filter(pk__in=ids).update(
        status=OccurrenceStatus.DEAD_LETTER,
        lease_owner=None,
        lease_expires_at=None,
        settled_at=now,
        updated_at=now,
        last_error=error,
    )
    settle_reservations(
        ids, OccurrenceStatus.DEAD_LETTER, {"status": "dead_letter", "error": error}, now, alias
    )
    Event.objects.using(alias).bulk_create(
        [
            _event(
                row.job_id,
                OCCURRENCE_DEAD_LETTERED,
                now,
                occurrence_id=row.pk,
                owner_id=row.lease_owner,
                fence=row.fence,
                data={"reason": reason, "attempt": row.attempt, "maxAttempts": row.max_attempts},
            )
            for row in rows
        ]
    )


def dead_letter_expired(*, limit: int = 500, using: str | None = None) -> int:
    """Dead-letter running occurrences whose lease expired on their final attempt."""
    now = conf.now()
    expired = Occurrence.objects.using(using or DEFAULT_DB_ALIAS).filter(
        status=OccurrenceStatus.RUNNING, lease_expires_at__lte=now, attempt__gte=F("max_attempts")
    )
    # Usually there is nothing to do: find out without taking a write lock.
    if not expired.exists():
        return 0
    with _write(using) as alias:
        rows = list(
            dialect.lock_rows(
                expired.using(alias)
                .order_by("lease_expires_at", "pk")
                .only("pk", "job_id", "lease_owner", "fence", "attempt", "max_attempts"),
                alias,
            )[:limit]
        )
        if rows:
            _dead_letter_rows(rows, now, alias, reason="lease_expired")
    return len(rows)


def _due(now: datetime) -> Q:
    return dialect.pending_due(now) | dialect.reclaim_due(now)


def _job_filter(kinds: list[str] | None) -> Q:
    condition = Q(job__enabled=True)
    if kinds is not None:
        condition &= Q(job__kind__in=kinds)
    return condition


def claim_batch(
    *,
    owner: str,
    lease: float | timedelta,
    limit: int = 1,
    kinds: Iterable[str] | None = None,
    after_principal: str | None = None,
    sweep_expired: bool = True,
    using: str | None = None,
) -> list[Occurrence]:
    """Claim up to ``limit`` due occurrences in one transaction, fairly across principals
    (``after_principal``: the ``principal_key`` this claimer served last, for round-robin).

    Due: queued/retry_wait whose time has come, or running with an expired lease and
    attempts left (a reclaim). Each becomes running with attempt+1 and fence+1.
    """
    owner = _owner(owner)
    lease_ms = _lease_ms(lease)
    limit = normalize_int(limit, "limit", minimum=1, maximum=conf.settings.MAX_CLAIM_BATCH)
    kind_list = _kinds(kinds)
    if sweep_expired:  # the worker sweeps on its own schedule instead of before every claim
        dead_letter_expired(using=using)
    now = conf.now()
    expires = now + timedelta(milliseconds=lease_ms)
    # Who has work is read before the transaction: when nobody has (an idle worker's every
    # turn), the claim is one statement and no transaction. The rows are re-checked under
    # the lock anyway.
    waiting = dialect.waiting_principals(using or DEFAULT_DB_ALIAS, now)
    if not waiting:
        return []
    with _write(using) as alias:
        rows = dialect.claim_candidates(alias, now, kind_list, limit, after_principal, waiting)
        if not rows:
            return []
        ids = [row.pk for row in rows]
        Occurrence.objects.using(alias).filter(pk__in=ids).update(
            status=OccurrenceStatus.RUNNING,
            attempt=F("attempt") + 1,
            fence=F("fence") + 1,
            lease_owner=owner,
            lease_expires_at=expires,
            updated_at=now,
        )
        events = []
        for row in rows:
            reclaimed = row.status == OccurrenceStatus.RUNNING
            data: dict[str, Any] = {
                "attempt": row.attempt + 1,
                "maxAttempts": row.max_attempts,
                "leaseExpiresAt": iso_ms(expires),
            }
            if reclaimed:
                data.update(previousOwner=row.lease_owner, previousFence=row.fence)
            events.append(
                _event(
                    row.job_id,
                    OCCURRENCE_RECLAIMED if reclaimed else OCCURRENCE_CLAIMED,
                    now,
                    occurrence_id=row.pk,
                    owner_id=owner,
                    fence=row.fence + 1,
                    data=data,
                )
            )
            row.status = OccurrenceStatus.RUNNING
            row.attempt += 1
            row.fence += 1
            row.lease_owner = owner
            row.lease_expires_at = expires
            row.updated_at = now
        dialect.insert_rows(alias, events)
    return list(rows)


def has_due(*, kinds: Iterable[str] | None = None, using: str | None = None) -> bool:
    """Whether anything is claimable now (a read without locks: rows another claimer holds
    count too)."""
    kind_list = _kinds(kinds)
    now = conf.now()
    return (
        Occurrence.objects.using(using or DEFAULT_DB_ALIAS)
        .filter(_due(now) & _job_filter(kind_list))
        .exists()
    )


def claim(
    *, owner: str, lease: float | timedelta, kinds: Iterable[str] | None = None, using: str | None = None
) -> Occurrence | None:
    """Claim the next due occurrence, or return None when nothing is due."""
    rows = claim_batch(owner=owner, lease=lease, limit=1, kinds=kinds, using=using)
    return rows[0] if rows else None


# --------------------------------------------------------------------------- renew / settle


def _lease_lost(
    occurrence_id: str, current: Occurrence | None, owner: str, fence: int, now: datetime
) -> LeaseLost:
    if current is None:
        reason = "not_found"
    elif current.status != OccurrenceStatus.RUNNING:
        reason = "not_running"
    elif current.lease_owner != owner:
        reason = "wrong_owner"
    elif current.fence != fence:
        reason = "wrong_fence"
    else:
        reason = "lease_expired"
    details: dict[str, Any] = {
        "occurrence_id": occurrence_id,
        "reason": reason,
        "owner": owner,
        "fence": fence,
    }
    if current is not None:
        details.update(status=current.status, current_fence=current.fence)
    return LeaseLost(f"lease on occurrence {occurrence_id!r} is lost ({reason.replace('_', ' ')})", details)


def _holds_lease(occurrence: Occurrence, owner: str, fence: int, now: datetime) -> bool:
    return (
        occurrence.status == OccurrenceStatus.RUNNING
        and occurrence.lease_owner == owner
        and occurrence.fence == fence
        and occurrence.lease_expires_at is not None
        and occurrence.lease_expires_at > now
    )


def _lease_args(occurrence_id: Any, owner: Any, fence: Any) -> tuple[str, str, int]:
    return (
        normalize_identifier(occurrence_id, "occurrence_id"),
        _owner(owner),
        normalize_int(fence, "fence", minimum=1),
    )


def renew(
    occurrence_id: str, *, owner: str, fence: int, lease: float | timedelta, using: str | None = None
) -> Occurrence:
    """Extend a held lease to at least now + ``lease`` (never shortens it)."""
    occurrence_id, owner, fence = _lease_args(occurrence_id, owner, fence)
    lease_ms = _lease_ms(lease)
    now = conf.now()
    wanted = now + timedelta(milliseconds=lease_ms)
    with _write(using) as alias:
        updated = (
            Occurrence.objects.using(alias)
            .filter(
                pk=occurrence_id,
                status=OccurrenceStatus.RUNNING,
                lease_owner=owner,
                fence=fence,
                lease_expires_at__gt=now,
            )
            .update(lease_expires_at=Greatest(F("lease_expires_at"), wanted), updated_at=now)
        )
        current = Occurrence.objects.using(alias).filter(pk=occurrence_id).first()
        if not updated or current is None:
            raise _lease_lost(occurrence_id, current, owner, fence, now)
        _event(
            current.job_id,
            OCCURRENCE_RENEWED,
            now,
            occurrence_id=occurrence_id,
            owner_id=owner,
            fence=fence,
            data={"leaseExpiresAt": iso_ms(current.lease_expires_at or wanted)},
        ).save(using=alias)
    return current


def _normalize_error(error: Any, field: str = "error") -> dict[str, Any] | None:
    if error is None:
        return None
    if isinstance(error, BaseException):
        error = {"type": type(error).__name__, "message": str(error)}
    elif isinstance(error, str):
        error = {"message": error}
    elif not isinstance(error, dict):
        raise InvalidArgument(field, "must be a string, a dict or an exception")
    error = dict(error)
    for key in ("message", "traceback"):
        value = error.get(key)
        if isinstance(value, str):
            # Exception text can hold anything; keep it storable rather than fail the settle.
            value = error[key] = value.encode("utf-8", "replace").decode("utf-8")
            limit = MAX_ERROR_MESSAGE if key == "message" else 4 * MAX_ERROR_MESSAGE
            encoded = value.encode("utf-8")
            if len(encoded) > limit:
                # Keep the end of a traceback (where the error is), the start of a message.
                cut = encoded[-limit:] if key == "traceback" else encoded[:limit]
                error[key] = cut.decode("utf-8", "ignore")
                error[f"{key}_truncated"] = True
    return normalize_json(error, field, max_bytes=MAX_RESULT_BYTES)  # type: ignore[no-any-return]


def backoff_delay_ms(attempt: int, base_ms: int, max_ms: int, jitter: float | None = None) -> int:
    """Exponential backoff with jitter: base * 2**(attempt-1), capped, +/- jitter."""
    jitter = conf.settings.RETRY_JITTER if jitter is None else jitter
    raw = min(max_ms, base_ms * (2 ** max(0, min(attempt - 1, 40))))
    spread = raw * jitter
    return max(1, min(max_ms, int(raw + random.uniform(-spread, spread))))


@dataclass(frozen=True)
class _Outcome:
    """One validated settle request."""

    occurrence_id: str
    fence: int
    outcome: str
    result: Any
    error: dict[str, Any] | None
    retryable: bool
    retry_ms: int | None


SETTLE_ITEM_KEYS = frozenset(
    {"occurrence_id", "fence", "outcome", "result", "error", "retryable", "retry_at"}
)


def _settle_args(
    occurrence_id: Any,
    fence: Any,
    outcome: Any,
    result: Any,
    error: Any,
    retryable: Any,
    retry_at: Any,
    prefix: str = "",
) -> _Outcome:
    occurrence_id = normalize_identifier(occurrence_id, f"{prefix}occurrence_id")
    fence = normalize_int(fence, f"{prefix}fence", minimum=1)
    if outcome not in ("succeeded", "failed"):
        raise InvalidArgument(f"{prefix}outcome", "must be 'succeeded' or 'failed'")
    result_value = check_result(result, f"{prefix}result")
    return _Outcome(
        occurrence_id=occurrence_id,
        fence=fence,
        outcome=outcome,
        result=result_value,
        error=_normalize_error(error, f"{prefix}error"),
        retryable=normalize_bool(retryable, f"{prefix}retryable"),
        retry_ms=None if retry_at is None else to_ms(retry_at, f"{prefix}retry_at"),
    )


def check_result(result: Any, field: str = "result") -> Any:
    """A handler result as it will be stored (JSON, at most 64 KiB), or ``InvalidArgument``."""
    return normalize_json(result, field, max_bytes=MAX_RESULT_BYTES)


def settle(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    outcome: str,
    result: Any = None,
    error: Any = None,
    retryable: bool = True,
    retry_at: datetime | int | None = None,
    using: str | None = None,
) -> Occurrence:
    """Record the outcome of a held occurrence.

    ``succeeded`` stores ``result``. ``failed`` goes to retry_wait (at ``retry_at`` or the
    job's backoff) when ``retryable`` and attempts remain, else to dead_letter.
    ``SCHEDULER_LEASE_LOST`` unless the caller holds an unexpired lease with this fence.
    Returns the settled occurrence; its fields other than state, lease, attempts and the
    written outcome (``payload``, ``authority`` ...) are loaded on first access.
    """
    spec = _settle_args(occurrence_id, fence, outcome, result, error, retryable, retry_at)
    owner = _owner(owner)
    now = conf.now()
    with _write(using) as alias:
        (settled,) = _settle_held([spec], owner, now, alias)
    if isinstance(settled, LeaseLost):
        raise settled
    return settled


def settle_many(
    items: Iterable[dict[str, Any]], *, owner: str, using: str | None = None
) -> list[Occurrence | LeaseLost]:
    """Settle many held occurrences in one transaction (what the worker does with the
    outcomes of a batch). Each item is a dict of :func:`settle`'s arguments
    (``occurrence_id``, ``fence``, ``outcome`` and optionally ``result``, ``error``,
    ``retryable``, ``retry_at``). Bad input raises ``InvalidArgument`` naming the item and
    writes nothing. Returns, per item in order, the settled occurrence, or the
    ``LeaseLost`` error of an item whose lease is no longer held (the others settle).
    """
    owner = _owner(owner)
    if isinstance(items, dict | str) or not isinstance(items, Iterable):
        raise InvalidArgument("items", "must be a list of dicts")
    specs: list[_Outcome] = []
    for index, item in enumerate(items):
        prefix = f"items[{index}]."
        if not isinstance(item, dict):
            raise InvalidArgument(f"items[{index}]", "must be a dict")
        unknown = set(item) - SETTLE_ITEM_KEYS
        if unknown:
            raise InvalidArgument(f"{prefix}{sorted(unknown)[0]}", "is not a settle argument")
        specs.append(
            _settle_args(
                item.get("occurrence_id"),
                item.get("fence"),
                item.get("outcome"),
                item.get("result"),
                item.get("error"),
                item.get("retryable", True),
                item.get("retry_at"),
                prefix,
            )
        )
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        if spec.occurrence_id in seen:
            raise InvalidArgument(f"items[{index}].occurrence_id", "appears twice")
        seen.add(spec.occurrence_id)
    if not specs:
        return []
    now = conf.now()
    with _write(using) as alias:
        return _settle_held(specs, owner, now, alias)


def _group_key(values: dict[str, Any]) -> str:
    """A key under which rows that get equal values are written with one statement. Any
    deterministic text will do (1 and 1.0 merely form two groups): the C JSON encoder,
    not the canonical one, as this runs for every settled occurrence."""
    return json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)


def _settle_held(
    specs: Sequence[_Outcome], owner: str, now: datetime, alias: str
) -> list[Occurrence | LeaseLost]:
    """The body of settle/settle_many, inside the transaction: lock the rows, refuse those
    whose lease is not held, then one UPDATE per group of rows that get the same values,
    the reservations settled and one event per row, in bulk."""
    locked = {
        row.pk: row
        for row in Occurrence.objects.using(alias)
        .select_for_update()
        .filter(pk__in=[spec.occurrence_id for spec in specs])
        .order_by("pk")
        .only(*dialect.LEASE_FIELDS)
    }
    needs_backoff = {
        locked[spec.occurrence_id].job_id
        for spec in specs
        if spec.occurrence_id in locked
        and spec.outcome == "failed"
        and spec.retryable
        and spec.retry_ms is None
    }
    # Read, not locked: locking the job row would serialize every settle of a job.
    delays = {
        job_id: (base_ms, max_ms)
        for job_id, base_ms, max_ms in Job.objects.using(alias)
        .filter(pk__in=needs_backoff)
        .values_list("pk", "retry_base_delay_ms", "retry_max_delay_ms")
    }
    out: list[Occurrence | LeaseLost] = []
    updates: dict[str, tuple[dict[str, Any], list[str]]] = {}
    terminal: dict[str, tuple[str, dict[str, Any], list[str]]] = {}
    pending_events: list[tuple[Occurrence, str, dict[str, Any], int]] = []
    for spec in specs:
        current = locked.get(spec.occurrence_id)
        if current is None or not _holds_lease(current, owner, spec.fence, now):
            out.append(_lease_lost(spec.occurrence_id, current, owner, spec.fence, now))
            continue
        data: dict[str, Any] = {"attempt": current.attempt, "maxAttempts": current.max_attempts}
        values: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None, "updated_at": now}
        if spec.outcome == "succeeded":
            values.update(status=OccurrenceStatus.SUCCEEDED, result=spec.result, settled_at=now)
            event_type = OCCURRENCE_SUCCEEDED
        elif spec.retryable and current.attempt < current.max_attempts:
            if spec.retry_ms is None:
                base_ms, max_ms = delays[current.job_id]
                available = now + timedelta(milliseconds=backoff_delay_ms(current.attempt, base_ms, max_ms))
            else:
                available = max(now, from_ms(spec.retry_ms))
            values.update(status=OccurrenceStatus.RETRY_WAIT, available_at=available, last_error=spec.error)
            event_type = OCCURRENCE_RETRY_SCHEDULED
            data["retryAt"] = iso_ms(available)
        else:
            values.update(status=OccurrenceStatus.DEAD_LETTER, last_error=spec.error, settled_at=now)
            event_type = OCCURRENCE_DEAD_LETTERED
            data["reason"] = "max_attempts" if spec.retryable else "not_retryable"
        for name, value in values.items():
            setattr(current, name, value)
        group = _group_key(values)
        updates.setdefault(group, (values, []))[1].append(current.pk)
        if current.status != OccurrenceStatus.RETRY_WAIT:
            outcome_data: dict[str, Any] = {"status": current.status}
            if current.status == OccurrenceStatus.SUCCEEDED:
                outcome_data["result"] = spec.result
            else:
                outcome_data["error"] = spec.error
            key = _group_key(outcome_data)
            terminal.setdefault(key, (current.status, outcome_data, []))[2].append(current.pk)
        pending_events.append((current, event_type, data, spec.fence))
        out.append(current)
    for values, ids in updates.values():
        Occurrence.objects.using(alias).filter(pk__in=ids).update(**values)
    reserved: dict[str, dict[str, Any]] = {}
    for status, outcome_data, ids in terminal.values():
        reserved.update(settle_reservations(ids, status, outcome_data, now, alias))
    dialect.insert_rows(
        alias,
        [
            _event(
                current.job_id,
                event_type,
                now,
                occurrence_id=current.pk,
                owner_id=owner,
                fence=fence,
                data={**data, **reserved.get(current.pk, {})},
            )
            for current, event_type, data, fence in pending_events
        ],
    )
    return out


def _requeue_unattempted(occurrence_id: str, *, available: datetime, now: datetime, alias: str) -> None:
    """Back to queued, due at ``available``, lease dropped, and the claim's attempt given
    back (the fence stays: it only ever grows)."""
    Occurrence.objects.using(alias).filter(pk=occurrence_id).update(
        status=OccurrenceStatus.QUEUED,
        attempt=Case(
            When(attempt__gt=0, then=F("attempt") - 1),
            default=F("attempt"),
            output_field=PositiveSmallIntegerField(),
        ),
        lease_owner=None,
        lease_expires_at=None,
        available_at=available,
        updated_at=now,
    )


def release(occurrence_id: str, *, owner: str, fence: int, using: str | None = None) -> Occurrence:
    """Give a held lease up without using an attempt, so another worker can take it at once
    (graceful shutdown). The occurrence goes back to queued, due now."""
    occurrence_id, owner, fence = _lease_args(occurrence_id, owner, fence)
    now = conf.now()
    with _write(using) as alias:
        current = _take_held(occurrence_id, owner, fence, now, alias)
        _requeue_unattempted(occurrence_id, available=now, now=now, alias=alias)
        _event(
            current.job_id, OCCURRENCE_RELEASED, now, occurrence_id=occurrence_id, owner_id=owner, fence=fence
        ).save(using=alias)
        current.refresh_from_db(using=alias)
    return current


def record_execution(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    metadata: Any = _UNSET,
    receipt: Any = _UNSET,
    using: str | None = None,
) -> Occurrence:
    """Persist a running handler's metadata and/or execution receipt (64 KiB each) at once.
    ``SCHEDULER_LEASE_LOST`` unless the caller still holds the lease."""
    occurrence_id, owner, fence = _lease_args(occurrence_id, owner, fence)
    values: dict[str, Any] = {}
    if metadata is not _UNSET:
        values["metadata"] = normalize_json(metadata, "metadata", max_bytes=MAX_RESULT_BYTES)
    if receipt is not _UNSET:
        values["receipt"] = normalize_json(receipt, "receipt", max_bytes=MAX_RESULT_BYTES)
    if not values:
        raise InvalidArgument("metadata", "give metadata or receipt")
    now = conf.now()
    with _write(using) as alias:
        updated = (
            Occurrence.objects.using(alias)
            .filter(
                pk=occurrence_id,
                status=OccurrenceStatus.RUNNING,
                lease_owner=owner,
                fence=fence,
                lease_expires_at__gt=now,
            )
            .update(updated_at=now, **values)
        )
        current = Occurrence.objects.using(alias).filter(pk=occurrence_id).first()
        if not updated or current is None:
            raise _lease_lost(occurrence_id, current, owner, fence, now)
    return current


def _take_held(occurrence_id: str, owner: str, fence: int, now: datetime, alias: str) -> Occurrence:
    current = Occurrence.objects.using(alias).select_for_update().filter(pk=occurrence_id).first()
    if current is None or not _holds_lease(current, owner, fence, now):
        raise _lease_lost(occurrence_id, current, owner, fence, now)
    return current


def deny(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    code: str,
    reason: str,
    details: dict[str, Any] | None = None,
    using: str | None = None,
) -> Occurrence:
    """Dead-letter a held occurrence that authority refused, without retry (event
    ``authority_denied`` with the reason and details)."""
    occurrence_id, owner, fence = _lease_args(occurrence_id, owner, fence)
    reason = normalize_identifier(reason, "reason", max_length=64)
    code = normalize_identifier(code, "code", max_length=64)
    detail_value = normalize_json(details or {}, "details", max_bytes=MAX_RESULT_BYTES)
    now = conf.now()
    with _write(using) as alias:
        current = _take_held(occurrence_id, owner, fence, now, alias)
        error = {
            "code": code,
            "reason": reason,
            "details": detail_value,
            "message": f"authority denied: {reason}",
        }
        current.status = OccurrenceStatus.DEAD_LETTER
        current.lease_owner = None
        current.lease_expires_at = None
        current.settled_at = now
        current.updated_at = now
        current.last_error = error
        current.save(
            using=alias,
            update_fields=[
                "status",
                "lease_owner",
                "lease_expires_at",
                "settled_at",
                "updated_at",
                "last_error",
            ],
        )
        settled = settle_reservations(
            [occurrence_id],
            OccurrenceStatus.DEAD_LETTER,
            {"status": "dead_letter", "error": error},
            now,
            alias,
        )
        data: dict[str, Any] = {
            "reason": reason,
            "code": code,
            "details": detail_value,
            "attempt": current.attempt,
        }
        data.update(settled.get(occurrence_id, {}))
        _event(
            current.job_id,
            AUTHORITY_DENIED,
            now,
            occurrence_id=occurrence_id,
            owner_id=owner,
            fence=fence,
            data=data,
        ).save(using=alias)
    return current


def defer(
    occurrence_id: str,
    *,
    owner: str,
    fence: int,
    until: datetime | int,
    details: dict[str, Any] | None = None,
    using: str | None = None,
) -> Occurrence:
    """Put a held occurrence back to wait until ``until`` without using an attempt (its
    principal's budget is spent until the window ends; event ``authority_deferred``)."""
    occurrence_id, owner, fence = _lease_args(occurrence_id, owner, fence)
    until_ms = to_ms(until, "until")
    detail_value = normalize_json(details or {}, "details", max_bytes=MAX_RESULT_BYTES)
    now = conf.now()
    with _write(using) as alias:
        current = _take_held(occurrence_id, owner, fence, now, alias)
        available = max(now, from_ms(until_ms))
        _requeue_unattempted(occurrence_id, available=available, now=now, alias=alias)
        _event(
            current.job_id,
            AUTHORITY_DEFERRED,
            now,
            occurrence_id=occurrence_id,
            owner_id=owner,
            fence=fence,
            data={"until": iso_ms(available), "details": detail_value},
        ).save(using=alias)
        current.refresh_from_db(using=alias)
    return current


# --------------------------------------------------------------------------- history


def history(
    job_id: str | None = None, occurrence_id: str | None = None, limit: int = 50, *, using: str | None = None
) -> list[Event]:
    """Events newest first, for a job, an occurrence, or everything."""
    limit = normalize_int(limit, "limit", minimum=1, maximum=10_000)
    qs = Event.objects.using(using or DEFAULT_DB_ALIAS).all()
    if job_id is not None:
        qs = qs.filter(job_id=normalize_identifier(job_id, "job_id"))
    if occurrence_id is not None:
        qs = qs.filter(occurrence_id=normalize_identifier(occurrence_id, "occurrence_id"))
    return list(qs.order_by("-event_id")[:limit])
