"""Authority policies: what a principal may do and how much of it per window.

A policy belongs to one principal (``principal_type``, ``principal_id``). Every change is
compare-and-set on the policy's revision, bumps it, appends the new revision's full content
to the policy history table, and -- in the same transaction -- rebinds the principal's jobs
and pending occurrences that the new policy still covers to the new revision. Those whose
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

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, OperationalError, connections, transaction

from .. import conf
from ..db.dialect import alias_for, write_transaction
from ..exceptions import AuthorityPolicyConflict, InvalidArgument
from ..models import (
    PENDING_STATUSES,
    AuthorityPolicy,
    AuthorityPolicyRevision,
    AuthorityUsage,
    Job,
    Occurrence,
)
from ..rules.authority import (
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_UNITS,
    DEFAULT_WINDOW_MS,
    MAX_BUDGET,
    MAX_WINDOW_MS,
    MIN_WINDOW_MS,
    bind,
    bound_revision,
    missing_capabilities,
    normalize_authority,
    normalize_capabilities,
    normalize_principal,
    principal_key,
)
from ..rules.validation import (
    MAX_IDENTIFIER_LENGTH,
    column_max,
    from_ms,
    normalize_bool,
    normalize_identifier,
    normalize_int,
    normalize_limit,
    to_duration_ms,
    to_ms,
)

# Rows read (and locked) per batch while rebinding: memory stays bounded by this.
REBIND_BATCH = 500
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


@dataclass(frozen=True)
class WindowUsage:
    """A policy's usage in the window that contains ``now``."""

    principal_type: str
    principal_id: str
    policy_revision: int
    window_started_at: datetime
    window_ends_at: datetime
    runs: int
    units: int
    max_runs: int
    max_units: int

    @property
    def remaining_runs(self) -> int:
        return max(0, self.max_runs - self.runs)

    @property
    def remaining_units(self) -> int:
        return max(0, self.max_units - self.units)


# --------------------------------------------------------------------------- validation


def _principal(principal_type: Any, principal_id: Any) -> tuple[str, str]:
    return (
        normalize_identifier(principal_type, "principal_type", max_length=64),
        normalize_identifier(principal_id, "principal_id"),
    )


def _window_ms(window: Any, field: str = "window") -> int:
    return to_duration_ms(window, field, minimum_ms=MIN_WINDOW_MS, maximum_ms=MAX_WINDOW_MS)


def _budget(value: Any, field: str) -> int:
    return normalize_int(value, field, minimum=1, maximum=MAX_BUDGET)


def covers(enabled: bool, capabilities: Iterable[str], authority: dict[str, Any]) -> bool:
    """True when an enabled policy with ``capabilities`` grants everything ``authority`` asks for."""
    return enabled and not missing_capabilities(list(capabilities), authority)


def window_bounds(window_ms: int, now: datetime) -> tuple[datetime, datetime]:
    """The epoch-aligned window containing ``now``: ``floor(now / window) * window``."""
    start_ms = to_ms(now, "now") // window_ms * window_ms
    return from_ms(start_ms), from_ms(start_ms + window_ms)


def policy_content(policy: AuthorityPolicy) -> dict[str, Any]:
    """A revision's full content, as the history table stores it (``max_running`` only when
    set, so that revisions from before it existed read the same)."""
    content = {
        "principal": {"type": policy.principal_type, "id": policy.principal_id},
        "revision": policy.revision,
        "enabled": policy.enabled,
        "capabilities": list(policy.capabilities),
        "window_ms": policy.window_ms,
        "max_runs": policy.max_runs,
        "max_units": policy.max_units,
    }
    if policy.max_running is not None:
        content["max_running"] = policy.max_running
    return content


# --------------------------------------------------------------------------- reading


def get_policy(principal_type: str, principal_id: str, *, using: str | None = None) -> AuthorityPolicy | None:
    """The principal's policy, or None. A backfilled policy with no capabilities reads fine."""
    ptype, pid = _principal(principal_type, principal_id)
    return (
        AuthorityPolicy.objects.using(alias_for(using)).filter(principal_type=ptype, principal_id=pid).first()
    )


