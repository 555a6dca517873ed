"""The scheduler's tables: jobs, occurrences and events (the kernel), and the authority
policies, usage and reservations (the authority layer). Names are
``durable_scheduler_<table>``; what each row means: ``docs/design.md``, "Data model".

These models are the only definition of the schema: the kernel's SQL takes its columns from
their ``_meta``, so a field added here with a migration needs no other edit. Only the kernel
(the ``kernel`` package) writes occurrence state; these models carry no
state transitions of their own.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import F, Q

from .constraints import OneOf, SameTruth
from .fields import EnvelopeField
from .rules.authority import PRINCIPAL_KEY_LENGTH
from .rules.statuses import (
    ACTIVE_STATUSES,
    PENDING_STATUSES,
    TERMINAL_STATUSES,
    BatchStatus,
    OccurrenceStatus,
    ReservationStatus,
)

__all__ = [
    "ACTIVE_STATUSES",
    "PENDING_STATUSES",
    "TERMINAL_STATUSES",
    "BatchStatus",
    "OccurrenceStatus",
    "ReservationStatus",
]


# The rows of the unique index: a unique key, and waiting or running. A query that gives
# this condition word for word (as ``unique.py`` does) lets SQLite read the partial index.
UNIQUE_LIVE = Q(unique_key__isnull=False) & (
    Q(status=OccurrenceStatus.QUEUED)
    | Q(status=OccurrenceStatus.RETRY_WAIT)
    | Q(status=OccurrenceStatus.RUNNING)
)


class Job(models.Model):
    job_id = models.CharField(max_length=256, primary_key=True)
    kind = models.CharField(max_length=128, db_index=True)
    trigger = models.JSONField(default=dict)
    payload = models.JSONField(null=True, blank=True, default=None)
    authority = models.JSONField()
    enabled = models.BooleanField(default=True)
    revision = models.PositiveIntegerField(default=1)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # Retry backoff when the handler gives no time: base * 2**(attempt-1), capped at max.
    retry_base_delay_ms = models.PositiveBigIntegerField(default=10_000)
    retry_max_delay_ms = models.PositiveBigIntegerField(default=3_600_000)
    # How long one run may take before the worker fails it (None: the handler's timeout,
    # else DURABLE_SCHEDULER_HANDLER_TIMEOUT, else none).
    timeout_ms = models.PositiveBigIntegerField(null=True, blank=True)
    # The next slot to materialize (None: no schedule, or it has ended), and the latest slot
    # ever materialized: no slot at or before it fires again, whatever edits or pruning do.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_slot_at = models.DateTimeField(null=True, blank=True)
    # The app whose code declares the job (None: made through the API or the admin). A sync
    # disables the jobs an installed app no longer declares.
    declared_in = models.CharField(max_length=100, null=True, blank=True)
    # How many of this job's occurrences run at once (None: no cap), per concurrency key when
    # ``concurrency_key`` (a template on the payload, e.g. "{customer}") is set.
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    concurrency_key = models.CharField(max_length=256, null=True, blank=True)
    # How fast its occurrences may start, on every worker (rules/throttles.py):
    # {"limit", "period_ms", "burst", "key"}; None: no throttle.
    throttle = models.JSONField(null=True, blank=True, default=None)
    # The follow-ups every occurrence of the job names (chains.py): enqueued when it succeeds
    # (``then``) or is dead-lettered (``on_dead_letter``); lists of {"job_id", "payload"?}.
    then = models.JSONField(null=True, blank=True, default=None)
    on_dead_letter = models.JSONField(null=True, blank=True, default=None)

    class Meta:
        db_table = "durable_scheduler_jobs"
        ordering = ["job_id"]
        indexes = [models.Index(fields=["enabled", "next_fire_at"], name="dsch_jobs_due")]
        constraints = [
            models.CheckConstraint(condition=Q(revision__gte=1), name="dsch_job_revision_min"),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1, max_attempts__lte=32), name="dsch_job_max_attempts_range"
            ),
            models.CheckConstraint(
                condition=Q(retry_base_delay_ms__gte=1, retry_max_delay_ms__gte=F("retry_base_delay_ms")),
                name="dsch_job_retry_delays",
            ),
        ]

    def __str__(self) -> str:
        return self.job_id


class Occurrence(models.Model):
    occurrence_id = models.CharField(max_length=68, primary_key=True)
    # No index of its own: the (job, trigger_key) index serves lookups by job (every index is
    # written on each insert; on SQLite each is one more page in the commit).
    job = models.ForeignKey(
        Job, on_delete=models.PROTECT, related_name="occurrences", db_column="job_id", db_index=False
    )
    job_revision = models.PositiveIntegerField()
    idempotency_key = models.CharField(max_length=77, unique=True)
    trigger_key = models.CharField(max_length=256)
    scheduled_for = models.DateTimeField()
    available_at = models.DateTimeField()
    status = models.CharField(
        max_length=16, choices=OccurrenceStatus.choices, default=OccurrenceStatus.QUEUED
    )
    attempt = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField()
    fence = models.PositiveBigIntegerField(default=0)
    lease_owner = models.CharField(max_length=256, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    authority = EnvelopeField()
    payload = models.JSONField(null=True, blank=True, default=None)
    last_error = models.JSONField(null=True, blank=True, default=None)
    result = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)
    # Partition key for fair claiming across principals: canonical JSON of [type, id].
    principal_key = models.CharField(max_length=PRINCIPAL_KEY_LENGTH, default="")
    # Recorded by the handler while it runs (ctx.record_metadata / ctx.record_receipt).
    metadata = models.JSONField(null=True, blank=True, default=None)
    receipt = models.JSONField(null=True, blank=True, default=None)
    # The handler's last progress report (ctx.report_progress, rules/progress.py): done,
    # total, note and the fence of the attempt that reported it; None if it never reported.
    progress = models.JSONField(null=True, blank=True, default=None)
    # Higher first among one principal's due occurrences (django.tasks' priority, -100..100).
    priority = models.SmallIntegerField(default=0)
    # The W3C trace context of the span current at enqueue ({"traceparent": ..., and
    # "tracestate" if any}), with the [otel] extra: each run's span continues that trace.
    trace_context = models.JSONField(null=True, blank=True, default=None)
    # A cancel asked for while it ran: when, and the fence of the attempt it names (a later
    # attempt has a higher fence, so the request never reaches it).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_fence = models.PositiveBigIntegerField(null=True, blank=True)
    # The key its job's or handler's concurrency limit counts per (computed at enqueue).
    concurrency_key = models.CharField(max_length=256, null=True, blank=True)
    # The caller's key for "one waiting at a time" (enqueue's unique_key, per job); None for
    # the rest, which then have no entry in the unique index.
    unique_key = models.CharField(max_length=256, null=True, blank=True, default=None)
    # What follows it ({"then": [...], "on_dead_letter": [...]}: its job's and its enqueue's,
    # see chains.py); None for the rest, which settle as before.
    follow_ups = models.JSONField(null=True, blank=True, default=None)
    # Why it exists, when another occurrence or a batch made it: the predecessor's id
    # (``caused_by``) and what the handler sees of it (``cause``: its outcome, or the batch's
    # counts), copied so that it outlives the predecessor's pruning.
    caused_by = models.CharField(max_length=68, null=True, blank=True, default=None)
    cause = models.JSONField(null=True, blank=True, default=None)
    # The batch it is a member of (batches.py); None for the rest.
    batch = models.ForeignKey(
        "Batch",
        on_delete=models.PROTECT,
        related_name="members",
        null=True,
        blank=True,
        default=None,
        db_column="batch_id",
        db_index=False,
    )

    class Meta:
        db_table = "durable_scheduler_occurrences"
        ordering = ["available_at", "scheduled_for", "occurrence_id"]
        indexes = [
            models.Index(
                fields=["status", "available_at", "lease_expires_at", "scheduled_for", "occurrence_id"],
                name="dsch_occurrences_claim",
            ),
            # Each principal's waiting occurrences in due order (the fair claim). Partial:
            # only waiting rows, so it stays small however many terminal rows the table
            # holds. MySQL/MariaDB have no partial indexes; there the claim index serves.
            models.Index(
                fields=["principal_key", "status", "available_at", "scheduled_for", "occurrence_id"],
                name="dsch_occurrences_fair",
                condition=Q(status=OccurrenceStatus.QUEUED) | Q(status=OccurrenceStatus.RETRY_WAIT),
            ),
            # The waiting occurrences with a priority other than 0 (django.tasks' priority),
            # highest first: empty unless tasks set one, so other work writes no entry.
            models.Index(
                fields=["principal_key", "-priority", "available_at", "scheduled_for", "occurrence_id"],
                name="dsch_occurrences_priority",
                condition=(Q(status=OccurrenceStatus.QUEUED) | Q(status=OccurrenceStatus.RETRY_WAIT))
                & ~Q(priority=0),
            ),
            models.Index(fields=["job", "trigger_key"], name="dsch_occurrences_job_trigger"),
            # The live occurrences with a unique key, found by (job, key) by a unique or
            # debounced enqueue: only those rows have an entry, so other enqueues, claims
            # and settles write none (MySQL/MariaDB: every row, with a NULL key).
            models.Index(fields=["job", "unique_key"], name="dsch_occurrences_unique", condition=UNIQUE_LIVE),
            # Settled rows only (pruning by age): a queued or running row has no entry, so an
            # enqueue, a claim and a retry write none (MySQL/MariaDB: the whole table).
            models.Index(
                fields=["status", "settled_at"],
                name="dsch_occurrences_settled",
                condition=Q(settled_at__isnull=False),
            ),
            # A batch's members by status (its progress, and whether any is still live):
            # only members have an entry (MySQL/MariaDB: every row, with a NULL batch).
            models.Index(
                fields=["batch", "status"], name="dsch_occurrences_batch", condition=Q(batch__isnull=False)
            ),
            # The follow-ups of an occurrence (its page, history()): only follow-ups have one.
            models.Index(
                fields=["caused_by"], name="dsch_occurrences_caused_by", condition=Q(caused_by__isnull=False)
            ),
        ]
        constraints = [
            # Written with constraints.OneOf/SameTruth: the same conditions in a form that
            # PostgreSQL rebuilds faster for each statement that writes a row (see there).
            models.CheckConstraint(
                condition=OneOf("status", *(s.value for s in OccurrenceStatus)), name="dsch_occ_status_valid"
            ),
            # running <=> a lease owner <=> a lease expiry.
            models.CheckConstraint(
                condition=(
                    SameTruth(Q(status=OccurrenceStatus.RUNNING), Q(lease_owner__isnull=False))
                    & SameTruth(Q(lease_owner__isnull=False), Q(lease_expires_at__isnull=False))
                ),
                name="dsch_occ_running_has_lease",
            ),
            # terminal <=> settled.
            models.CheckConstraint(
                condition=SameTruth(
                    OneOf("status", *(s.value for s in TERMINAL_STATUSES)), Q(settled_at__isnull=False)
                ),
                name="dsch_occ_terminal_settled",
            ),
            models.CheckConstraint(
                condition=Q(attempt__gte=0, attempt__lte=F("max_attempts")), name="dsch_occ_attempt_range"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1, max_attempts__lte=32), name="dsch_occ_max_attempts_range"
            ),
            models.CheckConstraint(condition=Q(job_revision__gte=1), name="dsch_occ_job_revision_min"),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100), name="dsch_occ_priority_range"
            ),
        ]

    # Not a column: the job's kind, filled in by a claim (so the worker need not look it up).
    claimed_kind: str | None = None
    # Not a column either: the job's ``timeout_ms``, read by the same claim.
    claimed_timeout_ms: int | None = None
    # Nor this: the units the claim charged to the principal's budget (0: a reused reservation).
    charged_units: int = 0

    def __str__(self) -> str:
        return self.occurrence_id

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class Event(models.Model):
    event_id = models.BigAutoField(primary_key=True)
    # No indexes of their own: (job, event_id) and (occurrence, event_id) serve them.
    job = models.ForeignKey(
        Job, on_delete=models.PROTECT, related_name="events", db_column="job_id", db_index=False
    )
    occurrence = models.ForeignKey(
        Occurrence,
        on_delete=models.PROTECT,
        related_name="events",
        null=True,
        blank=True,
        db_column="occurrence_id",
        db_index=False,
    )
    event_type = models.CharField(max_length=64)
    occurred_at = models.DateTimeField()
    owner_id = models.CharField(max_length=256, null=True, blank=True)
    fence = models.PositiveBigIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict)

    class Meta:
        db_table = "durable_scheduler_events"
        ordering = ["-event_id"]
        indexes = [
            models.Index(fields=["job", "event_id"], name="dsch_events_job"),
            models.Index(fields=["occurrence", "event_id"], name="dsch_events_occurrence"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} #{self.event_id}"


class Batch(models.Model):
    """A set of occurrences with a callback enqueued once every one of them is terminal
    (batches.py). Settling a member never writes this row: completion is found by looking at
    the members (docs/design.md, "Chains and batches")."""

    batch_id = models.CharField(max_length=256, primary_key=True)
    status = models.CharField(max_length=16, choices=BatchStatus.choices, default=BatchStatus.OPEN)
    # The callback: an occurrence of this job, with this payload (None: the job's own).
    callback_job = models.ForeignKey(
        Job, on_delete=models.PROTECT, related_name="batches", db_column="callback_job_id"
    )
    callback_payload = models.JSONField(null=True, blank=True, default=None)
    has_callback_payload = models.BooleanField(default=False)
    description = models.CharField(max_length=256, blank=True, default="")
    created_by = models.CharField(max_length=256, null=True, blank=True)
    # Members added (each add writes this row once, never a settle).
    size = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=256, null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # At completion: the members by final status, and the callback occurrence.
    counts = models.JSONField(null=True, blank=True, default=None)
    callback = models.CharField(max_length=68, null=True, blank=True)

    class Meta:
        db_table = "durable_scheduler_batches"
        verbose_name_plural = "batches"
        ordering = ["-created_at", "batch_id"]
        indexes = [
            models.Index(fields=["status", "created_at"], name="dsch_batches_status"),
            models.Index(fields=["created_at"], name="dsch_batches_created"),  # the admin's order
        ]
        constraints = [
            models.CheckConstraint(
                condition=OneOf("status", *(s.value for s in BatchStatus)), name="dsch_batch_status_valid"
            ),
            models.CheckConstraint(
                condition=SameTruth(Q(status=BatchStatus.OPEN), Q(closed_at__isnull=True)),
                name="dsch_batch_open_not_closed",
            ),
            models.CheckConstraint(
                condition=SameTruth(Q(status=BatchStatus.COMPLETED), Q(completed_at__isnull=False)),
                name="dsch_batch_completed_at",
            ),
        ]

    def __str__(self) -> str:
        return self.batch_id


class AuthorityPolicy(models.Model):
    principal_type = models.CharField(max_length=64)
    principal_id = models.CharField(max_length=256)
    revision = models.PositiveIntegerField(default=1)
    enabled = models.BooleanField(default=True)
    capabilities = models.JSONField(default=list)
    window_ms = models.BigIntegerField(default=24 * 60 * 60 * 1000)
    # Runs and units per window (None: no limit). With neither set no budget applies: its
    # claims charge nothing and write no reservation (docs/authority.md, "Budgets").
    max_runs = models.PositiveIntegerField(null=True, blank=True, default=None)
    max_units = models.PositiveIntegerField(null=True, blank=True, default=None)
    # How many of the principal's occurrences run at once (None: no cap).
    max_running = models.PositiveIntegerField(null=True, blank=True)
    # How fast the principal's occurrences may start ({"limit", "period_ms", "burst"}; None: no throttle).
    throttle = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "durable_scheduler_authority_policies"
        verbose_name_plural = "authority policies"
        ordering = ["principal_type", "principal_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["principal_type", "principal_id"], name="dsch_policy_principal_unique"
            ),
            models.CheckConstraint(condition=Q(revision__gte=1), name="dsch_policy_revision_min"),
            models.CheckConstraint(
                condition=Q(window_ms__gte=60_000, window_ms__lte=2_678_400_000),
                name="dsch_policy_window_range",
            ),
            models.CheckConstraint(
                condition=Q(max_runs__isnull=True) | Q(max_runs__gte=1, max_runs__lte=1_000_000),
                name="dsch_policy_max_runs_range",
            ),
            models.CheckConstraint(
                condition=Q(max_units__isnull=True) | Q(max_units__gte=1, max_units__lte=1_000_000),
                name="dsch_policy_max_units_range",
            ),
            models.CheckConstraint(
                condition=Q(max_running__isnull=True) | Q(max_running__gte=1, max_running__lte=10_000),
                name="dsch_policy_max_running_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.principal_id}"

    @property
    def has_budget(self) -> bool:
        """Whether its runs are charged: a limit on runs or units per window is set."""
        return self.max_runs is not None or self.max_units is not None


class AuthorityUsage(models.Model):
    principal_type = models.CharField(max_length=64)
    principal_id = models.CharField(max_length=256)
    policy_revision = models.PositiveIntegerField()
    window_started_at = models.DateTimeField()
    runs = models.PositiveIntegerField(default=0)
    units = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField()
    # The counts a claim trusts are ``runs`` and ``units``; the recount against the window's
    # reservations runs off the claim path (budgets.audit_budgets), which records when it last
    # did and, if they differed, what it saw: a window with a mismatch is refused.
    verified_at = models.DateTimeField(null=True, blank=True)
    mismatch = models.JSONField(null=True, blank=True, default=None)

    class Meta:
        db_table = "durable_scheduler_authority_usage"
        verbose_name_plural = "authority usage"
        ordering = ["-window_started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["principal_type", "principal_id", "policy_revision", "window_started_at"],
                name="dsch_usage_window_unique",
            ),
            models.CheckConstraint(condition=Q(policy_revision__gte=1), name="dsch_usage_revision_min"),
            models.CheckConstraint(
                condition=Q(runs__gte=0, runs__lte=1_000_000), name="dsch_usage_runs_range"
            ),
            models.CheckConstraint(
                condition=Q(units__gte=0, units__lte=1_000_000), name="dsch_usage_units_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.principal_id} r{self.policy_revision} @{self.window_started_at}"


class AuthorityReservation(models.Model):
    occurrence = models.OneToOneField(
        Occurrence,
        on_delete=models.PROTECT,
        primary_key=True,
        related_name="reservation",
        db_column="occurrence_id",
    )
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="reservations", db_column="job_id")
    principal_type = models.CharField(max_length=64)
    principal_id = models.CharField(max_length=256)
    policy_revision = models.PositiveIntegerField()
    window_started_at = models.DateTimeField()
    units = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=ReservationStatus.choices, default=ReservationStatus.RESERVED
    )
    outcome = models.JSONField(null=True, blank=True, default=None)
    created_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "durable_scheduler_authority_reservations"
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["principal_type", "principal_id", "policy_revision", "window_started_at"],
                name="dsch_reservations_principal",
            ),
            models.Index(fields=["status", "created_at"], name="dsch_reservations_status"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(policy_revision__gte=1), name="dsch_res_revision_min"),
            models.CheckConstraint(
                condition=Q(units__gte=1, units__lte=1_000_000), name="dsch_res_units_range"
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in ReservationStatus]), name="dsch_res_status_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(status=ReservationStatus.RESERVED, outcome__isnull=True, settled_at__isnull=True)
                    | (
                        ~Q(status=ReservationStatus.RESERVED)
                        & Q(outcome__isnull=False, settled_at__isnull=False)
                    )
                ),
                name="dsch_res_settled_consistent",
            ),
        ]

    def __str__(self) -> str:
        return f"reservation {self.occurrence_id}"


class AuthorityPolicyRevision(models.Model):
    """Append-only history of policy changes: each revision's full content, who, when."""

    principal_type = models.CharField(max_length=64)
    principal_id = models.CharField(max_length=256)
    revision = models.PositiveIntegerField()
    content = models.JSONField()
    changed_by = models.CharField(max_length=256, null=True, blank=True)
    changed_at = models.DateTimeField()

    class Meta:
        db_table = "durable_scheduler_authority_policy_history"
        ordering = ["principal_type", "principal_id", "-revision"]
        constraints = [
            models.UniqueConstraint(
                fields=["principal_type", "principal_id", "revision"], name="dsch_policy_history_unique"
            ),
            models.CheckConstraint(condition=Q(revision__gte=1), name="dsch_policy_history_revision_min"),
        ]

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.principal_id} r{self.revision}"


