"""System checks with stable ids (``durable_scheduler.E001`` ...), each with a hint.

- ``E001`` a handler module of an installed app fails to import.
- ``E002`` a registered handler is not callable, or its ``units`` are not 1..1,000,000.
- ``E003`` a ``DURABLE_SCHEDULER_*`` setting has the wrong type or range.
- ``E004`` the project's routers write this app's models to more than one database.
- ``W001`` a SQLite database does not use ``transaction_mode`` IMMEDIATE.
- ``W002`` enabled jobs of a kind no handler is registered for in this process (database
  check: runs only when databases are given, e.g. ``manage.py check --database default``).
- ``W003`` enabled jobs whose principal has no authority policy (database check).

All are tagged ``durable_scheduler`` (``manage.py check --tag durable_scheduler``).
"""

from __future__ import annotations

import math
import re
from importlib import import_module
from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.loader import MigrationLoader
from django.utils.module_loading import import_string, module_has_submodule

from . import conf
from .authority import normalize_principal
from .exceptions import InvalidArgument

TAG = "durable_scheduler"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_DAY = 24 * 60 * 60
MAX_UNITS = 1_000_000


def _setting(name: str, default: Any) -> Any:
    return getattr(django_settings, f"DURABLE_SCHEDULER_{name}", default)


def _handler_module() -> str | None:
    """The configured handler module name, or None when it is invalid (E003 says so)."""
    name = _setting("HANDLER_MODULE", "tasks")
    return name if isinstance(name, str) and _MODULE_NAME.match(name) else None


