"""``manage.py runscheduler``: parse and validate options, then run a Worker."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from ... import checks, declared, registry
from ...exceptions import SchedulerError
from ...worker import Worker, default_worker_id


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(minimum: float, maximum: float) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be between {minimum:g} and {maximum:g} seconds, not {value:g}"
            )
        return value

    return parse


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if not kinds:
        raise argparse.ArgumentTypeError("give at least one kind, comma-separated")
    return kinds


class Command(BaseCommand):
    help = (
        "Run the durable scheduler: claim due occurrences, run their handlers, record outcomes. "
        "Exits 0 when stopped, 1 on an error, 3 when every handler thread is stuck past its "
        "timeout (restart it)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker-id", default=None, help="lease owner name (default host:pid)")
        parser.add_argument("--concurrency", type=_positive_int, default=8, help="handlers run at once (8)")
        parser.add_argument("--lease", type=_seconds(1, 86400), default=30.0, help="lease seconds")
        parser.add_argument(
            "--poll-interval", type=_seconds(0.01, 3600), default=1.0, help="idle poll seconds"
        )
        parser.add_argument(
            "--kinds", type=_kinds, default=None, help="only claim these kinds (comma-separated)"
        )
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--burst", action="store_true", help="run until nothing is due, then exit")
        parser.add_argument(
            "--max-occurrences", type=_positive_int, default=None, help="exit after this many"
        )
        parser.add_argument("--grace", type=_seconds(0, 86400), default=30.0, help="shutdown grace seconds")

    def handle(self, *args: Any, **options: Any) -> None:
        level = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}[
            options["verbosity"]
        ]
        logger = logging.getLogger("django_durable_scheduler")
        logger.setLevel(level)
        if not logger.handlers and not logging.getLogger().handlers:
            logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if options["once"] and options["burst"]:
            self.stderr.write("runscheduler: --once and --burst cannot be combined")
            raise SystemExit(2)
        registry.autodiscover()
        self.check_migrated()
        try:
            declared.sync_declared_jobs()  # create/update the jobs declared in code
        except (SchedulerError, DatabaseError) as exc:
            raise CommandError(f"runscheduler: could not sync declared jobs: {exc}") from exc
        worker = Worker(
            worker_id=options["worker_id"] or default_worker_id(),
            concurrency=options["concurrency"],
            lease=options["lease"],
            poll_interval=options["poll_interval"],
            kinds=options["kinds"],
            once=options["once"],
            burst=options["burst"],
            max_occurrences=options["max_occurrences"],
            grace=options["grace"],
        )
        worker.install_signal_handlers()
        code = worker.run()
        if code:
            raise SystemExit(code)

    def check_migrated(self) -> None:
        """Refuse to start, in one line, on a database that lacks this app's migrations."""
        try:
            missing = checks.unapplied_migrations(connections[DEFAULT_DB_ALIAS])
        except DatabaseError as exc:
            message = " ".join(str(exc).split())
            raise CommandError(f"runscheduler: could not read the database's migrations: {message}") from exc
        if missing:
            raise CommandError(
                f"runscheduler: the database lacks migrations {', '.join(missing)}: "
                "run `manage.py migrate` first"
            )