def policy_history(
    principal_type: str, principal_id: str, limit: int = 50, *, using: str | None = None
) -> list[AuthorityPolicyRevision]:
    """The principal's policy revisions, newest first."""
    ptype, pid = _principal(principal_type, principal_id)
    limit = normalize_int(limit, "limit", minimum=1, maximum=MAX_HISTORY_LIMIT)
    return list(
        AuthorityPolicyRevision.objects.using(alias_for(using))
        .filter(principal_type=ptype, principal_id=pid)
        .order_by("-revision")[:limit]
    )


def current_usage(
    policy: AuthorityPolicy, now: datetime | None = None, *, using: str | None = None
) -> WindowUsage:
    """Runs and units reserved under the policy's current revision in the window holding ``now``."""
    if not isinstance(policy, AuthorityPolicy):
        raise InvalidArgument("policy", "must be an AuthorityPolicy")
    at = conf.now() if now is None else from_ms(to_ms(now, "now"))
    start, end = window_bounds(policy.window_ms, at)
    row = (
        AuthorityUsage.objects.using(alias_for(using))
        .filter(
            principal_type=policy.principal_type,
            principal_id=policy.principal_id,
            policy_revision=policy.revision,
            window_started_at=start,
        )
        .values_list("runs", "units")
        .first()
    )
    runs, units = row if row is not None else (0, 0)
    return WindowUsage(
        principal_type=policy.principal_type,
        principal_id=policy.principal_id,
        policy_revision=policy.revision,
        window_started_at=start,
        window_ends_at=end,
        runs=runs,
        units=units,
        max_runs=policy.max_runs,
        max_units=policy.max_units,
    )


# --------------------------------------------------------------------------- rebinding


def _principal_of(authority: Any) -> tuple[Any, Any] | None:
    principal = authority.get("principal") if isinstance(authority, dict) else None
    if not isinstance(principal, dict):
        return None
    return principal.get("type"), principal.get("id")


def _job_batches(ptype: str, pid: str, alias: str, *, lock: bool) -> Iterator[list[Job]]:
    # Jobs have no principal column: a JSON key lookup narrows the scan, and the principal
    # is re-checked in Python. Keyset pages keep memory bounded.
    base = (
        Job.objects.using(alias)
        .filter(authority__principal__type=ptype, authority__principal__id=pid)
        .only("job_id", "authority")
        .order_by("job_id")
    )
    last: str | None = None
    while True:
        page = base if last is None else base.filter(job_id__gt=last)
        if lock:
            page = page.select_for_update()
        rows = list(page[:REBIND_BATCH])
        if not rows:
            return
        yield [row for row in rows if _principal_of(row.authority) == (ptype, pid)]
        last = rows[-1].job_id


def _occurrence_batches(ptype: str, pid: str, alias: str, *, lock: bool) -> Iterator[list[Occurrence]]:
    key = principal_key({"principal": {"type": ptype, "id": pid}})
    base = (
        Occurrence.objects.using(alias)
        .filter(principal_key=key, status__in=PENDING_STATUSES)
        .only("occurrence_id", "authority", "status")
        .order_by("occurrence_id")
    )
    last: str | None = None
    while True:
        page = base if last is None else base.filter(occurrence_id__gt=last)
        if lock:
            page = page.select_for_update()
        rows = list(page[:REBIND_BATCH])
        if not rows:
            return
        # Re-checked under the lock: a claim may have taken a row since it was listed.
        yield [
            row
            for row in rows
            if row.status in PENDING_STATUSES and _principal_of(row.authority) == (ptype, pid)
        ]
        last = rows[-1].occurrence_id


