"""``manage.py scheduler_sync``: create, update or disable the jobs declared in code."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...exceptions import SchedulerError
from ...handlers import declared, registry
from ...housekeeping import ops
from . import DATABASE_HELP, database_alias


class Command(BaseCommand):
    help = (
        "Import the handler modules, then create the jobs declared in code that are missing, "
        "update those that differ, and disable those an installed app no longer declares "
        "(never deletes a job)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.add_argument("--database", type=database_alias, default=None, help=DATABASE_HELP)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            registry.autodiscover()
            result = declared.sync_declared_jobs(using=options["database"])
        except SchedulerError as exc:
            raise CommandError(f"scheduler_sync: {exc}") from exc
        except DatabaseError as exc:
            raise CommandError(f"scheduler_sync: database error: {ops.first_line(exc)}") from exc
        if options["json"]:
            self.stdout.write(json.dumps(result))
            return
        for outcome in ("created", "updated", "unchanged", "disabled"):
            ids = result[outcome]
            self.stdout.write(f"{outcome}: {len(ids)}" + (f" ({', '.join(ids)})" if ids else ""))
