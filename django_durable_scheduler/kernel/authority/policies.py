"""Authority policies: what a principal may do and how much of it per window.

A policy belongs to one principal (``principal_type``, ``principal_id``). Every change is
compare-and-set on the policy's revision, bumps it, appends the new revision's full content
to the policy history table, and -- in the same transaction -- rebinds the principal's jobs
and pending occurrences that the new policy still covers to the new revision
(``binding.py``). Those whose
grant the change took away keep their old binding: they are stale now, and the worker
denies them ``policy_stale``. Those never granted (unbound, or bound to a previous revision
that lacked a capability too) move to the new revision, where the worker denies them
``permission_denied`` with the missing capabilities.

Lock order (PostgreSQL, MySQL/MariaDB): policy row, then job rows, then occurrence rows.
Reservations (``reservations.py``) lock the policy row (a claim's shared, on PostgreSQL)
before the occurrence row and the usage row after it, and the
kernel locks occurrences before reservations, so no two of these can wait on each other in
a cycle. Readers that only need the current revision (``bind_to_current_policy``) read the
policy row without locking it. SQLite has one writer at a time (``dialect.write_transaction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, OperationalError, connections, transaction

from ... import conf
from ...db.dialect import alias_for, column_max, is_deadlock, write_transaction
from ...exceptions import AuthorityPolicyConflict, InvalidArgument
from ...models import AuthorityPolicy, AuthorityPolicyRevision
from ...rules.authority import (
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_UNITS,
    DEFAULT_WINDOW_MS,
    MAX_BUDGET,
    MAX_WINDOW_MS,
    MIN_WINDOW_MS,
    Envelope,
    Principal,
    bind,
    normalize_authority,
    normalize_capabilities,
)
from ...rules.throttles import stored_throttle
from ...rules.validation import (
    MAX_IDENTIFIER_LENGTH,
    normalize_bool,
    normalize_identifier,
    normalize_int,
    normalize_limit,
    to_duration_ms,
)
from .binding import rebind

MAX_HISTORY_LIMIT = 1000
MAX_REVISION = column_max(AuthorityPolicy, "revision")


@dataclass(frozen=True)
class PolicyChange:
    """What one ``set_policy`` did: the policy as saved, and how many of the principal's
    jobs and pending (queued/retry_wait) occurrences were rebound to the new revision
    versus left stale: not covered (a capability not granted, or the policy is disabled),
    so the worker will deny them."""

    policy: AuthorityPolicy
    previous_revision: int  # 0: the policy was created
    rebound_jobs: int
    stale_jobs: int
    rebound_occurrences: int
    stale_occurrences: int

    @property
    def created(self) -> bool:
        return self.previous_revision == 0

    def counts(self) -> dict[str, int]:
        return {
            "rebound_jobs": self.rebound_jobs,
            "stale_jobs": self.stale_jobs,
            "rebound_occurrences": self.rebound_occurrences,
            "stale_occurrences": self.stale_occurrences,
        }


# --------------------------------------------------------------------------- validation


def _window_ms(window: Any, field: str = "window") -> int:
    return to_duration_ms(window, field, minimum_ms=MIN_WINDOW_MS, maximum_ms=MAX_WINDOW_MS)


def _budget(value: Any, field: str) -> int | None:
    """A limit per window, or None: no limit on that count."""
    return None if value is None else normalize_int(value, field, minimum=1, maximum=MAX_BUDGET)


def policy_content(policy: AuthorityPolicy) -> dict[str, Any]:
    """A revision's full content, as the history table stores it (``max_running`` only when
    set, so that revisions from before it existed read the same)."""
    content = {
        "principal": Principal.of_row(policy).as_dict(),
        "revision": policy.revision,
        "enabled": policy.enabled,
        "capabilities": list(policy.capabilities),
        "window_ms": policy.window_ms,
        "max_runs": policy.max_runs,
        "max_units": policy.max_units,
    }
    if policy.max_running is not None:
        content["max_running"] = policy.max_running
    if policy.throttle is not None:
        content["throttle"] = policy.throttle
    return content


# --------------------------------------------------------------------------- reading


def get_policy(principal_type: str, principal_id: str, *, using: str | None = None) -> AuthorityPolicy | None:
    """The principal's policy, or None. A backfilled policy with no capabilities reads fine."""
    return _policy_of(Principal.parse((principal_type, principal_id)), alias_for(using))