def _follows_the_policy(authority: dict[str, Any], before: AuthorityPolicy | None) -> bool:
    """Whether an envelope the new revision does not cover moves to it anyway: one bound to
    no revision, or to the previous revision that did not grant it either, was never
    granted, so it has no grant to lose; bound to the current revision, the worker then
    names what is missing (``permission_denied``) instead of a stale binding."""
    bound = bound_revision(authority)
    return bound is None or (
        before is not None
        and bound == before.revision
        and not covers(before.enabled, before.capabilities, authority)
    )


def _classify(
    ptype: str,
    pid: str,
    *,
    enabled: bool,
    capabilities: list[str],
    alias: str,
    rebind_to: int | None,
    before: AuthorityPolicy | None = None,
) -> dict[str, int]:
    """Count (and with ``rebind_to``, rebind) the principal's covered jobs and pending
    occurrences; the uncovered ones are counted stale, and those that were never granted
    move to ``rebind_to`` too (``before``: the previous revision). Without ``rebind_to``
    nothing is locked or written (a preview)."""
    counts = {"rebound_jobs": 0, "stale_jobs": 0, "rebound_occurrences": 0, "stale_occurrences": 0}
    lock = rebind_to is not None
    sources: list[tuple[str, Iterator[list[Any]]]] = [
        ("jobs", _job_batches(ptype, pid, alias, lock=lock)),
        ("occurrences", _occurrence_batches(ptype, pid, alias, lock=lock)),
    ]
    for label, batches in sources:
        for rows in batches:
            changed = []
            for row in rows:
                if covers(enabled, capabilities, row.authority):
                    counts[f"rebound_{label}"] += 1
                else:
                    counts[f"stale_{label}"] += 1
                    if not _follows_the_policy(row.authority, before):
                        continue
                if rebind_to is not None and bound_revision(row.authority) != rebind_to:
                    row.authority = bind(row.authority, rebind_to)
                    changed.append(row)
            if changed:
                type(changed[0]).objects.using(alias).bulk_update(changed, ["authority"])
    return counts


def preview_policy_change(
    principal_type: str,
    principal_id: str,
    *,
    capabilities: Any,
    enabled: bool = True,
    using: str | None = None,
) -> dict[str, int]:
    """Read-only: how many of the principal's jobs and pending occurrences a change to
    ``capabilities``/``enabled`` would rebind, and how many it would leave stale."""
    ptype, pid = _principal(principal_type, principal_id)
    caps = normalize_capabilities(capabilities, "capabilities")
    active = normalize_bool(enabled, "enabled")
    return _classify(ptype, pid, enabled=active, capabilities=caps, alias=alias_for(using), rebind_to=None)


# --------------------------------------------------------------------------- writing


def _lock_policy(ptype: str, pid: str, alias: str) -> AuthorityPolicy | None:
    return (
        AuthorityPolicy.objects.using(alias)
        .select_for_update()
        .filter(principal_type=ptype, principal_id=pid)
        .first()
    )


def _conflict(ptype: str, pid: str, expected: int, actual: int) -> AuthorityPolicyConflict:
    return AuthorityPolicyConflict(
        f"authority policy {ptype}:{pid} is at revision {actual}, not {expected}",
        {
            "principal_type": ptype,
            "principal_id": pid,
            "expected_revision": expected,
            "actual_revision": actual,
        },
    )


def _is_deadlock(exc: OperationalError) -> bool:
    cause = exc.__cause__
    code = exc.args[0] if exc.args else None
    # MySQL/MariaDB: 1213 deadlock; PostgreSQL: SQLSTATE 40P01 deadlock_detected.
    return code == 1213 or getattr(cause, "sqlstate", getattr(cause, "pgcode", None)) == "40P01"


def change_policy(
    principal_type: str,
    principal_id: str,
    *,
    capabilities: Any,
    window: float | timedelta,
    max_runs: int,
    max_units: int,
    enabled: bool = True,
    expected_revision: int | None = None,
    changed_by: str | None = None,
    max_running: int | None = None,
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
    )
    # A deadlock aborts the whole transaction; retry only when this call owns it.
    retries = 0 if connections[alias].in_atomic_block else 3
    while True:
        try:
            return _change_policy(change, alias)
        except OperationalError as exc:
            if retries <= 0 or not _is_deadlock(exc):
                raise
            retries -= 1


