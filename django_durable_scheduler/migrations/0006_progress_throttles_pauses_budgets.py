"""What the app added after 0.1.0's schema and the events' partitions, in one step:

- ``Occurrence.progress``: a running handler's last progress report (``ctx.report_progress``),
  shown to operators in the admin; a nullable column, so adding it rewrites no row.
- Throttles: ``ThrottleBucket`` (a key's next free start), ``ThrottlePlace`` (the start a
  throttled occurrence was given) and a ``throttle`` on jobs and authority policies.
- ``PausedKind``: a row per kind that no worker claims while it exists.
- Optional budgets: ``AuthorityPolicy.max_runs`` and ``max_units`` may be NULL (no limit), and
  a policy with neither charges nothing and writes no reservation. The default principal's
  policy stops holding work back: where every revision of a policy was written by a default
  grant (a job created without an authority envelope) and its budget is still the old default
  of 100,000 runs and units per window, nobody configured that budget, so it is lifted (and so
  is that of a policy migration 0003 backfilled, which has no revision), on the policy row and
  in its current revision's recorded content (the revision number stays, so the jobs and
  occurrences bound to it stay bound). Backward: NULL limits go back to 100,000, the old
  default.
- ``Occurrence.authority`` stores its snapshot without the envelope's default members and
  reads it back whole (``fields.EnvelopeField``). The column is unchanged; rows stored whole
  before are read as they are, so no row is rewritten.

It replaces the five migrations these came in while the app was unreleased: a database that
applied them all is left as it is.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

import django_durable_scheduler.fields

OLD_DEFAULT = 100_000
GRANT_NOTE = "durable_scheduler: job "  # policies.grant_default's changed_by
BACKFILL_WINDOW_MS = 24 * 60 * 60 * 1000  # migration 0003's policies


def _set_budget(apps: Any, schema_editor: Any, old: int | None, new: int | None, granted_only: bool) -> None:
    """Every limit at ``old`` becomes ``new``, on the policy row and in its current revision's
    content; ``granted_only``: only on policies that default grants alone ever wrote."""
    alias = schema_editor.connection.alias
    policies = apps.get_model("durable_scheduler", "AuthorityPolicy").objects.using(alias)
    history = apps.get_model("durable_scheduler", "AuthorityPolicyRevision").objects.using(alias)
    at_old = (
        models.Q(max_runs=old, max_units=old)
        if old is not None
        else (models.Q(max_runs__isnull=True) | models.Q(max_units__isnull=True))
    )
    for policy in policies.filter(at_old):
        revisions = history.filter(principal_type=policy.principal_type, principal_id=policy.principal_id)
        # A policy with no revision at the backfill's window is migration 0003's, written
        # before revisions were kept: nobody configured its budget either.
        backfilled = not revisions.exists() and policy.window_ms == BACKFILL_WINDOW_MS
        if (
            granted_only
            and not backfilled
            and (not revisions.exists() or revisions.exclude(changed_by__startswith=GRANT_NOTE).exists())
        ):
            continue
        for name in ("max_runs", "max_units"):
            if getattr(policy, name) == old:
                setattr(policy, name, new)
        policy.save(update_fields=["max_runs", "max_units"])
        current = revisions.filter(revision=policy.revision).first()
        if current is not None and isinstance(current.content, dict):
            current.content = {**current.content, "max_runs": policy.max_runs, "max_units": policy.max_units}
            current.save(update_fields=["content"])


def lift_default_budgets(apps: Any, schema_editor: Any) -> None:
    _set_budget(apps, schema_editor, OLD_DEFAULT, None, granted_only=True)


def restore_default_budgets(apps: Any, schema_editor: Any) -> None:
    _set_budget(apps, schema_editor, None, OLD_DEFAULT, granted_only=False)


class Migration(migrations.Migration):
    replaces = [
        ("durable_scheduler", "0006_occurrence_progress"),
        ("durable_scheduler", "0007_throttles"),
        ("durable_scheduler", "0008_paused_kinds"),
        ("durable_scheduler", "0009_policy_budget_optional"),
        ("durable_scheduler", "0010_occurrence_authority_compact"),
    ]

    dependencies = [
        ("durable_scheduler", "0005_events_partitioned"),
    ]

    operations = [
        migrations.AddField(
            model_name="occurrence",
            name="progress",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.CreateModel(
            name="ThrottleBucket",
            fields=[
                ("bucket_id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("scope", models.JSONField(default=list)),
                ("tat", models.DateTimeField()),
                ("horizon", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_scheduler_throttle_buckets",
            },
        ),
        migrations.CreateModel(
            name="ThrottlePlace",
            fields=[
                ("occurrence_id", models.CharField(max_length=68, primary_key=True, serialize=False)),
                ("slot", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_scheduler_throttle_places",
            },
        ),
        migrations.AddField(
            model_name="authoritypolicy",
            name="throttle",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="throttle",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.CreateModel(
            name="PausedKind",
            fields=[
                ("kind", models.CharField(max_length=128, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField()),
                ("paused_by", models.CharField(blank=True, default="", max_length=256)),
            ],
            options={
                "verbose_name": "paused kind",
                "db_table": "durable_scheduler_paused_kinds",
                "ordering": ["kind"],
            },
        ),
        migrations.RemoveConstraint(
            model_name="authoritypolicy",
            name="dsch_policy_max_runs_range",
        ),
        migrations.RemoveConstraint(
            model_name="authoritypolicy",
            name="dsch_policy_max_units_range",
        ),
        migrations.AlterField(
            model_name="authoritypolicy",
            name="max_runs",
            field=models.PositiveIntegerField(blank=True, default=None, null=True),
        ),
        migrations.AlterField(
            model_name="authoritypolicy",
            name="max_units",
            field=models.PositiveIntegerField(blank=True, default=None, null=True),
        ),
        migrations.AddConstraint(
            model_name="authoritypolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("max_runs__isnull", True),
                    models.Q(("max_runs__gte", 1), ("max_runs__lte", 1000000)),
                    _connector="OR",
                ),
                name="dsch_policy_max_runs_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="authoritypolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("max_units__isnull", True),
                    models.Q(("max_units__gte", 1), ("max_units__lte", 1000000)),
                    _connector="OR",
                ),
                name="dsch_policy_max_units_range",
            ),
        ),
        migrations.RunPython(lift_default_budgets, restore_default_budgets),
        migrations.AlterField(
            model_name="occurrence",
            name="authority",
            field=django_durable_scheduler.fields.EnvelopeField(),
        ),
    ]
