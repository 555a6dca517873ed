"""System checks with stable ids (``durable_scheduler.E001`` ...), each with a hint.

- ``E001`` a handler module of an installed app fails to import (when Django started, or now).
- ``E002`` a registered handler is not callable, or its ``units`` are not 1..1,000,000.
- ``E003`` a ``DURABLE_SCHEDULER_*`` setting has the wrong type or range.
- ``E004`` the project's routers write this app's models to more than one database.
- ``E005`` ``USE_TZ`` is False.
- ``W001`` a SQLite database does not use ``transaction_mode`` IMMEDIATE.
- ``W002`` enabled jobs of a kind no handler is registered for in this process (database
  check: runs only when databases are given, e.g. ``manage.py check --database default``).
- ``W003`` enabled jobs whose principal has no authority policy (database check).
- ``I001`` (``check --deploy``) a PostgreSQL database on which psycopg prepares nothing.
- ``W004`` (``check --deploy``) one on which it prepares, while ``DURABLE_SCHEDULER_LISTEN =
  False`` says the route is a transaction-mode pooler.

All are tagged ``durable_scheduler`` (``manage.py check --tag durable_scheduler``).
"""

from __future__ import annotations

import math
import pkgutil
import re
from importlib import import_module
from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Info, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.utils.module_loading import import_string

from . import conf
from .exceptions import InvalidArgument
from .rules.authority import MAX_BUDGET, normalize_principal
from .rules.validation import timeout_ms

TAG = "durable_scheduler"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def handler_module() -> str | None:
    """The configured handler module name, or None when it is invalid (E003 says so)."""
    name = conf.settings.raw("HANDLER_MODULE")
    return name if isinstance(name, str) and _MODULE_NAME.match(name) else None


def _import_handler_modules() -> list[tuple[str, str, BaseException]]:
    """Import every installed app's handler module (what ``registry.autodiscover`` does), but
    report each failure instead of stopping at the first. Imported modules are cached, so
    this costs nothing after the first time (when Django started, unless
    ``DURABLE_SCHEDULER_AUTODISCOVER`` is off)."""
    from .handlers import registry

    name = handler_module()
    return [] if name is None else registry.import_handler_modules(name)


@register(TAG)
def check_handler_modules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return [
        Error(
            f"Handler module {module!r} of app {label!r} fails to import: {type(exc).__name__}: {exc}",
            hint=(
                "Fix the error: runscheduler imports this module at start (autodiscovery) and would "
                "fail. If the module needs packages that only the worker hosts have, add "
                "'durable_scheduler.E001' to SILENCED_SYSTEM_CHECKS on the other hosts."
            ),
            obj=module,
            id="durable_scheduler.E001",
        )
        for label, module, exc in _import_handler_modules()
    ]


@register(TAG)
def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from .handlers import registry

    _import_handler_modules()
    messages: list[CheckMessage] = []
    for handler in registry.registered_handlers():
        problem = None
        if not callable(handler.func):
            problem = f"its handler {handler.func!r} is not callable"
        elif not callable(handler.units) and (
            isinstance(handler.units, bool)
            or not isinstance(handler.units, int)
            or not 1 <= handler.units <= MAX_BUDGET
        ):
            problem = f"its units {handler.units!r} are not a whole number in 1..{MAX_BUDGET} or a callable"
        if problem is not None:
            messages.append(
                Error(
                    f"Kind {handler.kind!r} is registered wrongly: {problem}.",
                    hint=(
                        "Register handlers with @scheduler.handler(kind, units=N) on a function, "
                        f"where N is 1..{MAX_BUDGET} or a callable taking the context and returning one."
                    ),
                    obj=handler.kind,
                    id="durable_scheduler.E002",
                )
            )
    return messages


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# (setting, problem, hint): one wrong DURABLE_SCHEDULER_* setting, as E003 reports it.
Problem = tuple[str, str, str]


def _seconds_up_to(value: Any, maximum: int) -> bool:
    return _number(value) and 0 < value <= maximum