@dataclass(frozen=True)
class _Change:
    """One validated ``change_policy`` request."""

    ptype: str
    pid: str
    capabilities: list[str]
    window_ms: int
    max_runs: int
    max_units: int
    enabled: bool
    expected: int | None  # the compare-and-set revision, if any
    actor: str | None
    max_running: int | None = None


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
) -> _Change:
    ptype, pid = _principal(principal_type, principal_id)
    return _Change(
        ptype=ptype,
        pid=pid,
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
    )


def _insert_policy(change: _Change, now: datetime, alias: str) -> tuple[AuthorityPolicy, int]:
    """Create the principal's first revision: (the policy, 0). When another transaction
    created it meanwhile, an unconditional change gets (the winner's row, locked, its
    revision) to apply on top of; a compare-and-set one has lost."""
    ptype, pid = change.ptype, change.pid
    policy = AuthorityPolicy(
        principal_type=ptype,
        principal_id=pid,
        revision=1,
        enabled=change.enabled,
        capabilities=change.capabilities,
        window_ms=change.window_ms,
        max_runs=change.max_runs,
        max_units=change.max_units,
        max_running=change.max_running,
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
                .filter(principal_type=ptype, principal_id=pid)
                .values_list("revision", flat=True)
                .first()
            )
            raise _conflict(ptype, pid, change.expected, raced or 0) from None
        # An unconditional change applies on top of the winner's (a MySQL deadlock
        # between two such losers is retried by ``change_policy``).
        locked = _lock_policy(ptype, pid, alias)
        if locked is None:
            raise
        return locked, locked.revision
    return policy, 0


def _keep_unrecorded_revision(policy: AuthorityPolicy, alias: str) -> None:
    """A revision written without history (the v2 backfill): keep it before it is replaced,
    so the history can show what this change changed."""
    revisions = AuthorityPolicyRevision.objects.using(alias).filter(
        principal_type=policy.principal_type, principal_id=policy.principal_id
    )
    if not revisions.filter(revision=policy.revision).exists():
        AuthorityPolicyRevision.objects.using(alias).create(
            principal_type=policy.principal_type,
            principal_id=policy.principal_id,
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
            "updated_at",
        ],
    )