class ConcurrencySlot(models.Model):
    """One concurrency limit's holders (a principal's, or a job's or kind's per key): the
    claims of that limit lock this row, so two claimers cannot both see one free slot.

    ``holders`` lists ``[occurrence_id, fence]`` of the claims it admitted; a claim counts
    only those still running on that fence with an unexpired lease, so a settled, expired or
    reclaimed holder frees its slot without any write (docs/design.md, "Concurrency limits")."""

    slot_id = models.CharField(max_length=64, primary_key=True)  # sha256 of the limit's scope
    scope = models.JSONField(default=list)  # what it limits, for people: ["kind", kind, key]
    holders = models.JSONField(default=list)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "durable_scheduler_concurrency_slots"

    def __str__(self) -> str:
        return self.slot_id


class ThrottleBucket(models.Model):
    """One throttle's token bucket (a principal's, or a job's or kind's per key): the claims
    that start its work lock this row, so two claimers cannot both take its last token.

    ``tat`` is the bucket as one instant (the "theoretical arrival time" of the generic cell
    rate algorithm): a start is allowed at ``now >= tat - burst * interval``. ``horizon`` is the
    same over the places handed to the work waiting for it, so each waiting occurrence is
    given its own start time (docs/design.md, "Throttles")."""

    bucket_id = models.CharField(max_length=64, primary_key=True)  # sha256 of the throttle's scope
    scope = models.JSONField(default=list)  # what it throttles, for people: ["job", job_id, key]
    tat = models.DateTimeField()
    horizon = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "durable_scheduler_throttle_buckets"

    def __str__(self) -> str:
        return self.bucket_id