def _handler_module_problems() -> list[Problem]:
    module = conf.settings.raw("HANDLER_MODULE")
    if isinstance(module, str) and _MODULE_NAME.match(module):
        return []
    example = conf.DEFAULTS["HANDLER_MODULE"]
    return [
        (
            "HANDLER_MODULE",
            f"must be a dotted module name such as {example!r}, not {module!r}",
            "Name the module (relative to each app) that holds your @scheduler.handler functions.",
        )
    ]


def _autodiscover_problems() -> list[Problem]:
    value = conf.settings.raw("AUTODISCOVER")
    if isinstance(value, bool):
        return []
    return [
        (
            "AUTODISCOVER",
            f"must be True or False, not {value!r}",
            "True (the default) imports every app's handler module when Django starts; False "
            "leaves that to runscheduler and scheduler_sync.",
        )
    ]


def _default_lease_problems() -> list[Problem]:
    lease = conf.settings.raw("DEFAULT_LEASE")
    if _seconds_up_to(lease, conf.MAX_DEFAULT_LEASE):
        return []
    return [
        (
            "DEFAULT_LEASE",
            f"must be a number of seconds in (0, {conf.MAX_DEFAULT_LEASE}], not {lease!r}",
            f"The default is {conf.DEFAULTS['DEFAULT_LEASE']}.",
        )
    ]


def _retry_delay_problems() -> list[Problem]:
    """The two delays, each in its range, and the longest no shorter than the first."""
    problems: list[Problem] = []
    base = conf.settings.raw("RETRY_BASE_DELAY")
    base_ok = _seconds_up_to(base, conf.MAX_RETRY_BASE_DELAY)
    if not base_ok:
        problems.append(
            (
                "RETRY_BASE_DELAY",
                f"must be a number of seconds in (0, {conf.MAX_RETRY_BASE_DELAY}], not {base!r}",
                f"The first retry waits this long; the default is {conf.DEFAULTS['RETRY_BASE_DELAY']}.",
            )
        )
    maximum = conf.settings.raw("RETRY_MAX_DELAY")
    if not _seconds_up_to(maximum, conf.MAX_RETRY_MAX_DELAY):
        problems.append(
            (
                "RETRY_MAX_DELAY",
                f"must be a number of seconds in (0, {conf.MAX_RETRY_MAX_DELAY}], not {maximum!r}",
                f"The backoff is capped at this; the default is {conf.DEFAULTS['RETRY_MAX_DELAY']}.",
            )
        )
    elif base_ok and maximum < base:
        problems.append(
            (
                "RETRY_MAX_DELAY",
                f"({maximum!r}) must not be shorter than DURABLE_SCHEDULER_RETRY_BASE_DELAY ({base!r})",
                "Raise RETRY_MAX_DELAY or lower RETRY_BASE_DELAY.",
            )
        )
    return problems


def _retry_jitter_problems() -> list[Problem]:
    jitter = conf.settings.raw("RETRY_JITTER")
    if _number(jitter) and 0 <= jitter < conf.RETRY_JITTER_BELOW:
        return []
    return [
        (
            "RETRY_JITTER",
            f"must be a number in [0, {conf.RETRY_JITTER_BELOW}), not {jitter!r}",
            "It is the +/- share of each retry delay drawn at random; "
            f"the default is {conf.DEFAULTS['RETRY_JITTER']}.",
        )
    ]


def _max_claim_batch_problems() -> list[Problem]:
    batch = conf.settings.raw("MAX_CLAIM_BATCH")
    if not isinstance(batch, bool) and isinstance(batch, int) and batch >= conf.MIN_CLAIM_BATCH:
        return []
    return [
        (
            "MAX_CLAIM_BATCH",
            f"must be a whole number >= {conf.MIN_CLAIM_BATCH}, not {batch!r}",
            f"The default is {conf.DEFAULTS['MAX_CLAIM_BATCH']}.",
        )
    ]