def _policy_of(principal: Principal, alias: str) -> AuthorityPolicy | None:
    return AuthorityPolicy.objects.using(alias).filter(**principal.columns()).first()


def policy_history(
    principal_type: str, principal_id: str, limit: int = 50, *, using: str | None = None
) -> list[AuthorityPolicyRevision]:
    """The principal's policy revisions, newest first."""
    principal = Principal.parse((principal_type, principal_id))
    limit = normalize_int(limit, "limit", minimum=1, maximum=MAX_HISTORY_LIMIT)
    return list(
        AuthorityPolicyRevision.objects.using(alias_for(using))
        .filter(**principal.columns())
        .order_by("-revision")[:limit]
    )


# --------------------------------------------------------------------------- writing


def lock_policy(principal: Principal, alias: str) -> AuthorityPolicy | None:
    """The principal's policy row, locked: the lock that serializes the changes of one
    principal's policy and the reservations charged to it (module docstring)."""
    return AuthorityPolicy.objects.using(alias).select_for_update().filter(**principal.columns()).first()


def _conflict(principal: Principal, expected: int, actual: int) -> AuthorityPolicyConflict:
    return AuthorityPolicyConflict(
        f"authority policy {principal.label} is at revision {actual}, not {expected}",
        {
            **principal.columns(),
            "expected_revision": expected,
            "actual_revision": actual,
        },
    )


def change_policy(
    principal_type: str,
    principal_id: str,
    *,
    capabilities: Any,
    window: float | timedelta,
    max_runs: int | None = None,
    max_units: int | None = None,
    enabled: bool = True,
    expected_revision: int | None = None,
    changed_by: str | None = None,
    max_running: int | None = None,
    throttle: dict[str, Any] | None = None,
    using: str | None = None,
) -> PolicyChange:
    """:func:`set_policy`, returning what the change did (:class:`PolicyChange`)."""
    alias = alias_for(using)
    change = _validated_change(
        principal_type,
        principal_id,
        capabilities=capabilities,
        window=window,
        max_runs=max_runs,
        max_units=max_units,
        enabled=enabled,
        expected_revision=expected_revision,
        changed_by=changed_by,
        max_running=max_running,
        throttle=throttle,
    )
    # A deadlock aborts the whole transaction; retry only when this call owns it.
    retries = 0 if connections[alias].in_atomic_block else 3
    while True:
        try:
            return _change_policy(change, alias)
        except OperationalError as exc:
            if retries <= 0 or not is_deadlock(exc):
                raise
            retries -= 1


@dataclass(frozen=True)
class _Change:
    """One validated ``change_policy`` request."""

    principal: Principal
    capabilities: list[str]
    window_ms: int
    max_runs: int | None
    max_units: int | None
    enabled: bool
    expected: int | None  # the compare-and-set revision, if any
    actor: str | None
    max_running: int | None = None
    throttle: dict[str, Any] | None = None