class ThrottlePlace(models.Model):
    """The start a throttle gave an occurrence over its rate (kernel/throttles.py): while the
    occurrence's ``available_at`` equals ``slot``, it holds that place in its key's queue and
    the work placed after it does not keep it waiting. Kept apart from the occurrence, so that
    work without a throttle carries no column for it; removed when it starts."""

    occurrence_id = models.CharField(max_length=68, primary_key=True)
    slot = models.DateTimeField()

    class Meta:
        db_table = "durable_scheduler_throttle_places"

    def __str__(self) -> str:
        return self.occurrence_id


class WorkerHeartbeat(models.Model):
    """One row per runscheduler process: what the status command shows as live workers."""

    worker_id = models.CharField(max_length=256, primary_key=True)
    hostname = models.CharField(max_length=256)
    pid = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField()
    kinds = models.JSONField(default=list)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "durable_scheduler_workers"
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return self.worker_id


class OutcomeCount(models.Model):
    """Settled occurrences per hour, kind and outcome, for hours that are over (rollups.py):
    what the dashboard and the status command read instead of aggregating the occurrences
    table. Filled by the workers as an hour closes (or on first read) and never changed after,
    since nothing settles in an hour that is over; a row with an empty kind marks an hour as
    counted, so that an hour without runs is not counted again. ``status`` is an outcome or
    one of the other figures an hour holds per kind (rollups.KEYS: retries, pickup lag
    histogram, follow-ups, batches)."""

    hour = models.DateTimeField()
    kind = models.CharField(max_length=128, blank=True)
    status = models.CharField(max_length=16, blank=True)
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        db_table = "durable_scheduler_outcome_counts"
        constraints = [
            models.UniqueConstraint(fields=["hour", "kind", "status"], name="dsch_outcome_counts_key")
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} {self.kind} {self.status}: {self.count}"


