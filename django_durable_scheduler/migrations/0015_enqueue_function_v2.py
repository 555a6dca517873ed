"""PostgreSQL: ``durable_scheduler_enqueue_v2``, the enqueue of one occurrence with its guard
inside the insert.

Version 1 (migration 0011) read the job row for the guard in one statement and inserted in
the next. Version 2 inserts ``SELECT ... FROM durable_scheduler_jobs WHERE <guard>``: one
statement, whose snapshot is both the guard's and the insert's. It also takes fewer
parameters: a new occurrence is queued, at attempt 0 and fence 0, created and updated at the
same time, and its event is ``occurrence_enqueued``. With migration 0014, the server's CPU
time for a one-by-one enqueue went from 412-475 to 327-335 us a call (medians of two runs
of 7 x 2,000 calls, on a slow day of this project's test machine; README, performance
section).

Returns what version 1 returns: 1 (inserted, with its event and wake-up), 0 (an
occurrence with this id or idempotency key was there: nothing written) or -1 (the guard
failed: nothing written). The guard, as in version 1: ``p_guard`` 0, none (the caller read
the job row in this transaction); 1, the job row must still hold this revision,
``enabled``, ``max_attempts`` and ``authority``; 2, and also this payload. When the guard
fails and the occurrence is there as well, the guard's failure is the answer, as in
version 1: the caller reads the job again.

Version 1 stays: a process started before this migration calls it until it restarts. A
later migration drops it. Other databases: nothing to do.
"""

from __future__ import annotations

from django.db import migrations

SIGNATURE = (
    "durable_scheduler_enqueue_v2(text, text, integer, text, text, timestamptz, timestamptz,"
    " smallint, jsonb, jsonb, text, timestamptz, jsonb, integer, text)"
)

CREATE = """
CREATE OR REPLACE FUNCTION durable_scheduler_enqueue_v2(
    p_occurrence_id text,
    p_job_id text,
    p_job_revision integer,
    p_idempotency_key text,
    p_trigger_key text,
    p_scheduled_for timestamptz,
    p_available_at timestamptz,
    p_max_attempts smallint,
    p_authority jsonb,
    p_payload jsonb,
    p_principal_key text,
    p_now timestamptz,
    p_event_data jsonb,
    p_guard integer,
    p_channel text
) RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_guard = 0 THEN
        INSERT INTO durable_scheduler_occurrences (
            occurrence_id, job_id, job_revision, idempotency_key, trigger_key, scheduled_for,
            available_at, status, attempt, max_attempts, fence, authority, payload,
            principal_key, created_at, updated_at
        ) VALUES (
            p_occurrence_id, p_job_id, p_job_revision, p_idempotency_key, p_trigger_key,
            p_scheduled_for, p_available_at, 'queued', 0, p_max_attempts, 0, p_authority,
            p_payload, p_principal_key, p_now, p_now
        )
        ON CONFLICT DO NOTHING;
    ELSE
        INSERT INTO durable_scheduler_occurrences (
            occurrence_id, job_id, job_revision, idempotency_key, trigger_key, scheduled_for,
            available_at, status, attempt, max_attempts, fence, authority, payload,
            principal_key, created_at, updated_at
        )
        SELECT
            p_occurrence_id, p_job_id, p_job_revision, p_idempotency_key, p_trigger_key,
            p_scheduled_for, p_available_at, 'queued', 0, p_max_attempts, 0, p_authority,
            p_payload, p_principal_key, p_now, p_now
        FROM durable_scheduler_jobs AS j
        WHERE j.job_id = p_job_id
          AND j.revision = p_job_revision
          AND j.enabled
          AND j.max_attempts = p_max_attempts
          AND j.authority = p_authority
          AND (p_guard = 1 OR j.payload IS NOT DISTINCT FROM p_payload)
        ON CONFLICT DO NOTHING;
    END IF;
    IF NOT FOUND THEN
        -- Nothing inserted: the occurrence was there, or the guard failed, or both.
        IF p_guard = 0 THEN
            RETURN 0;
        END IF;
        IF NOT EXISTS (
            SELECT 1 FROM durable_scheduler_jobs AS j
            WHERE j.job_id = p_job_id
              AND j.revision = p_job_revision
              AND j.enabled
              AND j.max_attempts = p_max_attempts
              AND j.authority = p_authority
              AND (p_guard = 1 OR j.payload IS NOT DISTINCT FROM p_payload)
        ) OR NOT EXISTS (
            -- No occurrence either: the guard failed at the insert, and the job changed since.
            SELECT 1 FROM durable_scheduler_occurrences AS o
            WHERE o.occurrence_id = p_occurrence_id OR o.idempotency_key = p_idempotency_key
        ) THEN
            RETURN -1;
        END IF;
        RETURN 0;
    END IF;
    INSERT INTO durable_scheduler_events (job_id, occurrence_id, event_type, occurred_at, data)
    VALUES (p_job_id, p_occurrence_id, 'occurrence_enqueued', p_now, p_event_data);
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
    dependencies = [("durable_scheduler", "0014_compact_occurrence_checks")]

    operations = [migrations.RunPython(create_function, drop_function, elidable=False)]