def _validated_change(
    principal_type: Any,
    principal_id: Any,
    *,
    capabilities: Any,
    window: Any,
    max_runs: Any,
    max_units: Any,
    enabled: Any,
    expected_revision: Any,
    changed_by: Any,
    max_running: Any = None,
    throttle: Any = None,
) -> _Change:
    return _Change(
        principal=Principal.parse((principal_type, principal_id)),
        capabilities=normalize_capabilities(capabilities, "capabilities"),
        window_ms=_window_ms(window),
        max_runs=_budget(max_runs, "max_runs"),
        max_units=_budget(max_units, "max_units"),
        enabled=normalize_bool(enabled, "enabled"),
        expected=None
        if expected_revision is None
        else normalize_int(expected_revision, "expected_revision", minimum=0, maximum=MAX_REVISION),
        actor=None if changed_by is None else normalize_identifier(changed_by, "changed_by"),
        max_running=normalize_limit(max_running, "max_running"),
        throttle=stored_throttle(throttle, "throttle", keyed=False),
    )


def _insert_policy(change: _Change, now: datetime, alias: str) -> tuple[AuthorityPolicy, int]:
    """Create the principal's first revision: (the policy, 0). When another transaction
    created it meanwhile, an unconditional change gets (the winner's row, locked, its
    revision) to apply on top of; a compare-and-set one has lost."""
    principal = change.principal
    policy = AuthorityPolicy(
        **principal.columns(),
        revision=1,
        enabled=change.enabled,
        capabilities=change.capabilities,
        window_ms=change.window_ms,
        max_runs=change.max_runs,
        max_units=change.max_units,
        max_running=change.max_running,
        throttle=change.throttle,
        created_at=now,
        updated_at=now,
    )
    try:
        with transaction.atomic(using=alias):
            policy.save(using=alias, force_insert=True)
    except IntegrityError:
        # Another transaction created it first (PostgreSQL/MySQL wait for it to
        # commit, then report the duplicate). A compare-and-set lost: read the
        # winner's revision without locking it -- on MySQL every loser of the insert
        # holds a shared lock on the new row until it ends, so two losers asking for
        # the exclusive lock would deadlock.
        if change.expected is not None:
            raced = (
                AuthorityPolicy.objects.using(alias)
                .filter(**principal.columns())
                .values_list("revision", flat=True)
                .first()
            )
            raise _conflict(principal, change.expected, raced or 0) from None
        # An unconditional change applies on top of the winner's (a MySQL deadlock
        # between two such losers is retried by ``change_policy``).
        locked = lock_policy(principal, alias)
        if locked is None:
            raise
        return locked, locked.revision
    return policy, 0


def _keep_unrecorded_revision(policy: AuthorityPolicy, alias: str) -> None:
    """A revision written without history (the v2 backfill): keep it before it is replaced,
    so the history can show what this change changed."""
    columns = Principal.of_row(policy).columns()
    revisions = AuthorityPolicyRevision.objects.using(alias).filter(**columns)
    if not revisions.filter(revision=policy.revision).exists():
        AuthorityPolicyRevision.objects.using(alias).create(
            **columns,
            revision=policy.revision,
            content=policy_content(policy),
            changed_by=None,
            changed_at=policy.updated_at,
        )


def _replace_policy(policy: AuthorityPolicy, change: _Change, now: datetime, alias: str) -> None:
    """Write ``change`` as the next revision of an existing policy."""
    policy.revision += 1
    policy.enabled = change.enabled
    policy.capabilities = change.capabilities
    policy.window_ms = change.window_ms
    policy.max_runs = change.max_runs
    policy.max_units = change.max_units
    policy.max_running = change.max_running
    policy.throttle = change.throttle
    policy.updated_at = now
    policy.save(
        using=alias,
        update_fields=[
            "revision",
            "enabled",
            "capabilities",
            "window_ms",
            "max_runs",
            "max_units",
            "max_running",
            "throttle",
            "updated_at",
        ],
    )