class MaintenanceLease(models.Model):
    """One row per periodic task the workers share (``retention``): which worker holds it
    until when (one at a time across hosts; a killed holder's lease runs out), and what its
    last run did, which the dashboard and the status command show."""

    name = models.CharField(max_length=64, primary_key=True)
    # The worker that holds it, or held it last (expires_at None: released).
    owner = models.CharField(max_length=256, null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_result = models.JSONField(null=True, blank=True, default=None)

    class Meta:
        db_table = "durable_scheduler_maintenance"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class UniqueLock(models.Model):
    """One row per job that has had a unique or debounced enqueue: the lock those enqueues
    take, one at a time per job, before they look for the live occurrence of their key. Not
    the job row: every event insert checks its foreign key to the job (a share lock, which
    MariaDB takes at once and PostgreSQL at commit), so a claim or a cancel holding an
    occurrence would wait for an enqueue holding the job row that waits for that occurrence.
    Nothing references this row, so holding it never waits on anything it blocks."""

    job_id = models.CharField(max_length=256, primary_key=True)
    locked_at = models.DateTimeField()  # the last taker's time (the upsert that locks must write)

    class Meta:
        db_table = "durable_scheduler_unique_locks"
        ordering = ["job_id"]

    def __str__(self) -> str:
        return self.job_id


class UniqueCall(models.Model):
    """One unique or debounced enqueue, as it was called: its identity (the idempotency key an
    occurrence of its slot has), the occurrence it resolved to (added, returned or debounced)
    and a digest of its payload. The same call again is answered from this row, whatever that
    occurrence has become since, so a retried call never debounces twice nor adds the work again
    (docs/design.md, "Unique keys and debounce"). Plain enqueues write none; retention deletes
    the rows with their occurrence."""

    call_key = models.CharField(max_length=77, primary_key=True)
    # No index of its own: the one below, which serves retention's delete by occurrence.
    occurrence = models.ForeignKey(
        Occurrence,
        on_delete=models.PROTECT,
        related_name="unique_calls",
        db_column="occurrence_id",
        db_index=False,
    )
    payload_digest = models.CharField(max_length=64)  # sha256 of the payload's canonical JSON
    created_at = models.DateTimeField()

    class Meta:
        db_table = "durable_scheduler_unique_calls"
        indexes = [models.Index(fields=["occurrence"], name="dsch_unique_calls_occurrence")]

    def __str__(self) -> str:
        return self.call_key


class PausedKind(models.Model):
    """A kind no worker claims while this row exists (``kernel/pausing.py``): its waiting
    occurrences stay waiting, its running ones finish. Every claim reads this table inside
    its own statements, which stay one pass; resuming deletes the row."""

    kind = models.CharField(max_length=128, primary_key=True)
    paused_at = models.DateTimeField()
    paused_by = models.CharField(max_length=256, blank=True, default="")  # who, for people

    class Meta:
        db_table = "durable_scheduler_paused_kinds"
        ordering = ["kind"]
        verbose_name = "paused kind"

    def __str__(self) -> str:
        return self.kind


# The jobs behind the schedules of django.tasks tasks (tasks.schedule, the admin).
TASK_SCHEDULE_PREFIX = "task-schedule:"


class TaskScheduleManager(models.Manager["TaskSchedule"]):
    def get_queryset(self) -> models.QuerySet[TaskSchedule]:
        return super().get_queryset().filter(job_id__startswith=TASK_SCHEDULE_PREFIX)


class TaskSchedule(Job):
    """The jobs that run a task on a schedule: a proxy, so that the admin lists them apart,
    with a form in the task's terms (its path, args and kwargs)."""

    objects: ClassVar[TaskScheduleManager] = TaskScheduleManager()

    class Meta:
        proxy = True
        verbose_name = "task schedule"


class SchedulerDashboard(Occurrence):
    """No table of its own: the admin's dashboard page, listed on the admin index under this
    app (a proxy, so that it has its place and its view permission there)."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
