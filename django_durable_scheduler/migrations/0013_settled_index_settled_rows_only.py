"""The (status, settled_at) index holds settled rows only.

Its one reader is pruning (terminal rows settled before a cutoff: ``settled_at < cutoff``
implies the index's condition on PostgreSQL and SQLite). Queued, running and retrying rows had
entries that nothing read, written again at every status change: an enqueue, a claim and a
retry now write none. MySQL/MariaDB have no partial indexes: there it stays whole.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_scheduler", "0012_drop_fk_indexes_covered_by_composites"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="occurrence",
            name="dsch_occurrences_settled",
        ),
        migrations.AddIndex(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(("settled_at__isnull", False)),
                fields=["status", "settled_at"],
                name="dsch_occurrences_settled",
            ),
        ),
    ]
