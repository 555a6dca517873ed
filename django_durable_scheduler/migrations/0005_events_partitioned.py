"""PostgreSQL: the events table partitioned by day of ``occurred_at``, converted in place with a
short lock (``_events_partitions`` says how); retention then drops whole days instead of
deleting row by row. SQLite and MySQL/MariaDB keep their plain table: nothing runs there.

Not atomic: the index the partition needs is built ``CONCURRENTLY``, which PostgreSQL refuses
inside a transaction; each step is its own transaction, and a step an interrupted run left
half done is undone and done again. The model state does not change: partitioning is the
database's layout of the same model.
"""

from __future__ import annotations

from django.db import migrations

from ._events_partitions import backward, forward


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("durable_scheduler", "0004_cancelled_status_schedules_and_records")]
    operations = [migrations.RunPython(forward, backward, elidable=False)]
