"""``manage.py scheduler_pause``: pause or resume kinds on every worker, or list the paused."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, transaction

from ... import kernel
from ...db import dialect
from ...exceptions import SchedulerError
from ...housekeeping import ops
from ...rules.validation import iso_ms
from ...tasks.options import queue_kind
from . import DATABASE_HELP, database_alias


class Command(BaseCommand):
    help = (
        "Pause kinds on every worker (no worker claims their occurrences from the next poll on; "
        "running ones finish), resume them with --resume, or list the paused kinds (no kind given)."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kinds", nargs="*", metavar="kind", help="handler kinds (none: list the paused)")
        parser.add_argument("--resume", action="store_true", help="resume the kinds instead")
        parser.add_argument(
            "--queue",
            action="store_true",
            help="the names are django.tasks queues (kind django.tasks:<queue>)",
        )
        parser.add_argument("--by", default="manage.py scheduler_pause", help="who, for the audit events")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.add_argument("--database", type=database_alias, default=None, help=DATABASE_HELP)

    def handle(self, *args: Any, **options: Any) -> None:
        kinds = [queue_kind(name) if options["queue"] else name for name in options["kinds"]]
        using = options["database"]
        change = kernel.resume if options["resume"] else kernel.pause
        changed: dict[str, bool] = {}
        try:
            # All the kinds or none: a bad one leaves the others as they were.
            with transaction.atomic(using=dialect.alias_for(using)):
                for kind in kinds:
                    changed[kind] = change(kind, by=options["by"], using=using)
            paused = kernel.paused_kinds(using=using)
        except SchedulerError as exc:
            raise CommandError(f"scheduler_pause: {exc}") from exc
        except DatabaseError as exc:
            raise CommandError(f"scheduler_pause: database error: {ops.first_line(exc)}") from exc
        rows = [{"kind": p.kind, "paused_at": iso_ms(p.paused_at), "paused_by": p.paused_by} for p in paused]
        if options["json"]:
            self.stdout.write(json.dumps({"changed": changed, "paused": rows}))
            return
        verb = "resumed" if options["resume"] else "paused"
        for kind, done in changed.items():
            self.stdout.write(f"{kind}: {verb}" if done else f"{kind}: already {verb}, unchanged")
        self.stdout.write(f"paused kinds: {len(rows)}")
        for row in rows:
            self.stdout.write(f"  {row['kind']} since {row['paused_at']} by {row['paused_by'] or '-'}")