def _change_policy(change: _Change, alias: str) -> PolicyChange:
    ptype, pid = change.ptype, change.pid
    now = conf.now()
    with write_transaction(alias):
        policy = _lock_policy(ptype, pid, alias)
        previous = 0 if policy is None else policy.revision
        if change.expected is not None and change.expected != previous:
            raise _conflict(ptype, pid, change.expected, previous)
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
            principal_type=ptype,
            principal_id=pid,
            revision=policy.revision,
            content=policy_content(policy),
            changed_by=change.actor,
            changed_at=now,
        )
        counts = _classify(
            ptype,
            pid,
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
    max_runs: int,
    max_units: int,
    enabled: bool = True,
    expected_revision: int | None = None,
    changed_by: str | None = None,
    max_running: int | None = None,
    using: str | None = None,
) -> AuthorityPolicy:
    """Create or replace the principal's policy (``docs/design.md``, "Authority checks").

    ``max_running``: how many of the principal's occurrences may run at once across every
    worker (1..10,000; None: no cap).

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
        using=using,
    )
    policy = change.policy
    policy.change = change  # type: ignore[attr-defined]
    return policy


def ensure_policy(
    authority: dict[str, Any],
    *,
    window: float | timedelta = timedelta(milliseconds=DEFAULT_WINDOW_MS),
    max_runs: int = DEFAULT_MAX_RUNS,
    max_units: int = DEFAULT_MAX_UNITS,
    changed_by: str | None = None,
    using: str | None = None,
) -> AuthorityPolicy:
    """The envelope principal's policy; when it has none, create one granting exactly the
    envelope's requested capabilities. An existing policy is returned unchanged (never
    widened). An envelope that requests no capability cannot create a policy (a policy
    lists 1..256 capabilities): ``authority.requestedCapabilities`` is refused."""
    envelope = normalize_authority(authority, "authority")
    window_ms = _window_ms(window)
    runs = _budget(max_runs, "max_runs")
    units = _budget(max_units, "max_units")
    actor = None if changed_by is None else normalize_identifier(changed_by, "changed_by")
    ptype, pid = envelope["principal"]["type"], envelope["principal"]["id"]
    existing = get_policy(ptype, pid, using=using)
    if existing is not None:
        return existing
    if not envelope["requestedCapabilities"]:
        raise InvalidArgument(
            "authority.requestedCapabilities",
            "must request at least one capability to create a default policy (use set_policy)",
        )
    try:
        return set_policy(
            ptype,
            pid,
            capabilities=envelope["requestedCapabilities"],
            window=timedelta(milliseconds=window_ms),
            max_runs=runs,
            max_units=units,
            expected_revision=0,
            changed_by=actor,
            using=using,
        )
    except AuthorityPolicyConflict:
        raced = get_policy(ptype, pid, using=using)
        if raced is None:
            raise
        return raced


def bind_to_current_policy(authority: dict[str, Any], using: str | None = None) -> dict[str, Any]:
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
    authority = normalize_authority(authority, "authority")
    policy = get_policy(authority["principal"]["type"], authority["principal"]["id"], using=using)
    if policy is None:
        return authority
    return bind(authority, policy.revision)


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
    ``capability``: created on first use with the default budget, widened when a job is
    created without an authority envelope for a kind it does not grant yet. Such a job's
    author asked for no restriction; an operator restricts it in the admin, and an explicit
    envelope stays fail-closed."""
    principal = normalize_principal(conf.settings.DEFAULT_PRINCIPAL, "DURABLE_SCHEDULER_DEFAULT_PRINCIPAL")
    ptype, pid = principal["type"], principal["id"]
    for _ in range(_GRANT_ATTEMPTS):
        with write_transaction(using) as alias:
            # A locking read sees the latest policy even in a repeatable-read snapshot (MySQL).
            policy = (
                AuthorityPolicy.objects.using(alias)
                .select_for_update()
                .filter(principal_type=ptype, principal_id=pid)
                .first()
            )
        if policy is not None and capability in (policy.capabilities or []):
            return policy
        try:
            return set_policy(
                ptype,
                pid,
                capabilities=sorted({*(policy.capabilities if policy else []), capability}),
                window=timedelta(milliseconds=policy.window_ms if policy else DEFAULT_WINDOW_MS),
                max_runs=policy.max_runs if policy else DEFAULT_MAX_RUNS,
                max_units=policy.max_units if policy else DEFAULT_MAX_UNITS,
                max_running=policy.max_running if policy else None,
                enabled=policy.enabled if policy else True,
                expected_revision=policy.revision if policy else 0,
                changed_by=_grant_note(job_id),
                using=using,
            )
        except AuthorityPolicyConflict:
            continue
    raise AuthorityPolicyConflict(
        f"the default principal's policy kept changing while granting {capability!r}",
        {"principal": principal, "capability": capability},
    )


def jobs_without_policy(*, using: str | None = None) -> dict[tuple[str, str], list[str]]:
    """The enabled jobs whose principal has no policy, by principal ``(type, id)``: every
    run of theirs is denied ``policy_required`` until one is set."""
    alias = alias_for(using)
    having = set(AuthorityPolicy.objects.using(alias).values_list("principal_type", "principal_id"))
    found: dict[tuple[str, str], list[str]] = {}
    jobs = Job.objects.using(alias).filter(enabled=True).order_by("job_id")
    for job_id, authority in jobs.values_list("job_id", "authority").iterator():
        principal = authority.get("principal") if isinstance(authority, dict) else None
        if not isinstance(principal, dict):
            continue
        key = (str(principal.get("type")), str(principal.get("id")))
        if key not in having:
            found.setdefault(key, []).append(job_id)
    return found
