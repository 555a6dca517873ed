"""Budgets become optional: ``AuthorityPolicy.max_runs`` and ``max_units`` may be NULL (no
limit), and a policy with neither charges nothing and writes no reservation.

The default principal's policy stops holding work back: where every revision of a policy was
written by a default grant (a job created without an authority envelope) and its budget is
still the old default of 100,000 runs and units per window, nobody configured that budget, so
it is lifted (and so is that of a policy migration 0003 backfilled, which has no revision),
on the policy row and in its current revision's recorded content (the revision
number stays, so the jobs and occurrences bound to it stay bound). Backward: NULL limits go
back to 100,000, the old default.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

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
    dependencies = [
        ("durable_scheduler", "0008_paused_kinds"),
    ]

    operations = [
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
    ]
