"""``manage.py runscheduler``: parse and validate options, then run a Worker."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from ... import checks
from ...db.dialect import alias_for
from ...exceptions import InvalidArgument, SchedulerError
from ...handlers import declared, registry
from ...models import Occurrence
from ...tasks.handlers import any_queue, durable_queues, register_queue_handlers
from ...tasks.options import queue_kind, validate_queue
from ...worker import Worker, default_worker_id
from ...worker.supervisor import Supervisor
from .. import startup
from . import DATABASE_HELP, database_alias

logger = logging.getLogger("django_durable_scheduler")

# While the database does not answer: how often to try again, and to say so again.
RETRY_SECONDS = 1.0
WARN_EVERY_SECONDS = 30.0


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
        parser.add_argument(
            "--queues",
            type=_kinds,
            default=None,
            help="only run the django.tasks tasks of these queues (comma-separated; with --kinds: both)",
        )
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--burst", action="store_true", help="run until nothing is due, then exit")
        parser.add_argument(
            "--max-occurrences", type=_positive_int, default=None, help="exit after this many"
        )
        parser.add_argument("--grace", type=_seconds(0, 86400), default=30.0, help="shutdown grace seconds")
        parser.add_argument("--database", type=database_alias, default=None, help=DATABASE_HELP)
        parser.add_argument(
            "--processes",
            type=_positive_int,
            default=None,
            help="run this many worker processes under one supervisor, which replaces any that dies",
        )

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
        # A stop asked for while starting up (before the worker's own handlers) is recorded,
        # and the command then returns without running: no exit by the signal's default action.
        # Those recorded before the command ran (management/startup.py) count too.
        stopped: list[int] = []
        with _on_signals(stopped.append):
            stopped[:0] = startup.take()
            if options["processes"] is not None:
                self.supervise(options, stopped)
                return
            worker = self.prepare(options, stopped)
            if worker is None:
                logger.info("runscheduler: stopped by a signal before it started")
                return
            worker.install_signal_handlers()  # from here on, the worker's (the block keeps them)
            if stopped:  # came between the last look and the worker's handlers
                worker.stop()
        code = worker.run()
        if code:
            raise SystemExit(code)

    def supervise(self, options: dict[str, Any], stopped: list[int]) -> None:
        """``--processes N``: set up once, then run N forked workers under a Supervisor."""
        make_worker = self.prepare_workers(options, stopped)
        if make_worker is None:
            logger.info("runscheduler: stopped by a signal before it started")
            return
        code = Supervisor(
            processes=options["processes"],
            make_worker=make_worker,
            worker_id=options["worker_id"],
            grace=options["grace"],
            finite=bool(options["once"] or options["burst"] or options["max_occurrences"]),
            stopped=stopped,
            using=options["database"],
        ).run()
        if code:
            raise SystemExit(code)

    def prepare(self, options: dict[str, Any], stopped: list[int]) -> Worker | None:
        """The worker to run, after the database answers, the schema is migrated and the jobs
        declared in code are synced; None when a stop signal came first."""
        make_worker = self.prepare_workers(options, stopped)
        return None if make_worker is None else make_worker(options["worker_id"] or default_worker_id())

    def prepare_workers(self, options: dict[str, Any], stopped: list[int]) -> Callable[[str], Worker] | None:
        """What makes a worker of a given id, once the database answers, the schema is migrated
        and the jobs declared in code are synced; None when a stop signal came first."""
        registry.autodiscover()
        kinds = self.selected_kinds(options["kinds"], options["queues"])
        using = alias_for(options["database"])
        if not wait_for_database(using, stopped):
            return None
        self.check_migrated(using)
        try:
            declared.sync_declared_jobs(using=using)  # create/update the jobs declared in code
        except (SchedulerError, DatabaseError) as exc:
            raise CommandError(f"runscheduler: could not sync declared jobs: {exc}") from exc
        if stopped:
            return None
        return lambda worker_id: Worker(
            worker_id=worker_id,
            concurrency=options["concurrency"],
            lease=options["lease"],
            poll_interval=options["poll_interval"],
            kinds=kinds,
            once=options["once"],
            burst=options["burst"],
            max_occurrences=options["max_occurrences"],
            grace=options["grace"],
            using=using,
        )

    def selected_kinds(self, kinds: list[str] | None, queues: list[str] | None) -> list[str] | None:
        """The kinds to claim: ``--kinds``, plus the task kinds of ``--queues`` (each one a
        queue of a DurableBackend in ``settings.TASKS``, any name when one takes any)."""
        if queues is None:
            return kinds
        if any_queue():
            try:
                names = [validate_queue(queue, "--queues") for queue in queues]
            except InvalidArgument as exc:
                raise CommandError(f"runscheduler: {exc}") from None
            register_queue_handlers(names)
            return [*(kinds or []), *(queue_kind(name) for name in names)]
        configured = {queue for names in durable_queues().values() for queue in names}
        unknown = [queue for queue in queues if queue not in configured]
        if unknown:
            known = ", ".join(sorted(configured)) or "none"
            raise CommandError(
                f"runscheduler: --queues: {', '.join(unknown)} is not a queue of a DurableBackend "
                f"in settings.TASKS (configured: {known})"
            )
        return [*(kinds or []), *(queue_kind(queue) for queue in queues)]

    def check_migrated(self, using: str) -> None:
        """Refuse to start, in one line, on a database that lacks this app's migrations, or
        its tables (``migrate`` records migrations a router kept out of a database as applied)."""
        connection = connections[using]
        try:
            missing = checks.unapplied_migrations(connection)
            tables = set(connection.introspection.table_names())
        except DatabaseError as exc:
            message = " ".join(str(exc).split())
            raise CommandError(f"runscheduler: could not read the database's migrations: {message}") from exc
        if missing:
            raise CommandError(
                f"runscheduler: database '{using}' lacks migrations {', '.join(missing)}: "
                f"run `manage.py migrate --database {using}` first"
            )
        if Occurrence._meta.db_table not in tables:
            raise CommandError(
                f"runscheduler: database '{using}' has no table {Occurrence._meta.db_table}: run "
                f"`manage.py migrate --database {using}`, with routers whose allow_migrate lets this app in"
            )


def wait_for_database(using: str, stopped: list[int]) -> bool:
    """Wait until a connection to ``using`` opens: a worker may boot before its database (as
    in a compose file). Says so in one WARNING line at the first failure and every
    ``WARN_EVERY_SECONDS``; returns False when a stop signal (recorded in ``stopped`` by the
    caller's handlers) comes first."""
    connection = connections[using]
    started = time.monotonic()
    warned_at: float | None = None
    while not stopped:
        try:
            connection.ensure_connection()
            return True
        except DatabaseError as exc:
            now = time.monotonic()
            if warned_at is None or now - warned_at >= WARN_EVERY_SECONDS:
                warned_at = now
                logger.warning(
                    "runscheduler: waiting for database '%s' to answer (%.0f s so far, retrying every "
                    "%g s): %s",
                    using,
                    now - started,
                    RETRY_SECONDS,
                    " ".join(str(exc).split()),
                )
        # Short sleeps: a signal handler only records the signal (it may run while this
        # thread holds any lock, so it takes none), and the loop looks at it this often.
        retry_at = time.monotonic() + RETRY_SECONDS
        while not stopped and time.monotonic() < retry_at:
            time.sleep(0.05)
    return False


@contextmanager
def _on_signals(record: Callable[[int], None]) -> Iterator[None]:
    """SIGTERM and SIGINT are passed to ``record`` within the block (in the main thread only:
    elsewhere signals cannot be caught). After it the previous handlers come back, unless the
    block installed others (the worker's), which stay."""
    previous: dict[int, Any] = {}
    ours: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for stop in (signal.SIGTERM, signal.SIGINT):
            ours[stop] = lambda signum, _frame: record(signum)
            previous[stop] = signal.signal(stop, ours[stop])
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if signal.getsignal(signum) is ours[signum]:
                signal.signal(signum, handler)
