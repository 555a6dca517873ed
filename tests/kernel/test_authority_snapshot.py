"""An occurrence's authority snapshot: stored without the envelope's default members, read
back as the normalized envelope by the ORM and by the claim's raw read alike
(``docs/design.md``, "Data model")."""

from __future__ import annotations

import json

import pytest
from django.db import connection

import django_durable_scheduler as scheduler
from django_durable_scheduler.kernel import claiming
from django_durable_scheduler.models import Job, Occurrence
from django_durable_scheduler.rules.authority import (
    compact_envelope,
    expand_envelope,
    normalize_authority,
)

from ..conftest import authority_for

pytestmark = pytest.mark.django_db

FULL = {
    "principal": {"type": "user", "id": "alice"},
    "tenantId": "t1",
    "workspaceId": "w1",
    "requestedCapabilities": ["reports.send"],
    "authorizationRefs": {"decisionId": "d1", "grantIds": ["g1"]},
}


def stored(occurrence_id: str) -> dict:
    """The column as the database holds it, past the field's conversion."""
    table = Occurrence._meta.db_table
    column = Occurrence._meta.get_field("authority").column
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {connection.ops.quote_name(column)} FROM {connection.ops.quote_name(table)}"
            f" WHERE {connection.ops.quote_name('occurrence_id')} = %s",
            [occurrence_id],
        )
        value = cursor.fetchone()[0]
    return value if isinstance(value, dict) else json.loads(value)


@pytest.mark.parametrize("authority", [authority_for("alice", "reports.send"), FULL])
def test_snapshot_is_stored_compact_and_read_whole(clock, authority):
    scheduler.set_policy("user", "alice", capabilities=["reports.send"], window=3600)
    scheduler.create_job("job-a", "reports.send", authority=authority)
    occurrence_id = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="k")[0].pk
    job = Job.objects.get(pk="job-a")
    raw = stored(occurrence_id)
    assert "schemaVersion" not in raw and None not in raw.values()
    assert raw == compact_envelope(job.authority)
    assert Occurrence.objects.get(pk=occurrence_id).authority == job.authority
    claimed = claiming.claim(owner="w1", lease=60)
    assert claimed is not None and claimed.authority == job.authority


def test_a_snapshot_stored_whole_is_read_as_it_is(clock):
    scheduler.set_policy("user", "alice", capabilities=["reports.send"], window=3600)
    scheduler.create_job("job-a", "reports.send", authority=authority_for("alice", "reports.send"))
    occurrence_id = scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="k")[0].pk
    whole = Job.objects.get(pk="job-a").authority
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET authority = %s", [json.dumps(whole)])
    assert stored(occurrence_id) == whole
    assert Occurrence.objects.get(pk=occurrence_id).authority == whole


def test_a_key_of_the_snapshot_is_read_as_it_is(clock):
    scheduler.set_policy("user", "alice", capabilities=["reports.send"], window=3600)
    scheduler.create_job("job-a", "reports.send", authority=authority_for("alice", "reports.send"))
    scheduler.enqueue("job-a", scheduled_for=clock(), trigger_key="k")
    assert list(Occurrence.objects.values_list("authority__principal", flat=True)) == [
        {"type": "user", "id": "alice"}
    ]
    assert Occurrence.objects.filter(authority__principal__id="alice").count() == 1


@pytest.mark.parametrize(
    "envelope",
    [
        authority_for("alice"),
        authority_for("alice", "a", "b"),
        FULL,
        {**FULL, "authorizationRefs": {"schedulerPolicyRevision": "scheduler-authority:3"}},
    ],
)
def test_compact_then_expand_is_the_normalized_envelope(envelope):
    normalized = normalize_authority(envelope)
    assert expand_envelope(compact_envelope(normalized)) == normalized
    assert expand_envelope(json.loads(json.dumps(compact_envelope(normalized)))) == normalized


def test_what_is_not_an_envelope_is_stored_as_it_is():
    for value in (None, 1, "x", [1], {"schemaVersion": True}):
        assert compact_envelope(value) == value
        assert expand_envelope(value) == value
