"""Everything the scheduler adds to the v2 tables of 0001-0003, up to today's models.

- The ``cancelled`` status: an occurrence withdrawn before it ran (terminal, so settled).
- ``Occurrence.principal_key``, the fair claim's partition (canonical JSON of the authority
  snapshot's ``[type, id]``), filled from each occurrence's snapshot, and the partial index the
  fair claim reads (waiting rows only).
- Schedules: ``Job.next_fire_at`` (the next slot to materialize, given to each scheduled job
  here) and ``Job.last_slot_at``, with the index of due jobs.
- Retry backoff: ``Job.retry_base_delay_ms`` and ``retry_max_delay_ms``; ``Job.timeout_ms``, how
  long one run may take.
- ``Job.declared_in``: the installed app whose code declares a job (a sync disables the jobs
  it stops declaring), and the admin dashboard's proxy model.
- ``Occurrence.priority`` (-100..100, higher first among a principal's due occurrences), for
  the ``django.tasks`` backend, and the partial index of the waiting rows whose priority is
  not 0.
- Execution records: ``Occurrence.metadata`` and ``receipt``, the policy history table and the
  worker heartbeat table; the outcome counts per hour that the dashboard reads.
- Fewer index writes on every enqueue and status change: the (status, settled_at) index holds
  settled rows only; the foreign keys occurrence.job, event.job and event.occurrence have no
  index of their own (each leads a composite index that serves it, and on MySQL/MariaDB carries
  the foreign key); and on PostgreSQL the ``varchar_pattern_ops`` twins of the hot tables' keys
  go (see ``drop_pattern_twins``).
- Chains and batches: ``Job.then`` / ``on_dead_letter`` and ``Occurrence.follow_ups`` (the
  follow-ups a job or an enqueue names), ``Occurrence.caused_by`` / ``cause`` (the predecessor
  or batch that made it), the ``Batch`` table and ``Occurrence.batch``, with the partial indexes
  of a batch's members by status and of an occurrence's follow-ups.
- The occurrence table's status, lease and settled checks written with ``constraints.OneOf``
  and ``constraints.SameTruth``: the same conditions in a smaller form, of which PostgreSQL
  rebuilds about half as much for each statement that writes a row (see ``constraints.py``).

Expand, then data, then contract: the checks that would refuse ``cancelled`` come off and the
new columns and tables go in; the data steps fill them; then the checks come back in their new
form and the indexes are built over the filled columns. Backward runs the same steps in the
opposite order: the ``cancelled`` occurrences become dead letters before the v2 checks
come back.

What this migration does stays fixed, whatever the app becomes: the data steps read the
historical models and the frozen helpers beside it (``_batch``, ``_first_fire_time``), and the
index names are written out. Its one import from the app is ``constraints``: ``OneOf`` and
``SameTruth`` are part of the checks' declaration in the model state, which Django refers to
by import path (as to a custom field) and compares with the models' own to find changes.
"""

from __future__ import annotations

import json
from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone

import django_durable_scheduler.constraints

from ._batch import batches, update_columns
from ._first_fire_time import first_fire_time

APP = "durable_scheduler"


def fill_principal_keys(apps: Any, schema_editor: Any) -> None:
    """Each occurrence's principal key from its authority snapshot: the canonical JSON of
    ``[type, id]`` (two strings: compact separators, non-ASCII kept)."""
    Occurrence = apps.get_model(APP, "Occurrence")
    for rows in batches(Occurrence, schema_editor.connection.alias, ["authority"]):
        for row in rows:
            principal = row.authority["principal"]
            row.principal_key = json.dumps(
                [principal["type"], principal["id"]], ensure_ascii=False, separators=(",", ":")
            )
        update_columns(Occurrence, schema_editor, rows, "principal_key")