def _clock_problems() -> list[Problem]:
    clock = conf.settings.raw("CLOCK")
    if isinstance(clock, str):
        try:
            clock = import_string(clock)
        except ImportError as exc:
            hint = "Give a dotted path to a callable, or a callable."
            return [("CLOCK", f"cannot be imported: {exc}", hint)]
    if clock is None or callable(clock):
        return []
    return [
        (
            "CLOCK",
            f"must be a callable (or a dotted path to one) returning an aware datetime, not {clock!r}",
            "Leave it unset in production: the scheduler then uses the system clock.",
        )
    ]


def _time_source_problems() -> list[Problem]:
    source = conf.settings.raw("TIME_SOURCE")
    if source in conf.TIME_SOURCES:
        return []
    return [
        (
            "TIME_SOURCE",
            f"must be {' or '.join(map(repr, conf.TIME_SOURCES))}, not {source!r}",
            "'database' takes the time from the database server, for hosts whose clocks disagree.",
        )
    ]


def _listen_problems() -> list[Problem]:
    listen = conf.settings.raw("LISTEN")
    if isinstance(listen, bool):
        return []
    return [
        (
            "LISTEN",
            f"must be True or False, not {listen!r}",
            "False makes workers poll only (behind a transaction-mode pooler such as PgBouncer).",
        )
    ]


def _handler_timeout_problems() -> list[Problem]:
    timeout = conf.settings.raw("HANDLER_TIMEOUT")
    try:
        timeout_ms(timeout, "DURABLE_SCHEDULER_HANDLER_TIMEOUT")  # the same check as a job's timeout
    except InvalidArgument:
        return [
            (
                "HANDLER_TIMEOUT",
                f"must be None, or seconds or a timedelta in [0.001, {conf.MAX_HANDLER_TIMEOUT}] "
                f"seconds, not {timeout!r}",
                "It is how long a run may take when neither its job nor its handler gives a "
                "timeout; the default None means no timeout.",
            )
        ]
    return []


def _default_principal_problems() -> list[Problem]:
    try:
        normalize_principal(conf.settings.DEFAULT_PRINCIPAL, "principal")
    except InvalidArgument as exc:
        return [
            (
                "DEFAULT_PRINCIPAL",
                f"must be {{'type': ..., 'id': ...}} ({exc})",
                "Jobs created without an authority envelope run as it; leave it unset for "
                f"{conf.DEFAULTS['DEFAULT_PRINCIPAL']!r}.",
            )
        ]
    return []


def _retention_problems() -> list[Problem]:
    try:
        conf.parse_retention(conf.settings.raw("RETENTION"))
    except ValueError as exc:
        return [
            (
                "RETENTION",
                str(exc),
                "Ages (succeeded, cancelled, dead_letter, job_events, caller_keys) are seconds or "
                "timedeltas, None keeps forever; period, pause and lease are seconds, batch_size "
                "rows; None turns retention off in the workers.",
            )
        ]
    return []


def _archive_problems() -> list[Problem]:
    try:
        conf.parse_archive(conf.settings.raw("ARCHIVE"))
    except ValueError as exc:
        return [
            (
                "ARCHIVE",
                str(exc),
                'For example {"storage": "default", "prefix": "durable_scheduler/archive"}; None '
                "(the default) archives nothing.",
            )
        ]
    return []


def _settings_problems() -> list[Problem]:
    """Every DURABLE_SCHEDULER_* setting that is wrong, in the order the settings are listed."""
    return [
        problem
        for problems_of in (
            _handler_module_problems,
            _autodiscover_problems,
            _default_lease_problems,
            _retry_delay_problems,
            _retry_jitter_problems,
            _max_claim_batch_problems,
            _clock_problems,
            _time_source_problems,
            _listen_problems,
            _handler_timeout_problems,
            _default_principal_problems,
            _retention_problems,
            _archive_problems,
        )
        for problem in problems_of()
    ]


@register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return [
        Error(
            f"DURABLE_SCHEDULER_{name} {problem}.",
            hint=hint,
            obj=f"DURABLE_SCHEDULER_{name}",
            id="durable_scheduler.E003",
        )
        for name, problem, hint in _settings_problems()
    ]


