"""Everything the scheduler adds to the seed's v2 tables, up to today's models.

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
- The occurrence table's status, lease and settled checks written with ``constraints.OneOf``
  and ``constraints.SameTruth``: the same conditions in a smaller form, of which PostgreSQL
  rebuilds about half as much for each statement that writes a row (see ``constraints.py``).

Expand, then data, then contract: the checks that would refuse ``cancelled`` come off and the
new columns and tables go in; the data steps fill them; then the checks come back in their new
form and the indexes are built over the filled columns. Backward runs the same steps in the
opposite order: the ``cancelled`` occurrences become dead letters before the seed's checks
come back.
"""

from __future__ import annotations

import json
from typing import Any

import django.db.models.deletion
from django.db import migrations, models

import django_durable_scheduler.constraints
from django_durable_scheduler.migrations._batch import batches, update_columns

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
    """Backward only: a status the seed's v2 does not know. Cancelled occurrences become dead
    letters (both terminal and settled, so the seed's checks hold again); the cancellation
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
    """Each scheduled job's first fire time, strictly after now.

    This step alone calls the app's live code (``triggers.validate_trigger`` and
    ``schedules.initial_fire_time``), deliberately. The answer needs the whole trigger engine
    (cron through croniter, IANA zones, daylight-saving rules, catch-up windows): too much to
    freeze here. And ``next_fire_at`` is a cache of the live engine's answer, which the
    scheduler computes again from the trigger whenever the trigger changes: a frozen copy
    could only store a time that the running code would not have chosen.
    """
    from django.utils import timezone

    from django_durable_scheduler.exceptions import InvalidArgument
    from django_durable_scheduler.schedules import initial_fire_time
    from django_durable_scheduler.triggers import validate_trigger

    Job = apps.get_model(APP, "Job")
    now = timezone.now()
    for rows in batches(Job, schema_editor.connection.alias, ["trigger", "created_at"]):
        scheduled = []
        for row in rows:
            try:
                trigger = validate_trigger(row.trigger or {})
            except InvalidArgument:
                continue  # an invalid stored trigger never fires; update_job can repair it
            row.next_fire_at = initial_fire_time(trigger, now=now, anchor=row.created_at)
            if row.next_fire_at is not None:
                scheduled.append(row)
        update_columns(Job, schema_editor, scheduled, "next_fire_at")


# The keys whose PostgreSQL ``varchar_pattern_ops`` twins go, as (model, field). The twins of
# the three foreign keys above went with their single-column indexes.
PATTERN_TWINS = (
    ("occurrence", "occurrence_id"),
    ("occurrence", "idempotency_key"),
    ("authorityreservation", "occurrence"),
    ("authorityreservation", "job"),
)


def _pattern_twins(apps: Any, schema_editor: Any) -> Any:
    for model_name, field_name in PATTERN_TWINS:
        model = apps.get_model(APP, model_name)
        field = model._meta.get_field(field_name)
        yield (
            model,
            field,
            schema_editor._create_index_name(model._meta.db_table, [field.column], suffix="_like"),
        )


def drop_pattern_twins(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: drop the ``<index>_like`` twins of the occurrences' and reservations' keys.

    Django adds one next to every indexed or unique ``CharField`` on PostgreSQL, for
    ``LIKE 'prefix%'`` lookups outside the C locale. Nothing here looks these keys up by
    prefix, and each is one more index written on every insert and status change of these
    rows. A later ``AlterField`` on these columns works with or without the twins: Django
    drops one with ``DROP INDEX IF EXISTS``, and makes one only where the ``AlterField`` adds
    an index or changes the column's type (tests/test_migrations.py runs such changes). Names
    and statements come from the schema editor, as Django makes them. Other databases have no
    such indexes.
    """
    if schema_editor.connection.vendor != "postgresql":
        return
    for model, _, name in _pattern_twins(apps, schema_editor):
        schema_editor.execute(schema_editor._delete_index_sql(model, name))  # IF EXISTS


def restore_pattern_twins(apps: Any, schema_editor: Any) -> None:
    """Backward: each twin as Django makes it, unless a later change has made it already."""
    if schema_editor.connection.vendor != "postgresql":
        return
    connection = schema_editor.connection
    for model, field, name in _pattern_twins(apps, schema_editor):
        with connection.cursor() as cursor:
            present = connection.introspection.get_constraints(cursor, model._meta.db_table)
        if name not in present:
            schema_editor.execute(schema_editor._create_like_index_sql(model, field))


TERMINAL = ("succeeded", "dead_letter", "cancelled")


class Migration(migrations.Migration):
    dependencies = [(APP, "0003_authority_backfill")]

    operations = [
        # Expand. The seed's status, lease and settled checks come off: the first two would
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
    ]
