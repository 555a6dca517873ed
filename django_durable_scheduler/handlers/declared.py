"""Jobs declared in code, and their synchronization into the database.

Declare a job next to its handler, or several jobs of one kind with :func:`declare_job`::

    @scheduler.handler("reports.send-daily", job={"trigger": {"cron": "0 9 * * *"}, "authority": ...})
    def send_daily(ctx): ...

    scheduler.declare_job("reports.send-daily.eu", "reports.send-daily", authority=..., payload={...})

:func:`sync_declared_jobs` (``manage.py scheduler_sync``) creates the declared jobs that do
not exist yet and updates, through ``kernel.update_job`` (revision check, validation, event),
those whose stored definition differs from the declaration. It never deletes a job.

The declaration is the source of truth for every attribute it covers, omitted ones
included (they mean the same default as ``create_job``): a change made elsewhere (say,
disabling the job in the admin) is undone by the next sync. One exception: the authority's
``schedulerPolicyRevision`` binding is kept when the declaration does not give one, so that
syncing never unbinds a job from its principal's policy.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps

from .. import conf
from ..exceptions import Conflict, InvalidArgument, NotFound, RevisionConflict
from ..rules.authority import Envelope, default_authority, normalize_authority
from ..rules.chains import EDGES, jobs_named, normalize_specs
from ..rules.identity import canonical_json, normalize_json
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
    retry_delays_ms,
    retry_max_delay_ms,
    timeout_ms,
)

if TYPE_CHECKING:
    from ..models import Job

logger = logging.getLogger("django_durable_scheduler")

# A concurrent sync (another worker starting) can create or update the job between our read
# and our write; then we read again and compare with what it wrote.
_SYNC_ATTEMPTS = 5

FIELDS = (
    "trigger",
    "authority",
    "payload",
    "enabled",
    "max_attempts",
    "retry_base_delay",
    "retry_max_delay",
    "timeout",
    "concurrency",
    "concurrency_key",
    "throttle",
    "then",
    "on_dead_letter",
)


@dataclass(frozen=True)
class DeclaredJob:
    """A normalized job declaration. ``None`` retry delays follow the settings at sync time."""

    job_id: str
    kind: str
    authority: Envelope | None  # None: the app's default principal (create_job's default)
    trigger: dict[str, Any]
    payload: Any
    enabled: bool
    max_attempts: int
    retry_base_delay_ms: int | None
    retry_max_delay_ms: int | None
    timeout_ms: int | None = None  # None: the handler's (or the setting's)
    # The module that declares it; its app owns the job (a sync disables what it stops declaring).
    module: str | None = None
    # Its follow-ups (chains.py): the jobs that follow each occurrence that succeeds / dies.
    then: list[dict[str, Any]] | None = None
    on_dead_letter: list[dict[str, Any]] | None = None
    # How many of its occurrences run at once (None: no cap), per its key template if given.
    concurrency: int | None = None
    concurrency_key: str | None = None
    # How fast its occurrences may start (rules/throttles.py, as the job stores it; None: none).
    throttle: dict[str, Any] | None = None


_declared: dict[str, DeclaredJob] = {}
_lock = threading.Lock()


def _declaration(job_id: Any, kind: Any, fields: Mapping[str, Any], prefix: str) -> DeclaredJob:
    unknown = sorted(key_label(key) for key in fields if key not in FIELDS)
    if unknown:
        raise InvalidArgument(f"{prefix}{unknown[0]}", f"is not a job attribute (known: {', '.join(FIELDS)})")
    base_ms, max_ms = retry_delays_ms(fields.get("retry_base_delay"), fields.get("retry_max_delay"), prefix)
    trigger = fields.get("trigger")
    return DeclaredJob(
        job_id=normalize_identifier(job_id, f"{prefix}job_id"),
        kind=normalize_identifier(kind, "kind", max_length=128),
        authority=None
        if fields.get("authority") is None
        else normalize_authority(fields["authority"], f"{prefix}authority"),
        trigger=validate_trigger({} if trigger is None else trigger, f"{prefix}trigger"),
        payload=normalize_json(fields.get("payload"), f"{prefix}payload"),
        enabled=normalize_bool(fields.get("enabled", True), f"{prefix}enabled"),
        max_attempts=normalize_int(
            fields.get("max_attempts", 3), f"{prefix}max_attempts", minimum=1, maximum=MAX_ATTEMPTS_LIMIT
        ),
        retry_base_delay_ms=base_ms,
        retry_max_delay_ms=max_ms,
        timeout_ms=timeout_ms(fields.get("timeout"), f"{prefix}timeout"),
        concurrency=normalize_limit(fields.get("concurrency"), f"{prefix}concurrency"),
        concurrency_key=normalize_template(fields.get("concurrency_key"), f"{prefix}concurrency_key"),
        throttle=stored_throttle(fields.get("throttle"), f"{prefix}throttle"),
        then=normalize_specs(fields.get("then"), f"{prefix}then", nested=False),
        on_dead_letter=normalize_specs(fields.get("on_dead_letter"), f"{prefix}on_dead_letter", nested=False),
    )


def declaration_from_handler(kind: str, job: Any) -> DeclaredJob:
    """Validate the ``job=`` dict of ``@scheduler.handler(kind, job=...)``."""
    if not isinstance(job, Mapping):
        raise InvalidArgument("job", f"must be a dict declaring the job, not {type(job).__name__}")
    fields = {key: value for key, value in job.items() if key != "job_id"}
    return _declaration(job.get("job_id", kind), kind, fields, "job.")


def add_declaration(declaration: DeclaredJob) -> None:
    """Record a declaration. The same one again is fine (a module imported twice); another
    definition under the same job id is refused."""
    with _lock:
        existing = _declared.get(declaration.job_id)
        if existing is not None and existing != declaration:
            raise InvalidArgument(
                "job_id",
                f"job {declaration.job_id!r} is already declared with another definition "
                f"(kind {existing.kind!r})",
            )
        _declared[declaration.job_id] = declaration


def declare_job(
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
    module: str | None = None,
) -> DeclaredJob:
    """Declare a job in code (created or updated by ``manage.py scheduler_sync``).

    The arguments are those of ``create_job`` (``concurrency``: how many of the job's
    occurrences run at once on every worker, per ``concurrency_key``, a template on the
    payload, when given; ``throttle``: how fast they may start); the declaration is validated now, so a bad
    one fails where it is written. Returns the normalized declaration. The calling module's
    app (or ``module``'s, for a helper that declares on its caller's behalf) owns the job:
    once that app stops declaring it, a sync disables it.
    """
    declaration = _declaration(
        job_id,
        kind,
        {
            "authority": authority,
            "trigger": trigger,
            "payload": payload,
            "enabled": enabled,
            "max_attempts": max_attempts,
            "retry_base_delay": retry_base_delay,
            "retry_max_delay": retry_max_delay,
            "timeout": timeout,
            "concurrency": concurrency,
            "concurrency_key": concurrency_key,
            "throttle": throttle,
            "then": then,
            "on_dead_letter": on_dead_letter,
        },
        "",
    )
    caller = module or sys._getframe(1).f_globals.get("__name__")  # the declaring module, for its app
    declaration = replace(declaration, module=caller if isinstance(caller, str) else None)
    add_declaration(declaration)
    return declaration


def declared_jobs() -> list[DeclaredJob]:
    """Every declared job, by job id."""
    with _lock:
        return [_declared[job_id] for job_id in sorted(_declared)]


def undeclare(job_id: str) -> None:
    """Forget a declaration (the job itself stays in the database)."""
    with _lock:
        _declared.pop(job_id, None)


def forget_kind(kind: str) -> None:
    """Forget every job declared for ``kind`` (``registry.unregister`` calls this)."""
    with _lock:
        for job_id in [job_id for job_id, d in _declared.items() if d.kind == kind]:
            del _declared[job_id]


# --------------------------------------------------------------------------- sync


def _canonical_or_none(normalize: Callable[[Any], Any], value: Any) -> str | None:
    """The canonical JSON of a stored value after normalizing; None if it no longer validates
    (then it differs from any valid declaration)."""
    try:
        return canonical_json(normalize(value))
    except InvalidArgument:
        return None


def _authority_for(declaration: DeclaredJob, stored: Any) -> Envelope:
    """The declared envelope (or the default one), keeping the stored policy binding when it
    names none."""
    declared = declaration.authority
    if declared is None:
        declared = default_authority(declaration.kind, conf.settings.DEFAULT_PRINCIPAL)
    stored_refs = stored.get("authorizationRefs") if isinstance(stored, dict) else None
    bound = stored_refs.get("schedulerPolicyRevision") if isinstance(stored_refs, dict) else None
    if "schedulerPolicyRevision" in declared["authorizationRefs"] or bound is None:
        return declared
    # The stored binding, as it is: checked again with the declared envelope.
    refs = {**declared["authorizationRefs"], "schedulerPolicyRevision": bound}
    return normalize_authority({**declared, "authorizationRefs": refs})


def changes_for(declaration: DeclaredJob, job: Job) -> dict[str, Any]:
    """The ``update_job`` changes that bring ``job`` to ``declaration`` (empty: unchanged)."""
    changes: dict[str, Any] = {}
    if job.kind != declaration.kind:
        changes["kind"] = declaration.kind
    if _canonical_or_none(validate_trigger, job.trigger) != canonical_json(declaration.trigger):
        changes["trigger"] = declaration.trigger
    if _canonical_or_none(lambda value: value, job.payload) != canonical_json(declaration.payload):
        changes["payload"] = declaration.payload
    authority = _authority_for(declaration, job.authority)
    if _canonical_or_none(normalize_authority, job.authority) != canonical_json(authority):
        # None lets update_job grant the default principal the kind, as create_job does.
        changes["authority"] = None if declaration.authority is None else authority
    if job.enabled != declaration.enabled:
        changes["enabled"] = declaration.enabled
    if job.max_attempts != declaration.max_attempts:
        changes["max_attempts"] = declaration.max_attempts
    # Omitted delays mean what create_job would store: the settings, as it reads them.
    base_ms = declaration.retry_base_delay_ms
    if base_ms is None:
        base_ms = retry_base_delay_ms(conf.settings.RETRY_BASE_DELAY, "DURABLE_SCHEDULER_RETRY_BASE_DELAY")
    max_ms = declaration.retry_max_delay_ms
    if max_ms is None:
        max_ms = retry_max_delay_ms(conf.settings.RETRY_MAX_DELAY, "DURABLE_SCHEDULER_RETRY_MAX_DELAY")
    # Both together when either changes: update_job checks max >= base on the pair.
    if job.retry_base_delay_ms != base_ms or job.retry_max_delay_ms != max_ms:
        changes["retry_base_delay"] = timedelta(milliseconds=base_ms)
        changes["retry_max_delay"] = timedelta(milliseconds=max_ms)
    for edge in EDGES:
        if canonical_json(getattr(job, edge)) != canonical_json(getattr(declaration, edge)):
            changes[edge] = getattr(declaration, edge)
    for name in ("concurrency", "concurrency_key", "throttle"):
        if getattr(job, name) != getattr(declaration, name):
            changes[name] = getattr(declaration, name)
    if job.timeout_ms != declaration.timeout_ms:
        changes["timeout"] = (
            None if declaration.timeout_ms is None else timedelta(milliseconds=declaration.timeout_ms)
        )
    return changes


def _sync_one(declaration: DeclaredJob, using: str | None) -> str:
    # Imported here: the kernel needs the models, and declarations are made while modules
    # import, before the app registry is ready.
    from .. import kernel

    for _ in range(_SYNC_ATTEMPTS):
        try:
            job = kernel.get_job(declaration.job_id, using=using)
        except NotFound:
            authority = declaration.authority
            try:
                kernel.create_job(
                    declaration.job_id,
                    declaration.kind,
                    authority=authority,
                    trigger=declaration.trigger,
                    payload=declaration.payload,
                    enabled=declaration.enabled,
                    max_attempts=declaration.max_attempts,
                    retry_base_delay=None
                    if declaration.retry_base_delay_ms is None
                    else timedelta(milliseconds=declaration.retry_base_delay_ms),
                    retry_max_delay=None
                    if declaration.retry_max_delay_ms is None
                    else timedelta(milliseconds=declaration.retry_max_delay_ms),
                    timeout=None
                    if declaration.timeout_ms is None
                    else timedelta(milliseconds=declaration.timeout_ms),
                    concurrency=declaration.concurrency,
                    concurrency_key=declaration.concurrency_key,
                    throttle=declaration.throttle,
                    then=declaration.then,
                    on_dead_letter=declaration.on_dead_letter,
                    using=using,
                )
            except Conflict:
                continue  # created meanwhile by another process: compare with that
            return "created"
        changes = changes_for(declaration, job)
        if not changes:
            return "unchanged"
        try:
            kernel.update_job(declaration.job_id, expected_revision=job.revision, using=using, **changes)
        except RevisionConflict:
            continue  # changed meanwhile: compare again
        return "updated"
    raise Conflict(
        f"job {declaration.job_id!r} kept changing while it was being synced; try again",
        {"job_id": declaration.job_id},
    )


def sync_declared_jobs(using: str | None = None) -> dict[str, list[str]]:
    """Create the declared jobs that are missing, update the ones that differ, and disable
    the ones an installed app declared before and declares no more.

    Returns ``{"created": [...], "updated": [...], "unchanged": [...], "disabled": [...]}``
    (job ids). Each job is its own kernel transaction; a job that changes only gets a new
    revision. A disabled job keeps its history and its pending occurrences (they wait); it
    becomes an ordinary job, no longer owned by the code. Jobs of apps this process does not
    install are left alone: another deployment may declare them.
    """
    from .. import kernel

    result: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "disabled": []}
    declarations = followed_first(declared_jobs())
    for declaration in declarations:
        result[_sync_one(declaration, using)].append(declaration.job_id)
        kernel.set_declared_in(declaration.job_id, _app_of(declaration.module), using=using)
    installed = [config.label for config in apps.get_app_configs()]
    still = {declaration.job_id for declaration in declarations}
    for job_id, app in kernel.declared_jobs_of(installed, using=using):
        if job_id in still:
            continue
        if kernel.undeclare_job(job_id, app, using=using):
            logger.warning(
                "job %s is no longer declared by app %s: disabled (its pending occurrences wait; "
                "enable it in the admin or delete it)",
                job_id,
                app,
            )
            result["disabled"].append(job_id)
    return result


def followed_first(declarations: list[DeclaredJob]) -> list[DeclaredJob]:
    """``declarations`` with every job another one's follow-ups name before that one, so that
    a sync creates it first (the kernel refuses a follow-up job that does not exist). Declared
    follow-ups that lead back to their job are refused here, naming the cycle."""
    by_id = {declaration.job_id: declaration for declaration in declarations}
    ordered: list[DeclaredJob] = []
    placed: set[str] = set()
    path: list[str] = []

    def place(declaration: DeclaredJob) -> None:
        if declaration.job_id in placed:
            return
        if declaration.job_id in path:
            cycle = [*path[path.index(declaration.job_id) :], declaration.job_id]
            raise InvalidArgument(
                "then", f"makes a cycle of follow-ups: {' -> '.join(cycle)}", {"cycle": cycle}
            )
        path.append(declaration.job_id)
        for job_id in sorted(jobs_named({edge: getattr(declaration, edge) for edge in EDGES})):
            if job_id in by_id:
                place(by_id[job_id])
        path.pop()
        placed.add(declaration.job_id)
        ordered.append(declaration)

    for declaration in declarations:
        place(declaration)
    return ordered


def _app_of(module: str | None) -> str | None:
    """The label of the installed app that holds ``module``, or None."""
    config = apps.get_containing_app_config(module) if module else None
    return None if config is None else config.label
