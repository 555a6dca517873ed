"""Jobs: creating and editing job definitions. Part of the kernel: a trigger change cancels
the pending occurrences the old trigger materialized, in the same transaction.

Every change is compare-and-set on the job's revision and appends its event.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from .. import conf
from ..db.dialect import alias_for, column_max, write_transaction
from ..exceptions import Conflict, InvalidArgument, NotFound, RevisionConflict
from ..models import PENDING_STATUSES, Job, Occurrence
from ..rules.authority import Envelope, Principal, default_authority, normalize_authority
from ..rules.chains import EDGES, normalize_specs
from ..rules.events import JOB_CREATED, JOB_UPDATED, SLOT_SKIPPED
from ..rules.identity import canonical_json, normalize_json
from ..rules.schedules import MISFIRE_GRACE, catchup_window, expired_one_off, initial_fire_time
from ..rules.throttles import stored_throttle
from ..rules.triggers import validate_trigger
from ..rules.validation import (
    MAX_ATTEMPTS_LIMIT,
    key_label,
    normalize_bool,
    normalize_identifier,
    normalize_int,
    normalize_limit,
    normalize_template,
    retry_base_delay_ms,
    retry_max_delay_ms,
    timeout_ms,
)
from . import chaining
from .authority.policies import bind_to_current_policy, get_policy, grant_default
from .cancelling import CANCEL_FIELDS, cancel_pending
from .events import new_event

logger = logging.getLogger("django_durable_scheduler")

MAX_REVISION = column_max(Job, "revision")
SUPERSEDED = "superseded"
MISFIRED = "misfired"


def _job_fields(changes: dict[str, Any], *, creating: bool) -> dict[str, Any]:
    """Validate job attributes; returns model field values."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if key == "kind":
            out["kind"] = normalize_identifier(value, "kind", max_length=128)
        elif key == "trigger":
            out["trigger"] = validate_trigger({} if value is None else value, "trigger")
        elif key == "payload":
            out["payload"] = normalize_json(value, "payload")
        elif key == "authority":
            # None: the default authority, built once the kind is known (_default_authority).
            out["authority"] = None if value is None else normalize_authority(value, "authority")
        elif key == "enabled":
            out["enabled"] = normalize_bool(value, "enabled")
        elif key == "max_attempts":
            out["max_attempts"] = normalize_int(value, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT)
        elif key == "retry_base_delay":
            out["retry_base_delay_ms"] = retry_base_delay_ms(value, "retry_base_delay")
        elif key == "timeout":
            out["timeout_ms"] = timeout_ms(value, "timeout")
        elif key == "retry_max_delay":
            out["retry_max_delay_ms"] = retry_max_delay_ms(value, "retry_max_delay")
        elif key == "concurrency":
            out["concurrency"] = normalize_limit(value, "concurrency")
        elif key == "concurrency_key":
            out["concurrency_key"] = normalize_template(value, "concurrency_key")
        elif key == "throttle":
            out["throttle"] = stored_throttle(value, "throttle")
        elif key in EDGES:
            out[key] = normalize_specs(value, key, nested=False)
        else:
            raise InvalidArgument(
                key_label(key), "is not a job attribute that can be " + ("set" if creating else "changed")
            )
    return out


def _default_authority(job_id: str, kind: str, alias: str) -> Envelope:
    """The envelope of a job given none, its capability granted to the default principal."""
    grant_default(kind, job_id=job_id, using=alias)
    return default_authority(kind, conf.settings.DEFAULT_PRINCIPAL)


def _has_default_authority(job: Job) -> bool:
    """Whether ``job`` runs under the default envelope of its kind (policy binding aside)."""
    default = default_authority(job.kind, conf.settings.DEFAULT_PRINCIPAL)
    return bool(
        job.authority.get("principal") == default["principal"]
        and job.authority.get("requestedCapabilities") == default["requestedCapabilities"]
    )


def _warn_without_policy(job_id: str, authority: Envelope, alias: str) -> None:
    """Log that an explicit envelope's principal has no policy: every run would be denied."""
    principal = Principal.of(authority)
    if get_policy(*principal, using=alias) is None:
        logger.warning(
            "job %s runs as %s, which has no authority policy: every run is denied "
            "(policy_required) until one is set (set_policy, ensure_policy or the admin)",
            job_id,
            principal.label,
        )


def _bind_current(authority: Envelope, alias: str) -> Envelope:
    """An envelope that names no policy revision is bound to its principal's current policy,
    covered or not, so that the worker names what is missing (``permission_denied``)."""
    if "schedulerPolicyRevision" in authority["authorizationRefs"]:
        return authority
    return bind_to_current_policy(authority, using=alias)


def _check_chain(job_id: str, fields: dict[str, Any], alias: str) -> None:
    """The jobs a job's follow-ups name exist (itself aside: a job may follow itself only
    through a cycle, which is refused next), and lead nowhere back to it."""
    declared = {edge: fields.get(edge) for edge in EDGES}
    chaining.check_jobs_exist(declared, alias, skip=job_id)
    chaining.check_no_cycle(job_id, declared, alias)


