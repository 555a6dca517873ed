"""SQLite: ``durable_scheduler_enqueue_v2``, the enqueue of one occurrence as one statement.

What PostgreSQL's function of migration 0015 does, as a view with an ``INSTEAD OF INSERT``
trigger: ``INSERT INTO durable_scheduler_enqueue_v2 (...) VALUES (...)`` inserts the
occurrence unless one with its id or idempotency key is there (``ON CONFLICT DO NOTHING``:
uniqueness only, a failed check is an error), from a ``SELECT`` that checks the guard, and
then, only if it inserted, its ``occurrence_enqueued`` event. One statement is atomic by
itself: outside a transaction SQLite commits it as it ends, inside one it is part of it,
with no savepoint. Before, the one-by-one enqueue sent ``BEGIN IMMEDIATE``, the occurrence,
the event and ``COMMIT`` as four statements.

The columns are the function's parameters, without the channel (SQLite's wake-up is sent by
the caller, see ``dialect.notify_new_work``); ``guard`` has the function's meaning (0 none;
1 the job row must still hold this revision, ``enabled``, ``max_attempts`` and
``authority``; 2 and this payload too). The JSON columns arrive as the text that Django
stores (``json.dumps``), so that the guard's text comparisons hold. A view answers no
value: the caller reads how many rows the statement wrote from the connection's change
count (2, or 0 with nothing written) and, when nothing was written under a guard, asks
whether the guard failed.

Its trigger names the jobs, occurrences and events tables, and SQLite checks every trigger
when a table is renamed: a later migration that makes Django rebuild one of these tables on
SQLite drops the view first and creates it again after (as a later PostgreSQL function is a
new migration). Other databases: nothing to do.
"""

from __future__ import annotations

from django.db import migrations

VIEW = "durable_scheduler_enqueue_v2"
COLUMNS = (
    "occurrence_id",
    "job_id",
    "job_revision",
    "idempotency_key",
    "trigger_key",
    "scheduled_for",
    "available_at",
    "max_attempts",
    "authority",
    "payload",
    "principal_key",
    "now",
    "event_data",
    "guard",
)

CREATE_VIEW = f"CREATE VIEW {VIEW} ({', '.join(COLUMNS)}) AS SELECT {', '.join(['NULL'] * len(COLUMNS))}"

CREATE_TRIGGER = f"""
CREATE TRIGGER {VIEW}_insert INSTEAD OF INSERT ON {VIEW}
BEGIN
    INSERT INTO durable_scheduler_occurrences (
        occurrence_id, job_id, job_revision, idempotency_key, trigger_key, scheduled_for,
        available_at, status, attempt, max_attempts, fence, authority, payload,
        principal_key, created_at, updated_at
    )
    SELECT
        NEW.occurrence_id, NEW.job_id, NEW.job_revision, NEW.idempotency_key, NEW.trigger_key,
        NEW.scheduled_for, NEW.available_at, 'queued', 0, NEW.max_attempts, 0, NEW.authority,
        NEW.payload, NEW.principal_key, NEW.now, NEW.now
    WHERE NEW.guard = 0 OR EXISTS (
        SELECT 1 FROM durable_scheduler_jobs AS j
        WHERE j.job_id = NEW.job_id
          AND j.revision = NEW.job_revision
          AND j.enabled
          AND j.max_attempts = NEW.max_attempts
          AND j.authority = NEW.authority
          AND (NEW.guard = 1 OR j.payload IS NEW.payload)
    )
    ON CONFLICT DO NOTHING;
    INSERT INTO durable_scheduler_events (job_id, occurrence_id, event_type, occurred_at, data)
    SELECT NEW.job_id, NEW.occurrence_id, 'occurrence_enqueued', NEW.now, NEW.event_data
    WHERE changes() > 0;
END
"""


def create_view(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(CREATE_VIEW)
        schema_editor.execute(CREATE_TRIGGER)


def drop_view(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP VIEW IF EXISTS {VIEW}")  # its trigger goes with it


class Migration(migrations.Migration):
    dependencies = [("durable_scheduler", "0015_enqueue_function_v2")]

    operations = [migrations.RunPython(create_view, drop_view, elidable=False)]