def cancelled_to_dead_letter(apps: Any, schema_editor: Any) -> None:
    """Backward only: a status the v2 schema does not know. Cancelled occurrences become dead
    letters (both terminal and settled, so the v2 checks hold again); the cancellation
    stays visible in ``last_error``."""
    Occurrence = apps.get_model(APP, "Occurrence")
    alias = schema_editor.connection.alias
    for rows in batches(Occurrence, alias, ["status", "last_error"], where={"status": "cancelled"}):
        for row in rows:
            row.status = "dead_letter"
            row.last_error = {
                "code": "SCHEDULER_CANCELLED",
                "message": "cancelled (migrated back)",
                "previous": row.last_error,
            }
        update_columns(Occurrence, schema_editor, rows, "status", "last_error")


def first_fire_times(apps: Any, schema_editor: Any) -> None:
    """Each scheduled job's first fire time, strictly after now, by the trigger rules of 0.1.0
    frozen in ``_first_fire_time`` (a stored trigger those rules refuse never fires; update_job
    can repair it). The scheduler computes ``next_fire_at`` again whenever a trigger changes."""
    Job = apps.get_model(APP, "Job")
    now = timezone.now()
    for rows in batches(Job, schema_editor.connection.alias, ["trigger", "created_at"]):
        scheduled = []
        for row in rows:
            row.next_fire_at = first_fire_time(row.trigger or {}, now=now, anchor=row.created_at)
            if row.next_fire_at is not None:
                scheduled.append(row)
        update_columns(Job, schema_editor, scheduled, "next_fire_at")


# PostgreSQL's ``varchar_pattern_ops`` twins of the occurrences' and reservations' keys, as
# Django named and made them when the keys were created (0001, 0002). The twins of the three
# foreign keys above went with their single-column indexes.
PATTERN_TWINS = (
    (
        "durable_scheduler_occurrences_occurrence_id_331942e6_like",
        "durable_scheduler_occurrences",
        "occurrence_id",
    ),
    (
        "durable_scheduler_occurrences_idempotency_key_a3b85d19_like",
        "durable_scheduler_occurrences",
        "idempotency_key",
    ),
    (
        "durable_scheduler_author_occurrence_id_f2da3fa3_like",
        "durable_scheduler_authority_reservations",
        "occurrence_id",
    ),
    (
        "durable_scheduler_authority_reservations_job_id_124e9323_like",
        "durable_scheduler_authority_reservations",
        "job_id",
    ),
)