def _change_policy(change: _Change, alias: str) -> PolicyChange:
    principal = change.principal
    now = conf.now()
    with write_transaction(alias):
        policy = lock_policy(principal, alias)
        previous = 0 if policy is None else policy.revision
        if change.expected is not None and change.expected != previous:
            raise _conflict(principal, change.expected, previous)
        if policy is None:
            policy, previous = _insert_policy(change, now, alias)
        # What the previous revision granted, before the change below overwrites it.
        before = None
        if previous:
            before = AuthorityPolicy(
                revision=previous, enabled=policy.enabled, capabilities=list(policy.capabilities)
            )
            _keep_unrecorded_revision(policy, alias)
            _replace_policy(policy, change, now, alias)
        AuthorityPolicyRevision.objects.using(alias).create(
            **principal.columns(),
            revision=policy.revision,
            content=policy_content(policy),
            changed_by=change.actor,
            changed_at=now,
        )
        counts = rebind(
            principal,
            enabled=change.enabled,
            capabilities=change.capabilities,
            alias=alias,
            rebind_to=policy.revision,
            before=before,
        )
    return PolicyChange(
        policy=policy,
        previous_revision=previous,
        rebound_jobs=counts["rebound_jobs"],
        stale_jobs=counts["stale_jobs"],
        rebound_occurrences=counts["rebound_occurrences"],
        stale_occurrences=counts["stale_occurrences"],
    )


def set_policy(
    principal_type: str,
    principal_id: str,
    *,
    capabilities: Any,
    window: float | timedelta,
    max_runs: int | None = None,
    max_units: int | None = None,
    enabled: bool = True,
    expected_revision: int | None = None,
    changed_by: str | None = None,
    max_running: int | None = None,
    throttle: dict[str, Any] | None = None,
    using: str | None = None,
) -> AuthorityPolicy:
    """Create or replace the principal's policy (``docs/design.md``, "Authority checks").

    ``max_runs`` / ``max_units``: the budget, runs and units per ``window`` (1..1,000,000;
    None: no limit). With neither, no budget applies: runs are not charged nor reserved.
    ``max_running``: how many of the principal's occurrences may run at once across every
    worker (1..10,000; None: no cap). ``throttle``: how fast they may start across every
    worker, ``{"limit": 100, "period": 5, "burst": 20}`` (no ``key``: it counts all the
    principal's runs; None: no throttle); work over the rate waits in the queue.

    ``expected_revision`` makes it compare-and-set (0: the policy must not exist yet);
    a mismatch raises ``SCHEDULER_AUTHORITY_POLICY_CONFLICT`` with ``expected_revision``
    and ``actual_revision``. The returned policy carries ``.change``, the
    :class:`PolicyChange` (rebound/stale counts); :func:`change_policy` returns it directly.
    """
    change = change_policy(
        principal_type,
        principal_id,
        capabilities=capabilities,
        window=window,
        max_runs=max_runs,
        max_units=max_units,
        enabled=enabled,
        expected_revision=expected_revision,
        changed_by=changed_by,
        max_running=max_running,
        throttle=throttle,
        using=using,
    )
    policy = change.policy
    policy.change = change  # type: ignore[attr-defined]
    return policy


def ensure_policy(
    authority: Envelope | dict[str, Any],
    *,
    window: float | timedelta = timedelta(milliseconds=DEFAULT_WINDOW_MS),
    max_runs: int | None = DEFAULT_MAX_RUNS,
    max_units: int | None = DEFAULT_MAX_UNITS,
    changed_by: str | None = None,
    using: str | None = None,
) -> AuthorityPolicy:
    """The envelope principal's policy; when it has none, create one granting exactly the
    envelope's requested capabilities, with no budget unless ``max_runs``/``max_units`` give
    one. An existing policy is returned unchanged (never
    widened). An envelope that requests no capability cannot create a policy (a policy
    lists 1..256 capabilities): ``authority.requestedCapabilities`` is refused."""
    envelope = normalize_authority(authority, "authority")
    window_ms = _window_ms(window)
    runs = _budget(max_runs, "max_runs")
    units = _budget(max_units, "max_units")
    actor = None if changed_by is None else normalize_identifier(changed_by, "changed_by")
    principal = Principal.of(envelope)
    existing = get_policy(*principal, using=using)
    if existing is not None:
        return existing
    if not envelope["requestedCapabilities"]:
        raise InvalidArgument(
            "authority.requestedCapabilities",
            "must request at least one capability to create a default policy (use set_policy)",
        )
    try:
        return set_policy(
            *principal,
            capabilities=envelope["requestedCapabilities"],
            window=timedelta(milliseconds=window_ms),
            max_runs=runs,
            max_units=units,
            expected_revision=0,
            changed_by=actor,
            using=using,
        )
    except AuthorityPolicyConflict:
        raced = get_policy(*principal, using=using)
        if raced is None:
            raise
        return raced