def _import_handler_modules() -> list[tuple[str, str, BaseException]]:
    """Import every installed app's handler module (what ``registry.autodiscover`` does), but
    report each failure instead of stopping at the first. Imported modules are cached, so
    this costs nothing after the first time; only failing ones run again."""
    name = _handler_module()
    if name is None:
        return []
    failures: list[tuple[str, str, BaseException]] = []
    for app_config in apps.get_app_configs():
        try:
            if not module_has_submodule(app_config.module, name):
                continue
            import_module(f"{app_config.name}.{name}")
        except Exception as exc:
            failures.append((app_config.label, f"{app_config.name}.{name}", exc))
    return failures


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
    from . import registry

    _import_handler_modules()
    messages: list[CheckMessage] = []
    for handler in registry.registered_handlers():
        problem = None
        if not callable(handler.func):
            problem = f"its handler {handler.func!r} is not callable"
        elif not callable(handler.units) and (
            isinstance(handler.units, bool)
            or not isinstance(handler.units, int)
            or not 1 <= handler.units <= MAX_UNITS
        ):
            problem = f"its units {handler.units!r} are not a whole number in 1..{MAX_UNITS} or a callable"
        if problem is not None:
            messages.append(
                Error(
                    f"Kind {handler.kind!r} is registered wrongly: {problem}.",
                    hint=(
                        "Register handlers with @scheduler.handler(kind, units=N) on a function, "
                        f"where N is 1..{MAX_UNITS} or a callable taking the context and returning one."
                    ),
                    obj=handler.kind,
                    id="durable_scheduler.E002",
                )
            )
    return messages


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _settings_problems() -> list[tuple[str, str, str]]:
    """(setting, problem, hint) for every DURABLE_SCHEDULER_* setting that is wrong."""
    problems: list[tuple[str, str, str]] = []
    module = _setting("HANDLER_MODULE", "tasks")
    if not isinstance(module, str) or not _MODULE_NAME.match(module):
        problems.append(
            (
                "HANDLER_MODULE",
                f"must be a dotted module name such as 'tasks', not {module!r}",
                "Name the module (relative to each app) that holds your @scheduler.handler functions.",
            )
        )
    lease = _setting("DEFAULT_LEASE", 30)
    if not _number(lease) or not 0 < lease <= _DAY:
        problems.append(
            (
                "DEFAULT_LEASE",
                f"must be a number of seconds in (0, {_DAY}], not {lease!r}",
                "The default is 30.",
            )
        )
    base = _setting("RETRY_BASE_DELAY", 10)
    base_ok = _number(base) and 0 < base <= _DAY
    if not base_ok:
        problems.append(
            (
                "RETRY_BASE_DELAY",
                f"must be a number of seconds in (0, {_DAY}], not {base!r}",
                "The first retry waits this long; the default is 10.",
            )
        )
    maximum = _setting("RETRY_MAX_DELAY", 3600)
    if not _number(maximum) or not 0 < maximum <= 31 * _DAY:
        problems.append(
            (
                "RETRY_MAX_DELAY",
                f"must be a number of seconds in (0, {31 * _DAY}], not {maximum!r}",
                "The backoff is capped at this; the default is 3600.",
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
    jitter = _setting("RETRY_JITTER", 0.2)
    if not _number(jitter) or not 0 <= jitter < 1:
        problems.append(
            (
                "RETRY_JITTER",
                f"must be a number in [0, 1), not {jitter!r}",
                "It is the +/- share of each retry delay drawn at random; the default is 0.2.",
            )
        )
    batch = _setting("MAX_CLAIM_BATCH", 500)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        problems.append(
            ("MAX_CLAIM_BATCH", f"must be a whole number >= 1, not {batch!r}", "The default is 500.")
        )
    clock = _setting("CLOCK", None)
    if isinstance(clock, str):
        try:
            clock = import_string(clock)
        except ImportError as exc:
            problems.append(
                ("CLOCK", f"cannot be imported: {exc}", "Give a dotted path to a callable, or a callable.")
            )
            clock = None
    if clock is not None and not callable(clock):
        problems.append(
            (
                "CLOCK",
                f"must be a callable (or a dotted path to one) returning an aware datetime, not {clock!r}",
                "Leave it unset in production: the scheduler then uses the system clock.",
            )
        )
    source = _setting("TIME_SOURCE", "host")
    if source not in ("host", "database"):
        problems.append(
            (
                "TIME_SOURCE",
                f"must be 'host' or 'database', not {source!r}",
                "'database' takes the time from the database server, for hosts whose clocks disagree.",
            )
        )
    if not isinstance(_setting("LISTEN", True), bool):
        problems.append(
            (
                "LISTEN",
                f"must be True or False, not {_setting('LISTEN', True)!r}",
                "False makes workers poll only (behind a transaction-mode pooler such as PgBouncer).",
            )
        )
    timeout = _setting("HANDLER_TIMEOUT", None)
    if timeout is not None:
        from .identity import MAX_TIMEOUT_MS, timeout_ms

        try:
            timeout_ms(timeout, "DURABLE_SCHEDULER_HANDLER_TIMEOUT")
        except InvalidArgument:
            problems.append(
                (
                    "HANDLER_TIMEOUT",
                    f"must be None, or seconds or a timedelta in [0.001, {MAX_TIMEOUT_MS // 1000}] "
                    f"seconds, not {timeout!r}",
                    "It is how long a run may take when neither its job nor its handler gives a "
                    "timeout; the default None means no timeout.",
                )
            )
    try:
        normalize_principal(conf.settings.DEFAULT_PRINCIPAL, "principal")
    except InvalidArgument as exc:
        problems.append(
            (
                "DEFAULT_PRINCIPAL",
                f"must be {{'type': ..., 'id': ...}} ({exc})",
                "Jobs created without an authority envelope run as it; leave it unset for "
                "{'type': 'app', 'id': 'durable_scheduler'}.",
            )
        )
    return problems


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
    from . import registry
    from .models import Job

    databases = kwargs.get("databases")
    if not databases:
        return []
    _import_handler_modules()
    known = set(registry.registered_kinds())
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
    from .models import Job
    from .policies import jobs_without_policy

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
        for (ptype, pid), jobs in sorted(found.items()):
            messages.append(
                CheckWarning(
                    f"Enabled jobs in database '{alias}' run as {ptype}:{pid}, which has no authority "
                    f"policy: {', '.join(jobs)}.",
                    hint=(
                        "Every run of theirs is denied (policy_required). Give the principal a policy "
                        "(set_policy, ensure_policy or the admin's Authority policies), or create the "
                        "jobs without an authority envelope to run them as the default principal."
                    ),
                    obj=f"{ptype}:{pid}",
                    id="durable_scheduler.W003",
                )
            )
    return messages


def unapplied_migrations(connection: BaseDatabaseWrapper) -> list[str]:
    """This app's migrations that ``connection``'s database lacks (``app_label.name``, in the
    order they apply): what ``runscheduler`` refuses to start on, as a worker on an older
    schema would fail on every statement. Reads the migration history, so a partly
    migrated database is caught, not only one without the tables."""
    label = apps.get_containing_app_config(__name__).label  # type: ignore[union-attr]
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    wanted: dict[tuple[str, str], None] = {}
    for leaf in loader.graph.leaf_nodes(label):
        wanted.update((key, None) for key in loader.graph.forwards_plan(leaf) if key[0] == label)
    return [f"{app}.{name}" for app, name in wanted if (app, name) not in loader.applied_migrations]