def _check_retry_delays(base_ms: int, max_ms: int) -> None:
    if max_ms < base_ms:
        raise InvalidArgument("retry_max_delay", "must not be shorter than retry_base_delay")


def get_job(job_id: str, *, using: str | None = None) -> Job:
    job_id = normalize_identifier(job_id, "job_id")
    try:
        return Job.objects.using(alias_for(using)).get(pk=job_id)
    except Job.DoesNotExist:
        raise NotFound(f"job {job_id!r} does not exist", {"job_id": job_id}) from None


def get_occurrence(occurrence_id: str, *, using: str | None = None) -> Occurrence:
    occurrence_id = normalize_identifier(occurrence_id, "occurrence_id")
    try:
        return Occurrence.objects.using(alias_for(using)).get(pk=occurrence_id)
    except Occurrence.DoesNotExist:
        raise NotFound(
            f"occurrence {occurrence_id!r} does not exist", {"occurrence_id": occurrence_id}
        ) from None


def create_job(
    job_id: str,
    kind: str,
    *,
    authority: Envelope | dict[str, Any] | None = None,
    trigger: dict[str, Any] | None = None,
    payload: Any = None,
    enabled: bool = True,
    max_attempts: int = 3,
    retry_base_delay: float | timedelta | None = None,
    retry_max_delay: float | timedelta | None = None,
    timeout: float | timedelta | None = None,
    concurrency: int | None = None,
    concurrency_key: str | None = None,
    throttle: dict[str, Any] | None = None,
    then: Any = None,
    on_dead_letter: Any = None,
    using: str | None = None,
) -> Job:
    """Create a job at revision 1. ``SCHEDULER_CONFLICT`` if the id is taken.

    ``then`` / ``on_dead_letter``: the jobs (ids, or ``{"job_id", "payload"}`` dicts) whose
    occurrence follows each of its occurrences that succeeds / is dead-lettered (see
    ``chains``); a job that does not exist, or a chain that leads back here, is refused.

    ``timeout`` (seconds or a timedelta; None: the handler's) is how long one run may take;
    it overrides the handler's and the ``DURABLE_SCHEDULER_HANDLER_TIMEOUT`` default.
    ``concurrency``: how many of its occurrences may run at once across every worker (None:
    no cap), per ``concurrency_key`` when given (a template on the payload, ``"{customer}"``,
    computed at enqueue). ``throttle``: ``{"limit", "period", "burst", "key"}``, how fast its
    occurrences may start across every worker (docs/design.md, "Throttles"; None: none).

    Without ``authority`` the job runs as the app's default principal, requesting its kind,
    which that principal's policy is made to grant (:func:`policies.grant_default`)."""
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
            "timeout": timeout,
            "concurrency": concurrency,
            "concurrency_key": concurrency_key,
            "throttle": throttle,
            "then": then,
            "on_dead_letter": on_dead_letter,
        },
        creating=True,
    )
    _check_retry_delays(fields["retry_base_delay_ms"], fields["retry_max_delay_ms"])
    now = conf.now()
    with write_transaction(using) as alias:
        if Job.objects.using(alias).filter(pk=job_id).exists():
            raise Conflict(f"job {job_id!r} already exists", {"job_id": job_id})
        _check_chain(job_id, fields, alias)
        job = Job(job_id=job_id, revision=1, created_at=now, updated_at=now, **fields)
        job.next_fire_at = initial_fire_time(job.trigger, now=now, anchor=now)
        # The first write: every argument has been checked by now.
        if job.authority is None:
            job.authority = _default_authority(job_id, job.kind, alias)
        else:
            _warn_without_policy(job_id, job.authority, alias)
        job.authority = _bind_current(job.authority, alias)
        try:
            with transaction.atomic(using=alias):
                job.save(using=alias, force_insert=True)
        except IntegrityError:
            if Job.objects.using(alias).filter(pk=job_id).exists():
                raise Conflict(f"job {job_id!r} already exists", {"job_id": job_id}) from None
            raise
        new_event(job_id, JOB_CREATED, now, data={"revision": 1, "kind": job.kind}).save(using=alias)
        _record_expired_one_off(job, now, now, alias)
    return job


def update_job(job_id: str, *, expected_revision: int, using: str | None = None, **changes: Any) -> Job:
    """Compare-and-set update: applies ``changes`` only if the job is at ``expected_revision``.

    A trigger change cancels (``superseded``) the queued/retry_wait occurrences that the
    old trigger materialized; explicitly enqueued ones keep their snapshot. ``authority=None``
    gives the job the default authority, as :func:`create_job` does.
    """
    job_id = normalize_identifier(job_id, "job_id")
    expected = normalize_int(expected_revision, "expected_revision", minimum=1, maximum=MAX_REVISION)
    if not changes:
        raise InvalidArgument("changes", "give at least one attribute to change")
    fields = _job_fields(changes, creating=False)
    now = conf.now()
    with write_transaction(using) as alias:
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
        if any(edge in fields for edge in EDGES):
            _check_chain(job_id, {edge: fields.get(edge, getattr(job, edge)) for edge in EDGES}, alias)
        if "kind" in fields and "authority" not in fields and _has_default_authority(job):
            fields["authority"] = None  # the default envelope requests the kind: follow it
        if "authority" in fields:
            if fields["authority"] is None:
                fields["authority"] = _default_authority(job_id, fields.get("kind", job.kind), alias)
            else:
                _warn_without_policy(job_id, fields["authority"], alias)
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
            _record_expired_one_off(job, after, now, alias)
        elif "enabled" in changed and job.enabled:
            superseded = _misfired_while_disabled(job, now, alias)
        _revision_event(job, expected, changed, now, alias, superseded=len(superseded))
    return job


