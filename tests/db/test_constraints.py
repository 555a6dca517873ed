"""The occurrence table's check constraints, on every database: each refuses the rows it
should and holds the rows the kernel writes, whether the database or Django's model
validation checks it. Migration 0004 writes the status, lease and settled checks in their
compact form (``constraints.OneOf``/``SameTruth``) on every database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from django_durable_scheduler import kernel
from django_durable_scheduler.constraints import OneOf, SameTruth
from django_durable_scheduler.models import TERMINAL_STATUSES, Occurrence, OccurrenceStatus

pytestmark = pytest.mark.django_db

# Column values of an occurrence in each status, as the kernel leaves them.
LEASE = {"lease_owner": "w1", "lease_expires_at": "lease"}
NO_LEASE = {"lease_owner": None, "lease_expires_at": None}


def _valid(status: str, at) -> dict:
    lease = {"lease_owner": "w1", "lease_expires_at": at} if status == "running" else NO_LEASE
    settled = at if status in TERMINAL_STATUSES else None
    return {"status": status, **lease, "settled_at": settled, "attempt": 1 if status != "queued" else 0}


# (what is wrong, the constraint named in the error, changes from a valid row of that status)
BAD = [
    ("unknown status", "dsch_occ_status_valid", "queued", {"status": "paused"}),
    ("status in capitals", "dsch_occ_status_valid", "queued", {"status": "QUEUED"}),
    ("running without a lease", "dsch_occ_running_has_lease", "running", {**NO_LEASE}),
    ("running without an owner", "dsch_occ_running_has_lease", "running", {"lease_owner": None}),
    ("running without an expiry", "dsch_occ_running_has_lease", "running", {"lease_expires_at": None}),
    ("queued with a lease", "dsch_occ_running_has_lease", "queued", {**LEASE}),
    ("queued with an owner only", "dsch_occ_running_has_lease", "queued", {"lease_owner": "w1"}),
    (
        "waiting with an expiry only",
        "dsch_occ_running_has_lease",
        "retry_wait",
        {"lease_expires_at": "lease"},
    ),
    ("succeeded with a lease", "dsch_occ_running_has_lease", "succeeded", {**LEASE}),
    ("succeeded, not settled", "dsch_occ_terminal_settled", "succeeded", {"settled_at": None}),
    ("cancelled, not settled", "dsch_occ_terminal_settled", "cancelled", {"settled_at": None}),
    ("dead letter, not settled", "dsch_occ_terminal_settled", "dead_letter", {"settled_at": None}),
    ("queued but settled", "dsch_occ_terminal_settled", "queued", {"settled_at": "now"}),
    ("running but settled", "dsch_occ_terminal_settled", "running", {"settled_at": "now"}),
    ("more attempts than allowed", "dsch_occ_attempt_range", "retry_wait", {"attempt": 4}),
]


@pytest.fixture
def occurrence(job, clock):
    occ, _ = kernel.enqueue("job-a", scheduled_for=clock(), trigger_key="c")
    return occ


def _resolve(changes: dict, at) -> dict:
    return {k: (at if v in ("lease", "now") else v) for k, v in changes.items()}


def _bad(status: str, changes: dict, at) -> dict:
    """A valid row of ``status`` with ``changes`` made to it."""
    return {**_valid(status, at), **_resolve(changes, at)}


@pytest.mark.parametrize("status", [s.value for s in OccurrenceStatus])
def test_every_status_as_the_kernel_leaves_it_is_held(occurrence, clock, status):
    values = _valid(status, clock() + timedelta(seconds=30))
    assert Occurrence.objects.filter(pk=occurrence.pk).update(**values) == 1
    stored = Occurrence.objects.get(pk=occurrence.pk)
    assert stored.status == status
    stored.validate_constraints()  # Django's own check of the same conditions


@pytest.mark.parametrize(("what", "name", "status", "changes"), BAD, ids=[b[0] for b in BAD])
def test_the_database_refuses_a_row_that_breaks_a_constraint(occurrence, clock, what, name, status, changes):
    at = clock() + timedelta(seconds=30)
    values = _bad(status, changes, at)
    before = Occurrence.objects.filter(pk=occurrence.pk).values().get()
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        Occurrence.objects.filter(pk=occurrence.pk).update(**values)
    if connection.vendor != "sqlite" or connection.Database.sqlite_version_info >= (3, 38):
        # SQLite names the constraint from 3.38 on ("CHECK constraint failed: <name>").
        assert name in str(caught.value)
    assert Occurrence.objects.filter(pk=occurrence.pk).values().get() == before


@pytest.mark.parametrize(("what", "name", "status", "changes"), BAD, ids=[b[0] for b in BAD])
def test_model_validation_names_the_broken_constraint(occurrence, clock, what, name, status, changes):
    if connection.vendor == "mysql" and what == "status in capitals":
        # Django validates by comparing literals in a SELECT, under the connection's
        # case-insensitive collation; the table's own check is case-sensitive (tested above).
        pytest.skip("MySQL compares the literals case-insensitively")
    at = clock() + timedelta(seconds=30)
    for field, value in _bad(status, changes, at).items():
        setattr(occurrence, field, value)
    with pytest.raises(ValidationError) as caught:
        occurrence.validate_constraints()
    assert name in str(caught.value)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the compact form is PostgreSQL's")
def test_postgresql_stores_the_compact_forms():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = 'durable_scheduler_occurrences'::regclass AND contype = 'c'"
        )
        stored = dict(cursor.fetchall())
    assert stored["dsch_occ_status_valid"] == (
        "CHECK (((status)::text = ANY"
        " ('{queued,running,retry_wait,succeeded,dead_letter,cancelled}'::text[])))"
    )
    assert stored["dsch_occ_terminal_settled"] == (
        "CHECK ((((status)::text = ANY ('{succeeded,dead_letter,cancelled}'::text[]))"
        " = (settled_at IS NOT NULL)))"
    )
    assert stored["dsch_occ_running_has_lease"] == (
        "CHECK (((((status)::text = 'running'::text) = (lease_owner IS NOT NULL))"
        " AND ((lease_owner IS NOT NULL) = (lease_expires_at IS NOT NULL))))"
    )


@pytest.mark.parametrize("value", ["", "Queued", "a b", "it's", "x;y", 7, None])
def test_one_of_takes_plain_identifiers_only(value):
    with pytest.raises(ValueError, match="lowercase identifiers"):
        OneOf("status", "queued", value)


def test_one_of_needs_a_value():
    with pytest.raises(ValueError, match="at least one value"):
        OneOf("status")


def test_expressions_compare_and_deconstruct_by_their_arguments():
    from django.db.models import Q

    a = SameTruth(OneOf("status", "queued", "running"), Q(settled_at__isnull=True))
    assert a == SameTruth(OneOf("status", "queued", "running"), Q(settled_at__isnull=True))
    assert a != SameTruth(OneOf("status", "queued"), Q(settled_at__isnull=True))
    path, args, kwargs = OneOf("status", "queued").deconstruct()
    assert (path, args, kwargs) == ("django_durable_scheduler.constraints.OneOf", ("status", "queued"), {})


COMPACT = ("dsch_occ_status_valid", "dsch_occ_running_has_lease", "dsch_occ_terminal_settled")


@pytest.mark.django_db(transaction=True)
def test_a_table_built_from_the_models_refuses_the_same_rows(clock):
    """The constraints as the models declare them, built into a table of their own by the
    schema editor (as ``--nomigrations`` builds them), refuse the same rows as the migrated
    table: the models and the migrations hold the same conditions."""
    from django.db import models
    from django.test.utils import isolate_apps

    at = clock() + timedelta(seconds=30)
    with isolate_apps("django_durable_scheduler"):

        class Probe(models.Model):
            status = models.CharField(max_length=16)
            lease_owner = models.CharField(max_length=256, null=True)
            lease_expires_at = models.DateTimeField(null=True)
            settled_at = models.DateTimeField(null=True)

            class Meta:
                app_label = "durable_scheduler"
                db_table = "dsch_test_constraint_probe"
                constraints = [
                    models.CheckConstraint(
                        condition=c.condition, name=c.name.replace("dsch_occ_", "dsch_probe_")
                    )
                    for c in Occurrence._meta.constraints
                    if c.name in COMPACT
                ]

            def __str__(self) -> str:
                return self.status

        with connection.schema_editor() as editor:
            editor.create_model(Probe)
        try:
            for status in OccurrenceStatus:
                values = {k: v for k, v in _valid(status.value, at).items() if k != "attempt"}
                Probe.objects.create(**values)
            for what, name, status, changes in BAD:
                if name not in COMPACT:
                    continue
                values = _bad(status, changes, at)
                values.pop("attempt")
                with pytest.raises(IntegrityError) as caught, transaction.atomic():
                    Probe.objects.create(**values)
                if connection.vendor != "sqlite" or connection.Database.sqlite_version_info >= (3, 38):
                    assert name.replace("dsch_occ_", "dsch_probe_") in str(caught.value), what
            assert Probe.objects.count() == len(OccurrenceStatus)
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(Probe)