def drop_pattern_twins(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: drop the ``<index>_like`` twins of the occurrences' and reservations' keys.

    Django adds one next to every indexed or unique ``CharField`` on PostgreSQL, for
    ``LIKE 'prefix%'`` lookups outside the C locale. Nothing here looks these keys up by
    prefix, and each is one more index written on every insert and status change of these
    rows. A later ``AlterField`` on these columns works with or without the twins: Django
    drops one with ``DROP INDEX IF EXISTS``, and makes one only where the ``AlterField`` adds
    an index or changes the column's type (tests/test_migrations.py runs such changes). Other
    databases have no such indexes.
    """
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for name, _, _ in PATTERN_TWINS:
        schema_editor.execute(f"DROP INDEX IF EXISTS {quote(name)}")


def restore_pattern_twins(apps: Any, schema_editor: Any) -> None:
    """Backward: each twin as Django makes it, unless a later change has made it already."""
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for name, table, column in PATTERN_TWINS:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {quote(name)} ON {quote(table)} ({quote(column)} varchar_pattern_ops)"
        )


TERMINAL = ("succeeded", "dead_letter", "cancelled")


class Migration(migrations.Migration):
    dependencies = [(APP, "0003_authority_backfill")]

    operations = [
        # Expand. The v2 status, lease and settled checks come off: the first two would
        # refuse ``cancelled``, and all three come back below in their compact form.
        migrations.RemoveConstraint(model_name="occurrence", name="dsch_occ_status_valid"),
        migrations.RemoveConstraint(model_name="occurrence", name="dsch_occ_running_has_lease"),
        migrations.RemoveConstraint(model_name="occurrence", name="dsch_occ_terminal_settled"),
        migrations.AlterField(
            model_name="occurrence",
            name="status",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("retry_wait", "Retry Wait"),
                    ("succeeded", "Succeeded"),
                    ("dead_letter", "Dead Letter"),
                    ("cancelled", "Cancelled"),
                ],
                default="queued",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="principal_key",
            field=models.CharField(default="", max_length=400),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="metadata",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="receipt",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="priority",
            field=models.SmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="job",
            name="next_fire_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="last_slot_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="retry_base_delay_ms",
            field=models.PositiveBigIntegerField(default=10000),
        ),
        migrations.AddField(
            model_name="job",
            name="retry_max_delay_ms",
            field=models.PositiveBigIntegerField(default=3600000),
        ),
        migrations.AddField(
            model_name="job",
            name="timeout_ms",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="declared_in",
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.CreateModel(
            name="AuthorityPolicyRevision",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("principal_type", models.CharField(max_length=64)),
                ("principal_id", models.CharField(max_length=256)),
                ("revision", models.PositiveIntegerField()),
                ("content", models.JSONField()),
                ("changed_by", models.CharField(blank=True, max_length=256, null=True)),
                ("changed_at", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_scheduler_authority_policy_history",
                "ordering": ["principal_type", "principal_id", "-revision"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("principal_type", "principal_id", "revision"),
                        name="dsch_policy_history_unique",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("revision__gte", 1)), name="dsch_policy_history_revision_min"
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkerHeartbeat",
            fields=[
                ("worker_id", models.CharField(max_length=256, primary_key=True, serialize=False)),
                ("hostname", models.CharField(max_length=256)),
                ("pid", models.PositiveIntegerField()),
                ("concurrency", models.PositiveIntegerField()),
                ("kinds", models.JSONField(default=list)),
                ("started_at", models.DateTimeField()),
                ("last_seen_at", models.DateTimeField()),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "durable_scheduler_workers",
                "ordering": ["-last_seen_at"],
            },
        ),
        migrations.CreateModel(
            name="OutcomeCount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField()),
                ("kind", models.CharField(blank=True, max_length=128)),
                ("status", models.CharField(blank=True, max_length=16)),
                ("count", models.PositiveBigIntegerField(default=0)),
            ],
            options={
                "db_table": "durable_scheduler_outcome_counts",
                "constraints": [
                    models.UniqueConstraint(fields=("hour", "kind", "status"), name="dsch_outcome_counts_key")
                ],
            },
        ),
        # Data.
        migrations.CreateModel(
            name="SchedulerDashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("durable_scheduler.occurrence",),
        ),
        migrations.CreateModel(
            name="TaskSchedule",
            fields=[],
            options={
                "verbose_name": "task schedule",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("durable_scheduler.job",),
        ),
        migrations.RunPython(fill_principal_keys, migrations.RunPython.noop, elidable=False),
        migrations.RunPython(migrations.RunPython.noop, cancelled_to_dead_letter, elidable=False),
        migrations.RunPython(first_fire_times, migrations.RunPython.noop, elidable=False),
        # Contract: the checks, the indexes over the filled columns, the indexes that go.
        migrations.AddConstraint(
            model_name="occurrence",
            constraint=models.CheckConstraint(
                condition=django_durable_scheduler.constraints.OneOf(
                    "status", "queued", "running", "retry_wait", "succeeded", "dead_letter", "cancelled"
                ),
                name="dsch_occ_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="occurrence",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    django_durable_scheduler.constraints.SameTruth(
                        models.Q(("status", "running")), models.Q(("lease_owner__isnull", False))
                    ),
                    django_durable_scheduler.constraints.SameTruth(
                        models.Q(("lease_owner__isnull", False)),
                        models.Q(("lease_expires_at__isnull", False)),
                    ),
                ),
                name="dsch_occ_running_has_lease",
            ),
        ),
        migrations.AddConstraint(
            model_name="occurrence",
            constraint=models.CheckConstraint(
                condition=django_durable_scheduler.constraints.SameTruth(
                    django_durable_scheduler.constraints.OneOf("status", *TERMINAL),
                    models.Q(("settled_at__isnull", False)),
                ),
                name="dsch_occ_terminal_settled",
            ),
        ),
        migrations.AddConstraint(
            model_name="occurrence",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                name="dsch_occ_priority_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("retry_base_delay_ms__gte", 1),
                    ("retry_max_delay_ms__gte", models.F("retry_base_delay_ms")),
                ),
                name="dsch_job_retry_delays",
            ),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(("status", "queued"), ("status", "retry_wait"), _connector="OR"),
                fields=["principal_key", "status", "available_at", "scheduled_for", "occurrence_id"],
                name="dsch_occurrences_fair",
            ),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(
                    models.Q(("status", "queued"), ("status", "retry_wait"), _connector="OR"),
                    models.Q(("priority", 0), _negated=True),
                ),
                fields=["principal_key", "-priority", "available_at", "scheduled_for", "occurrence_id"],
                name="dsch_occurrences_priority",
            ),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(("settled_at__isnull", False)),
                fields=["status", "settled_at"],
                name="dsch_occurrences_settled",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["enabled", "next_fire_at"], name="dsch_jobs_due"),
        ),
        migrations.AlterField(
            model_name="occurrence",
            name="job",
            field=models.ForeignKey(
                db_column="job_id",
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="occurrences",
                to="durable_scheduler.job",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="job",
            field=models.ForeignKey(
                db_column="job_id",
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="durable_scheduler.job",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="occurrence",
            field=models.ForeignKey(
                blank=True,
                db_column="occurrence_id",
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="durable_scheduler.occurrence",
            ),
        ),
        migrations.RunPython(drop_pattern_twins, restore_pattern_twins, elidable=False),
        # Retention's lease, budget state, trace context, cancel requests, unique keys and
        # concurrency limits.
        migrations.CreateModel(
            name="MaintenanceLease",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("owner", models.CharField(blank=True, max_length=256, null=True)),
                ("expires_at", models.DateTimeField(blank=True, null=True)),
                ("last_started_at", models.DateTimeField(blank=True, null=True)),
                ("last_finished_at", models.DateTimeField(blank=True, null=True)),
                ("last_result", models.JSONField(blank=True, default=None, null=True)),
            ],
            options={
                "db_table": "durable_scheduler_maintenance",
                "ordering": ["name"],
            },
        ),
        migrations.AddField(
            model_name="authorityusage",
            name="mismatch",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="authorityusage",
            name="verified_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="trace_context",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="cancel_requested_fence",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="UniqueLock",
            fields=[
                ("job_id", models.CharField(max_length=256, primary_key=True, serialize=False)),
                ("locked_at", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_scheduler_unique_locks",
                "ordering": ["job_id"],
            },
        ),
        migrations.AddField(
            model_name="occurrence",
            name="unique_key",
            field=models.CharField(blank=True, default=None, max_length=256, null=True),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(
                    ("unique_key__isnull", False),
                    models.Q(
                        ("status", "queued"), ("status", "retry_wait"), ("status", "running"), _connector="OR"
                    ),
                ),
                fields=["job", "unique_key"],
                name="dsch_occurrences_unique",
            ),
        ),
        migrations.CreateModel(
            name="ConcurrencySlot",
            fields=[
                ("slot_id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("scope", models.JSONField(default=list)),
                ("holders", models.JSONField(default=list)),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_scheduler_concurrency_slots",
            },
        ),
        migrations.AddField(
            model_name="authoritypolicy",
            name="max_running",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=256, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=256, null=True),
        ),
        migrations.AddConstraint(
            model_name="authoritypolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("max_running__isnull", True),
                    models.Q(("max_running__gte", 1), ("max_running__lte", 10000)),
                    _connector="OR",
                ),
                name="dsch_policy_max_running_range",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="on_dead_letter",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="then",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="cause",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="caused_by",
            field=models.CharField(blank=True, default=None, max_length=68, null=True),
        ),
        migrations.AddField(
            model_name="occurrence",
            name="follow_ups",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.CreateModel(
            name="Batch",
            fields=[
                ("batch_id", models.CharField(max_length=256, primary_key=True, serialize=False)),
                (
                    "status",
                    models.CharField(
                        choices=[("open", "Open"), ("closed", "Closed"), ("completed", "Completed")],
                        default="open",
                        max_length=16,
                    ),
                ),
                ("callback_payload", models.JSONField(blank=True, default=None, null=True)),
                ("has_callback_payload", models.BooleanField(default=False)),
                ("description", models.CharField(blank=True, default="", max_length=256)),
                ("created_by", models.CharField(blank=True, max_length=256, null=True)),
                ("size", models.PositiveIntegerField(default=0)),
                ("created_at", models.DateTimeField()),
                ("closed_at", models.DateTimeField(blank=True, null=True)),
                ("cancelled_at", models.DateTimeField(blank=True, null=True)),
                ("cancelled_by", models.CharField(blank=True, max_length=256, null=True)),
                ("completed_at", models.DateTimeField(blank=True, null=True)),
                ("counts", models.JSONField(blank=True, default=None, null=True)),
                ("callback", models.CharField(blank=True, max_length=68, null=True)),
                (
                    "callback_job",
                    models.ForeignKey(
                        db_column="callback_job_id",
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="batches",
                        to="durable_scheduler.job",
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "batches",
                "db_table": "durable_scheduler_batches",
                "ordering": ["-created_at", "batch_id"],
            },
        ),
        migrations.AddField(
            model_name="occurrence",
            name="batch",
            field=models.ForeignKey(
                blank=True,
                db_column="batch_id",
                db_index=False,
                default=None,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="members",
                to="durable_scheduler.batch",
            ),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(("batch__isnull", False)),
                fields=["batch", "status"],
                name="dsch_occurrences_batch",
            ),
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(("caused_by__isnull", False)),
                fields=["caused_by"],
                name="dsch_occurrences_caused_by",
            ),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(fields=["status", "created_at"], name="dsch_batches_status"),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(fields=["created_at"], name="dsch_batches_created"),
        ),
        migrations.AddConstraint(
            model_name="batch",
            constraint=models.CheckConstraint(
                condition=django_durable_scheduler.constraints.OneOf("status", "open", "closed", "completed"),
                name="dsch_batch_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="batch",
            constraint=models.CheckConstraint(
                condition=django_durable_scheduler.constraints.SameTruth(
                    models.Q(("status", "open")), models.Q(("closed_at__isnull", True))
                ),
                name="dsch_batch_open_not_closed",
            ),
        ),
        migrations.AddConstraint(
            model_name="batch",
            constraint=models.CheckConstraint(
                condition=django_durable_scheduler.constraints.SameTruth(
                    models.Q(("status", "completed")), models.Q(("completed_at__isnull", False))
                ),
                name="dsch_batch_completed_at",
            ),
        ),
        # One row per unique or debounced enqueue, answering the same call again as it was
        # answered first (docs/design.md, "Unique keys and debounce").
        migrations.CreateModel(
            name="UniqueCall",
            fields=[
                ("call_key", models.CharField(max_length=77, primary_key=True, serialize=False)),
                ("payload_digest", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField()),
                (
                    "occurrence",
                    models.ForeignKey(
                        db_column="occurrence_id",
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="unique_calls",
                        to="durable_scheduler.occurrence",
                    ),
                ),
            ],
            options={
                "db_table": "durable_scheduler_unique_calls",
                "indexes": [models.Index(fields=["occurrence"], name="dsch_unique_calls_occurrence")],
            },
        ),
    ]
