"""``manage.py scheduler_restore_archive``: load archive files back into a database, for
inspection. Occurrences go in before their reservations and events; rows already there are
skipped, never overwritten; rows whose job (or occurrence) is gone are reported and skipped."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.storage import storages
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, transaction
from django.db.models import Model

from ... import conf
from ...db.dialect import alias_for
from ...housekeeping import ops
from ...housekeeping.archive import ArchiveError, Contents, read
from ...models import AuthorityReservation, Event, Job, Occurrence
from . import DATABASE_HELP, database_alias

# Loading order: what others point at first.
ORDER = (Occurrence, AuthorityReservation, Event)


def _storage_name(text: str | None) -> str:
    if text is None:
        archive = conf.settings.raw("ARCHIVE")
        text = archive.get("storage") if isinstance(archive, dict) else None
        text = text if isinstance(text, str) else "default"
    if text not in getattr(settings, "STORAGES", {}):
        known = ", ".join(sorted(getattr(settings, "STORAGES", {}))) or "none"
        raise CommandError(
            f"scheduler_restore_archive: --storage: {text!r} is not in STORAGES (it has: {known})"
        )
    return text


def _missing(model: type[Model], rows: list[Model], alias: str) -> tuple[list[Model], dict[str, int]]:
    """The rows whose job (and, for events and reservations, occurrence) exists; and how many
    of the others there were, by the missing job or occurrence."""
    jobs = {getattr(row, "job_id", None) for row in rows}
    present_jobs = set(Job.objects.using(alias).filter(pk__in=jobs).values_list("pk", flat=True))
    parents: set[Any] = set()
    if model is not Occurrence:
        wanted = {getattr(row, "occurrence_id", None) for row in rows} - {None}
        parents = set(Occurrence.objects.using(alias).filter(pk__in=wanted).values_list("pk", flat=True))
    kept: list[Model] = []
    gone: dict[str, int] = {}
    for row in rows:
        job_id = getattr(row, "job_id", None)
        occurrence_id = getattr(row, "occurrence_id", None) if model is not Occurrence else None
        if job_id not in present_jobs:
            gone[f"job {job_id!r}"] = gone.get(f"job {job_id!r}", 0) + 1
        elif occurrence_id is not None and occurrence_id not in parents:
            gone[f"occurrence {occurrence_id!r}"] = gone.get(f"occurrence {occurrence_id!r}", 0) + 1
        else:
            kept.append(row)
    return kept, gone


class Command(BaseCommand):
    help = (
        "Load scheduler archive files (what retention wrote before deleting) back into the "
        "database, for inspection: occurrences before their events; rows already present are skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="+", metavar="file", help="archive file name(s) in the storage")
        parser.add_argument(
            "--storage", default=None, help="a name in STORAGES (default: DURABLE_SCHEDULER_ARCHIVE's)"
        )
        parser.add_argument("--database", type=database_alias, default=None, help=DATABASE_HELP)
        parser.add_argument("--dry-run", action="store_true", help="read and report; write nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        storage = storages[_storage_name(options["storage"])]
        alias = alias_for(options["database"])
        try:
            files = [(name, read(storage, name)) for name in options["names"]]
        except ArchiveError as exc:
            raise CommandError(f"scheduler_restore_archive: {exc}") from exc
        files.sort(key=lambda item: ORDER.index(item[1].model) if item[1].model in ORDER else len(ORDER))
        for name, contents in files:
            try:
                self.stdout.write(self.load(name, contents, alias, options["dry_run"]))
            except DatabaseError as exc:
                raise CommandError(
                    f"scheduler_restore_archive: {name}: database error, nothing of it loaded: "
                    f"{ops.first_line(exc)}"
                ) from exc

    def load(self, name: str, contents: Contents, alias: str, dry_run: bool) -> str:
        """Load one file's rows in one transaction; returns what happened, in a line or more."""
        model, rows = contents.model, contents.rows
        manager = model._default_manager.using(alias)
        with transaction.atomic(using=alias):
            present: set[Any] = set()
            pks = [row.pk for row in rows]
            for start in range(0, len(pks), 900):
                present.update(manager.filter(pk__in=pks[start : start + 900]).values_list("pk", flat=True))
            fresh = [row for row in rows if row.pk not in present]
            loadable, gone = _missing(model, fresh, alias)
            if not dry_run:
                manager.bulk_create(loadable, batch_size=500)
        verb = "would restore" if dry_run else "restored"
        plural = model._meta.verbose_name_plural
        lines = [
            f"{name}: {verb} {len(loadable)} {plural} ({contents.period[0]} .. {contents.period[1]}), "
            f"skipped {len(present)} already present"
        ]
        lines += [f"  skipped {n} of {what}, which no longer exists" for what, n in sorted(gone.items())]
        return "\n".join(lines)