def _revision_event(
    job: Job, previous: int, changed: list[str], now: datetime, alias: str, **data: Any
) -> None:
    """The ``job_updated`` event of a change that gave ``job`` its current revision."""
    new_event(
        job.job_id,
        JOB_UPDATED,
        now,
        data={"revision": job.revision, "previousRevision": previous, "changed": changed, **data},
    ).save(using=alias)


def _record_expired_one_off(job: Job, after: datetime, now: datetime, alias: str) -> None:
    """A one-off ``at`` already older than the catch-up window is accepted, but never fires:
    say so at once, as the scheduler would had it been running then."""
    skipped = expired_one_off(job.trigger, now=after)
    if skipped is not None:
        new_event(job.job_id, SLOT_SKIPPED, now, data=skipped.event_data()).save(using=alias)


def _pending_schedule(job: Job, alias: str) -> list[Occurrence]:
    """The job's pending occurrences that its schedule materialized, oldest slot first,
    locked (what a cancel of them reads)."""
    return list(
        Occurrence.objects.using(alias)
        .select_for_update()
        .filter(job=job, status__in=PENDING_STATUSES, trigger_key__startswith="schedule:")
        .order_by("scheduled_for", "pk")
        .only(*CANCEL_FIELDS)
    )


def _supersede_schedule(job: Job, now: datetime, alias: str) -> list[str]:
    return _cancel_schedule(_pending_schedule(job, alias), SUPERSEDED, now, alias)


def _misfired_while_disabled(job: Job, now: datetime, alias: str) -> list[str]:
    """On re-enabling, the schedule's pending occurrences that a running scheduler would not
    fire now under the job's misfire policy are cancelled (``misfired``): ``skip`` keeps the
    on-time ones; ``run_all`` those within the catch-up window; ``run_latest`` the on-time
    ones, and the newest late one within the window only when the schedule has no newer slot
    due (otherwise the scheduler fires that one). Occurrences enqueued explicitly keep
    waiting to run."""
    pending = _pending_schedule(job, alias)
    misfire = job.trigger.get("misfire", "run_latest")
    window = catchup_window(job.trigger)
    late = [row for row in pending if now - row.scheduled_for > MISFIRE_GRACE]
    if misfire == "run_all":
        late = [row for row in late if now - row.scheduled_for > window]
    elif misfire == "run_latest" and late and late[-1] == pending[-1]:
        newer_due = job.next_fire_at is not None and job.next_fire_at <= now
        if not newer_due and now - late[-1].scheduled_for <= window:
            late = late[:-1]
    return _cancel_schedule(late, MISFIRED, now, alias)


def _cancel_schedule(pending: list[Occurrence], reason: str, now: datetime, alias: str) -> list[str]:
    # The rows were selected (and locked) pending: the cancel transition's source.
    cancel_pending(pending, reason, now, alias)
    return [row.pk for row in pending]


def set_declared_in(job_id: str, app: str | None, *, using: str | None = None) -> None:
    """Record which installed app's code declares the job (``declared.py``'s sync)."""
    Job.objects.using(alias_for(using)).filter(pk=job_id).exclude(declared_in=app).update(declared_in=app)


def declared_jobs_of(apps: list[str], *, using: str | None = None) -> list[tuple[str, str]]:
    """The enabled jobs that these apps declared: ``(job_id, app)``."""
    rows = Job.objects.using(alias_for(using)).filter(enabled=True, declared_in__in=apps).order_by("job_id")
    return [(job_id, str(app)) for job_id, app in rows.values_list("job_id", "declared_in")]


def undeclare_job(job_id: str, app: str, *, using: str | None = None) -> bool:
    """Disable a job that ``app`` declared and no longer does; it becomes an ordinary job
    (an operator may enable it again, and no sync disables it after). False if it was not
    (any more) an enabled job of ``app``."""
    now = conf.now()
    with write_transaction(using) as alias:
        job = Job.objects.using(alias).select_for_update().filter(pk=job_id).first()
        if job is None or not job.enabled or job.declared_in != app:
            return False
        job.enabled = False
        job.declared_in = None
        job.revision += 1
        job.updated_at = now
        job.save(using=alias, update_fields=["enabled", "declared_in", "revision", "updated_at"])
        _revision_event(
            job, job.revision - 1, ["enabled"], now, alias, superseded=0, reason="undeclared", declaredIn=app
        )
    return True
