"""Every occurrence write checked at run time (docs/design.md, "Occurrence lifecycle"): each
UPDATE of the occurrence table must write exactly the columns the lifecycle table gives the
action its writer named (``kernel.writing``), whether the ORM built it (``update()``,
``save(update_fields=...)``, ``bulk_update``) or the claim wrote it by hand, alone or inside
a ``WITH``. An UPDATE that the package's code sends with no action named fails too; one a
test sends (a hand edit that sets up a case) or a data migration is let through unnamed.

The test settings turn it on (``CHECK_OCCURRENCE_WRITES``, from ``DSCH_CHECK_WRITES``, on
unless it is ``0``): ``tests.testapp`` then installs it on every connection as it opens, in
the test process, its threads and the ``runscheduler`` processes its tests start.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_durable_scheduler.kernel.writing import announced
from django_durable_scheduler.models import Occurrence
from django_durable_scheduler.rules.lifecycle import TRANSITION

PACKAGE = "django_durable_scheduler."
# Data migrations write through historical models and may not import the live code that names
# actions; they are not transitions of the lifecycle.
UNNAMED_WRITERS = ("django_durable_scheduler.migrations.",)
# Where a statement passes on its way from its writer to the database: not the writer.
PLUMBING = ("django.", "contextlib", __name__)


class WrongOccurrenceWrite(AssertionError):
    """An UPDATE of the occurrence table that the lifecycle table does not allow."""


@cache
def _update_of(quoted_table: str) -> re.Pattern[str]:
    return re.compile(rf"\bUPDATE\s+{re.escape(quoted_table)}\s+SET\s+", re.IGNORECASE)


@cache
def _field_names() -> dict[str, str]:
    """Each occurrence column's field name (the lifecycle table names fields)."""
    return {
        str(field.column): field.name
        for field in Occurrence._meta.get_fields()
        if getattr(field, "concrete", False) and getattr(field, "column", None)
    }


_END_OF_SET = re.compile(r"\s+(WHERE|RETURNING|FROM)\s", re.IGNORECASE)


def assigned_columns(sql: str, start: int) -> list[str]:
    """The columns of the SET list that begins at ``sql[start]``: its assignments split at
    the commas outside parentheses and string literals, up to its WHERE (or RETURNING, FROM,
    or the parenthesis that closes a ``WITH`` clause)."""
    targets: list[str] = []
    depth, begun, quoted, at = 0, start, False, start
    while at < len(sql):
        char = sql[at]
        if quoted:
            quoted = char != "'"
        elif char == "'":
            quoted = True
        elif char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and char == ",":
            targets.append(sql[begun:at])
            begun = at + 1
        elif depth == 0 and char.isspace() and _END_OF_SET.match(sql, at):
            break
        at += 1
    targets.append(sql[begun:at])
    columns = []
    for target in targets:
        name = target.split("=", 1)[0].strip().split(".")[-1].strip('"`[]')
        columns.append(_field_names().get(name, name))
    return columns


def _writer() -> str:
    """The module whose code sent the statement: the first caller outside Django and this one."""
    frame = sys._getframe(1)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not name.startswith(PLUMBING):
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def check_statement(sql: str, connection: BaseDatabaseWrapper) -> None:
    """Raise :class:`WrongOccurrenceWrite` for an UPDATE of the occurrence table in ``sql``
    that writes other columns than the named action's, or that the package sends unnamed."""
    table = connection.ops.quote_name(Occurrence._meta.db_table)
    if table not in sql:
        return
    updates = list(_update_of(table).finditer(sql))
    if not updates:
        return
    action = announced()
    if action is None:
        writer = _writer()
        if writer.startswith(PACKAGE) and not writer.startswith(UNNAMED_WRITERS):
            raise WrongOccurrenceWrite(
                f"{writer} updates {table} with no lifecycle action named (kernel.writing): {sql[:400]}"
            )
        return
    allowed = set(TRANSITION[action].sets)
    for update in updates:
        written = set(assigned_columns(sql, update.end()))
        if written != allowed:
            raise WrongOccurrenceWrite(
                f"{action} writes {sorted(allowed)}; this UPDATE of {table} also writes "
                f"{sorted(written - allowed)} and leaves out {sorted(allowed - written)}: {sql[:400]}"
            )


def check_writes(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """The execute wrapper (Django's "Database instrumentation") that checks each statement."""
    check_statement(sql, context["connection"])
    return execute(sql, params, many, context)


def install(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """``connection_created`` receiver: put the check on ``connection``, once (a connection
    that reconnects keeps its wrappers). First in line, not through ``execute_wrapper()``'s
    context, which a test's own ``with connection.execute_wrapper(...)`` entered before the
    connection opened would otherwise close in the wrong order."""
    if check_writes not in connection.execute_wrappers:
        connection.execute_wrappers.insert(0, check_writes)
