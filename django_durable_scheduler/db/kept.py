"""Plans kept per connection (PostgreSQL): a read the worker sends on every claim is
``PREPARE``d once on its connection and ``EXECUTE``d from then on.

At Django's default ``OPTIONS`` every statement goes to the server as text, to be parsed and
planned again each time; for the claim's reads (the principals with work, their candidate
rows), which have many arms, that takes ten times as long as running them, and a worker woken
for one new occurrence waits for it. psycopg keeps plans itself only with
``server_side_binding``, which a transaction-mode pooler forbids. So a connection keeps plans
only once it is opted in (:func:`keep_on`), which the worker does when its wake-up listener has
seen a notification from another connection arrive: the route to the server then keeps a
session, where a transaction-mode pooler would hand an ``EXECUTE`` to a server connection
that never saw its ``PREPARE``. Elsewhere, on other databases and with ``server_side_binding``
(psycopg prepares then), :func:`fetch` is a plain execute.

A prepared statement lives as long as its server connection, a rollback included: the names
kept are forgotten when Django opens a new connection (``connection_created``), and after an
error, when they are dropped on the server too before the next one is prepared.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

logger = logging.getLogger("django_durable_scheduler")

# Plans one connection keeps at most; past it, it drops them all and starts again (the
# claim's reads come in a few shapes per number of principals and kinds).
MAX_KEPT = 64


class _Kept:
    """What one connection has prepared, and whether the server may hold names it has not
    (after an error: they are dropped before the next ``PREPARE``)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.unsure = False


# Per connection of this process that keeps plans (a DatabaseWrapper belongs to one thread),
# by its identity: a read on a connection that keeps none pays one lookup.
_KEPT: dict[int, tuple[BaseDatabaseWrapper, _Kept]] = {}


def _kept(connection: BaseDatabaseWrapper) -> _Kept | None:
    entry = _KEPT.get(id(connection))
    return entry[1] if entry is not None and entry[0] is connection else None


def keep_on(alias: str) -> bool:
    """Let this thread's connection to ``alias`` keep the plans of :func:`fetch`'s reads; only
    where the route to the server is known to keep a session (see the module). False where it
    does not apply: not PostgreSQL, or psycopg prepares by itself (``server_side_binding``)."""
    connection = connections[alias]
    if connection.vendor != "postgresql" or connection.settings_dict["OPTIONS"].get("server_side_binding"):
        return False
    if _kept(connection) is None:
        _KEPT[id(connection)] = (connection, _Kept())
    return True


def keep_off(alias: str) -> None:
    """Stop keeping plans on this thread's connection to ``alias``: what it prepared stays in
    its server session, unused, until the session ends (no statement to send at shutdown)."""
    _KEPT.pop(id(connections[alias]), None)


def keeps(alias: str) -> bool:
    return _kept(connections[alias]) is not None


def fetch(
    connection: BaseDatabaseWrapper, sql: str, params: list[Any] | dict[str, Any]
) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` with ``params`` (``%s`` or ``%(name)s`` placeholders) on
    ``connection``, run from the plan it keeps where it keeps plans, else as any statement."""
    kept = _kept(connection) if _KEPT else None  # no lookup where nothing keeps plans
    if kept is not None:
        rows = _from_plan(connection, kept, sql, params)
        if rows is not None:
            return rows
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def _from_plan(
    connection: BaseDatabaseWrapper, kept: _Kept, sql: str, params: list[Any] | dict[str, Any]
) -> list[tuple[Any, ...]] | None:
    """Run ``sql`` from its kept plan, preparing it first if needed; None if it cannot be
    prepared (the caller runs it as text)."""
    text, names = _numbered(sql)
    values = [params[name] for name in names] if isinstance(params, dict) else list(params)
    name = "dsch_" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:24]
    with connection.cursor() as cursor:
        if kept.unsure or (name not in kept.names and len(kept.names) >= MAX_KEPT):
            cursor.execute("DEALLOCATE ALL")
            kept.names.clear()
            kept.unsure = False
        if name not in kept.names and not _prepare(connection, kept, name, text):
            return None
        arguments = f"({', '.join(['%s'] * len(values))})" if values else ""
        try:
            cursor.execute(f"EXECUTE {name}{arguments}", values)
            return list(cursor.fetchall())
        except DatabaseError:
            # The server may have lost it (DISCARD ALL, a pooler's reset) or the transaction
            # failed: prepare again, from a clean slate, next time.
            kept.names.clear()
            kept.unsure = True
            raise


def _prepare(connection: BaseDatabaseWrapper, kept: _Kept, name: str, text: str) -> bool:
    """``PREPARE`` ``text`` as ``name``, in a savepoint (inside the caller's transaction) so
    that a failure leaves the transaction usable; on failure the connection stops keeping
    plans, with one warning, and the statement runs as text."""
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"PREPARE {name} AS {text}")
    except DatabaseError:
        logger.warning(
            "could not keep a plan on database '%s'; its statements run as text from now on",
            connection.alias,
            exc_info=True,
        )
        _KEPT.pop(id(connection), None)
        return False
    kept.names.add(name)
    return True


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")
_NUMBERED: dict[str, tuple[str, list[str]]] = {}


def _numbered(sql: str) -> tuple[str, list[str]]:
    """``sql`` with its placeholders as ``$1``, ``$2``... (``%%`` as ``%``), and for named
    ones the names in the order of their numbers (a name used twice keeps its number)."""
    found = _NUMBERED.get(sql)
    if found is not None:
        return found
    names: list[str] = []
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(0) == "%%":
            return "%"
        if match.group(1) is None:
            count += 1
            return f"${count}"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = _PLACEHOLDER.sub(number, sql)
    if len(_NUMBERED) >= 256:
        _NUMBERED.clear()
    _NUMBERED[sql] = (text, names)
    return text, names


def _new_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    kept = _kept(connection)
    if kept is not None:
        kept.names.clear()
        kept.unsure = False


connection_created.connect(_new_connection, dispatch_uid="django_durable_scheduler.db.kept")
