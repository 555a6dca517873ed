"""``manage.py scheduler_prune``: delete old terminal occurrences and their events."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...housekeeping import ops
from ...housekeeping.archive import ArchiveError
from . import DATABASE_HELP, database_alias


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if not 1 <= value <= ops.MAX_PRUNE_BATCH:
        raise argparse.ArgumentTypeError(f"must be between 1 and {ops.MAX_PRUNE_BATCH}, not {value}")
    return value


class Command(BaseCommand):
    help = (
        "Delete succeeded, dead-lettered and cancelled occurrences settled longer ago than "
        "--older-than, with their events, in batches. Jobs are kept, so no slot fires twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=ops.duration_argument,
            required=True,
            help="age: 30d, 12h, 90m, 3600s or plain seconds",
        )
        parser.add_argument(
            "--batch-size",
            type=_batch_size,
            default=ops.DEFAULT_PRUNE_BATCH,
            help=f"occurrences per transaction (default {ops.DEFAULT_PRUNE_BATCH})",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would go; write nothing")
        parser.add_argument(
            "--include-job-events",
            action="store_true",
            help="also delete events of no occurrence (job created/updated, skipped slots) "
            "older than the age",
        )
        parser.add_argument("--json", action="store_true", help="print the counts as JSON")
        parser.add_argument("--database", type=database_alias, default=None, help=DATABASE_HELP)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = ops.prune(
                options["older_than"],
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
                include_job_events=options["include_job_events"],
                using=options["database"],
            )
        except DatabaseError as exc:
            # Each batch is its own transaction: what was deleted before the error stays deleted.
            raise CommandError(f"scheduler_prune: database error: {ops.first_line(exc)}") from exc
        except ArchiveError as exc:
            # The chunk whose archive failed was not deleted; earlier chunks were, archived.
            raise CommandError(f"scheduler_prune: archive failed, its rows were kept: {exc}") from exc
        self.stdout.write(json.dumps(result.as_json()) if options["json"] else str(result))