@register(TAG)
def check_one_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    # The kernel's transactions span the app's tables (an occurrence, its events and its
    # reservation commit together), so they must be in the database it writes occurrences to.
    app = apps.get_containing_app_config(__name__)
    assert app is not None
    placed = {model._meta.object_name: router.db_for_write(model) for model in app.get_models()}
    if len(set(placed.values())) <= 1:
        return []
    where = ", ".join(f"{name} -> {alias}" for name, alias in sorted(placed.items()))
    return [
        Error(
            f"The database routers write this app's models to more than one database: {where}.",
            hint=(
                f"Route every model of the '{app.label}' app to one database in db_for_write "
                "(e.g. by model._meta.app_label); its reads go to that database too."
            ),
            id="durable_scheduler.E004",
        )
    ]


@register(TAG)
def check_use_tz(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    # Every time this app writes is aware (UTC), and its schedules, backoffs and leases are
    # computed as such: refused at start rather than as a ValueError at the first enqueue.
    if django_settings.USE_TZ:
        return []
    return [
        Error(
            "USE_TZ is False: django_durable_scheduler stores and compares time-zone-aware "
            "datetimes on every database, and without USE_TZ Django refuses them on SQLite and "
            "MySQL/MariaDB.",
            hint="Set USE_TZ = True (Django's default since 5.0); TIME_ZONE still sets the local time.",
            obj="USE_TZ",
            id="durable_scheduler.E005",
        )
    ]


@register(TAG)
def check_sqlite_transaction_mode(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    # Settings only, no query: so it runs on a plain ``check`` and when runscheduler starts,
    # for every configured database unless the caller names some.
    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or list(connections):
        conn = connections[alias]
        if conn.vendor != "sqlite":
            continue
        mode = str(conn.settings_dict.get("OPTIONS", {}).get("transaction_mode", "")).upper()
        if mode != "IMMEDIATE":
            messages.append(
                CheckWarning(
                    f"SQLite database '{alias}' does not use transaction_mode IMMEDIATE.",
                    hint=(
                        f"Set DATABASES['{alias}']['OPTIONS']['transaction_mode'] = 'IMMEDIATE' so that "
                        "transactions enqueueing work inside your own atomic() blocks take the write "
                        "lock up front instead of failing with 'database is locked'."
                    ),
                    id="durable_scheduler.W001",
                )
            )
    return messages


@register(Tags.database, TAG)
def check_jobs_have_handlers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from .handlers import registry
    from .models import Job
    from .tasks.handlers import any_queue
    from .tasks.options import queue_of

    databases = kwargs.get("databases")
    if not databases:
        return []
    _import_handler_modules()
    known = set(registry.registered_kinds())
    # A DurableBackend that takes any queue name: the worker runs every task queue's jobs.
    any_task_queue = any_queue()
    messages: list[CheckMessage] = []
    for alias in databases:
        if not router.allow_migrate_model(alias, Job):
            continue
        try:
            # migrate runs database checks before it creates the tables.
            if Job._meta.db_table not in connections[alias].introspection.table_names():
                continue
            kinds = list(
                Job.objects.using(alias)
                .filter(enabled=True)
                .exclude(kind__in=known)
                .order_by("kind")  # not Meta.ordering's job_id, which would defeat distinct()
                .values_list("kind", flat=True)
                .distinct()
            )
        except DatabaseError:
            continue
        for kind in kinds:
            if any_task_queue and queue_of(kind) is not None:
                continue
            messages.append(
                CheckWarning(
                    f"Enabled jobs of kind {kind!r} in database '{alias}' have no handler "
                    "registered in this process.",
                    hint=(
                        f"Register one with @scheduler.handler({kind!r}) in a handler module, or make "
                        "sure a runscheduler process that has it is running: workers only claim the "
                        "kinds they have handlers for, so these jobs' occurrences wait."
                    ),
                    obj=kind,
                    id="durable_scheduler.W002",
                )
            )
    return messages


@register(Tags.database, TAG)
def check_jobs_have_policies(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from .kernel.authority.binding import jobs_without_policy
    from .models import Job

    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or []:
        if not router.allow_migrate_model(alias, Job):
            continue
        try:
            if Job._meta.db_table not in connections[alias].introspection.table_names():
                continue  # migrate runs database checks before it creates the tables
            found = jobs_without_policy(using=alias)
        except DatabaseError:
            continue
        for principal, jobs in sorted(found.items()):
            messages.append(
                CheckWarning(
                    f"Enabled jobs in database '{alias}' run as {principal.label}, which has no authority "
                    f"policy: {', '.join(jobs)}.",
                    hint=(
                        "Every run of theirs is denied (policy_required). Give the principal a policy "
                        "(set_policy, ensure_policy or the admin's Authority policies), or create the "
                        "jobs without an authority envelope to run them as the default principal."
                    ),
                    obj=principal.label,
                    id="durable_scheduler.W003",
                )
            )
    return messages


@register(TAG, deploy=True)
def check_prepared_statements(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    # Settings only, for ``check --deploy``: whether psycopg prepares the statements a worker
    # sends on every claim, and whether a setting says the route may not keep them.
    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or list(connections):
        conn = connections[alias]
        if conn.vendor != "postgresql":
            continue
        options = conn.settings_dict.get("OPTIONS", {})
        prepares = options.get("server_side_binding") is True and options.get("prepare_threshold") is not None
        if not prepares:
            messages.append(
                Info(
                    f"PostgreSQL database '{alias}': psycopg prepares no statement (Django's default), so a "
                    "worker's claim is parsed and planned on every call.",
                    hint=(
                        f"For the workers, on a direct connection or through PgBouncer 1.21+ with "
                        f"max_prepared_statements: DATABASES['{alias}']['OPTIONS'] = "
                        "{'server_side_binding': True, 'prepare_threshold': 5}, or the same on an alias of "
                        "their own (runscheduler --database). Not behind an older transaction-mode pooler."
                    ),
                    id="durable_scheduler.I001",
                )
            )
        elif not conf.settings.LISTEN:
            messages.append(
                CheckWarning(
                    f"PostgreSQL database '{alias}' prepares statements, and "
                    "DURABLE_SCHEDULER_LISTEN = False "
                    "says the route to it is a transaction-mode pooler.",
                    hint=(
                        "A pooler hands a prepared statement on only from PgBouncer 1.21 with "
                        "max_prepared_statements set; with an older one, take 'server_side_binding' and "
                        f"'prepare_threshold' out of DATABASES['{alias}']['OPTIONS']."
                    ),
                    id="durable_scheduler.W004",
                )
            )
    return messages


def unapplied_migrations(connection: BaseDatabaseWrapper) -> list[str]:
    """This app's migrations that ``connection``'s database lacks (``app_label.name``, by
    name, which is the order they apply): what ``runscheduler`` refuses to start on, as a
    worker on an older schema would fail on every statement. Reads the migration history, so
    a partly migrated database is caught, not only one without the tables. Only this app's
    migration files are listed, and only a missing one is imported (a squash counts as
    applied when all it replaces are): building every app's migration graph would cost each
    worker process's start more than the rest of its preparation."""
    label = apps.get_containing_app_config(__name__).label  # type: ignore[union-attr]
    module_name, _ = MigrationLoader.migrations_module(label)
    if module_name is None:
        return []
    package = import_module(module_name)
    found = pkgutil.iter_modules(package.__path__)
    names = sorted(name for _, name, is_pkg in found if not is_pkg and name[0] not in "_~")
    applied = MigrationRecorder(connection).applied_migrations()
    missing = []
    for name in names:
        if (label, name) in applied:
            continue
        replaces = getattr(import_module(f"{module_name}.{name}").Migration, "replaces", None) or []
        if replaces and all(tuple(key) in applied for key in replaces):
            continue
        missing.append(f"{label}.{name}")
    return missing
