"""PostgreSQL: the enqueue of one occurrence as a stored function, ``durable_scheduler_enqueue_v1``.

Enqueueing one occurrence is one statement: the guarded insert of the occurrence, its
``occurrence_enqueued`` event and the ``pg_notify`` wake-up. Sent as SQL text, PostgreSQL
plans that statement again on every call, and the planning cost as much as running it.
Django turns prepared statements off (they break transaction-mode connection poolers); a
PL/pgSQL function keeps its plans for the session instead, whatever sits between Django and
the server. The kernel calls it where it exists (see ``dialect.insert_enqueued``) and falls
back to the plain statement where it does not (a database built without migrations).

The function writes what it is given (the kernel builds every value) and decides nothing
but: the guard, when asked for, and whether the occurrence was already there.
Returns 1 (inserted, with its event and wake-up), 0 (an occurrence with this id or
idempotency key was there: nothing written) or -1 (the guard failed: nothing written).

``p_guard``: 0, none (the caller read the job row in this transaction); 1, the job row
must still hold this revision, ``enabled``, ``max_attempts`` and ``authority``; 2, and
also this payload (the occurrence takes the job's default payload).

Other databases: nothing to do. A later change of the function is a new ``_v2`` in a new
migration: this one keeps the SQL it shipped with.
"""

from __future__ import annotations

from django.db import migrations

SIGNATURE = (
    "durable_scheduler_enqueue_v1(text, text, integer, text, text, timestamptz, timestamptz,"
    " text, smallint, smallint, bigint, jsonb, jsonb, text, timestamptz, timestamptz,"
    " text, jsonb, integer, text)"
)

CREATE = """
CREATE OR REPLACE FUNCTION durable_scheduler_enqueue_v1(
    p_occurrence_id text,
    p_job_id text,
    p_job_revision integer,
    p_idempotency_key text,
    p_trigger_key text,
    p_scheduled_for timestamptz,
    p_available_at timestamptz,
    p_status text,
    p_attempt smallint,
    p_max_attempts smallint,
    p_fence bigint,
    p_authority jsonb,
    p_payload jsonb,
    p_principal_key text,
    p_created_at timestamptz,
    p_updated_at timestamptz,
    p_event_type text,
    p_event_data jsonb,
    p_guard integer,
    p_channel text
) RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_guard > 0 AND NOT EXISTS (
        SELECT 1 FROM durable_scheduler_jobs AS j
        WHERE j.job_id = p_job_id
          AND j.revision = p_job_revision
          AND j.enabled
          AND j.max_attempts = p_max_attempts
          AND j.authority = p_authority
          AND (p_guard = 1 OR j.payload IS NOT DISTINCT FROM p_payload)
    ) THEN
        RETURN -1;
    END IF;
    INSERT INTO durable_scheduler_occurrences (
        occurrence_id, job_id, job_revision, idempotency_key, trigger_key, scheduled_for,
        available_at, status, attempt, max_attempts, fence, authority, payload,
        principal_key, created_at, updated_at
    ) VALUES (
        p_occurrence_id, p_job_id, p_job_revision, p_idempotency_key, p_trigger_key,
        p_scheduled_for, p_available_at, p_status, p_attempt, p_max_attempts, p_fence,
        p_authority, p_payload, p_principal_key, p_created_at, p_updated_at
    )
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    INSERT INTO durable_scheduler_events (job_id, occurrence_id, event_type, occurred_at, data)
    VALUES (p_job_id, p_occurrence_id, p_event_type, p_created_at, p_event_data);
    IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, '');
    END IF;
    RETURN 1;
END
$$
"""


def create_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0010_drop_pattern_ops_indexes")]

    operations = [migrations.RunPython(create_function, drop_function, elidable=False)]