def bind_to_current_policy(authority: Envelope | dict[str, Any], using: str | None = None) -> Envelope:
    """Bind a normalized envelope to its principal's current policy revision whenever the
    principal has a policy, covered or not: then a capability the policy
    lacks is denied ``permission_denied`` with the missing list, and a later change that
    grants it rebinds the envelope. Without a policy it is returned as given (denied
    ``policy_required`` until a policy exists; ``set_policy`` binds it then). For
    ``create_job``/``update_job``, inside their transaction.

    The policy row is read without a lock: ``set_policy`` locks the policy before the job
    rows, so locking it here, after the job row, could deadlock. A concurrent ``set_policy``
    waits for the job row lock and then rebinds the job itself.
    """
    envelope = normalize_authority(authority, "authority")
    policy = _policy_of(Principal.of(envelope), alias_for(using))
    if policy is None:
        return envelope
    return bind(envelope, policy.revision)


# Concurrent first uses of the default principal race to create or widen its policy.
_GRANT_ATTEMPTS = 5
_GRANT_NOTE = "durable_scheduler: job {} has no authority envelope"


def _grant_note(job_id: str) -> str:
    """The history's ``changed_by`` for a default grant. A job id may take the column's whole
    length, so a long one is cut to fit: the job must not be refused for its note."""
    room = MAX_IDENTIFIER_LENGTH - len(_GRANT_NOTE.format(""))
    return _GRANT_NOTE.format(job_id if len(job_id) <= room else job_id[: room - 3] + "...")


def grant_default(capability: str, *, job_id: str, using: str | None = None) -> AuthorityPolicy:
    """The default principal's policy (``DURABLE_SCHEDULER_DEFAULT_PRINCIPAL``), granting
    ``capability``: created on first use with no budget (nobody configured one, so it holds
    no work back), widened when a job is
    created without an authority envelope for a kind it does not grant yet. Such a job's
    author asked for no restriction; an operator restricts it in the admin, and an explicit
    envelope stays fail-closed."""
    principal = Principal.parse_dict(conf.settings.DEFAULT_PRINCIPAL, "DURABLE_SCHEDULER_DEFAULT_PRINCIPAL")
    for _ in range(_GRANT_ATTEMPTS):
        with write_transaction(using) as alias:
            # A locking read sees the latest policy even in a repeatable-read snapshot (MySQL).
            policy = lock_policy(principal, alias)
        if policy is not None and capability in (policy.capabilities or []):
            return policy
        try:
            return set_policy(
                *principal,
                capabilities=sorted({*(policy.capabilities if policy else []), capability}),
                window=timedelta(milliseconds=policy.window_ms if policy else DEFAULT_WINDOW_MS),
                max_runs=policy.max_runs if policy else DEFAULT_MAX_RUNS,
                max_units=policy.max_units if policy else DEFAULT_MAX_UNITS,
                max_running=policy.max_running if policy else None,
                throttle=policy.throttle if policy else None,
                enabled=policy.enabled if policy else True,
                expected_revision=policy.revision if policy else 0,
                changed_by=_grant_note(job_id),
                using=using,
            )
        except AuthorityPolicyConflict:
            continue
    raise AuthorityPolicyConflict(
        f"the default principal's policy kept changing while granting {capability!r}",
        {**principal.details(), "capability": capability},
    )
