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

import contextlib
import hashlib
import logging
import re
import weakref
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
    (after an error: they are dropped before the next ``PREPARE``). ``proven``: opted in by
    :func:`keep_on`; otherwise it keeps only statements run alone (see :func:`fetch`), each
    from its second run on (``seen``), so that a connection used once pays no ``PREPARE``."""

    def __init__(self, *, proven: bool) -> None:
        self.names: set[str] = set()
        self.seen: set[str] = set()
        self.unsure = False
        self.proven = proven


# Per connection of this process that keeps plans (a DatabaseWrapper belongs to one thread),
# by its identity: a read on a connection that keeps none pays one lookup. Held weakly, and
# dropped with the connection: a web server may start a thread, so a connection, per request.
_KEPT: dict[int, tuple[weakref.ref[BaseDatabaseWrapper], _Kept]] = {}


def _kept(connection: BaseDatabaseWrapper) -> _Kept | None:
    entry = _KEPT.get(id(connection))
    return entry[1] if entry is not None and entry[0]() is connection else None


def _add(connection: BaseDatabaseWrapper, kept: _Kept) -> None:
    key = id(connection)
    _KEPT[key] = (weakref.ref(connection, lambda _: _KEPT.pop(key, None)), kept)


def keep_on(alias: str) -> bool:
    """Let this thread's connection to ``alias`` keep the plans of :func:`fetch`'s reads; only
    where the route to the server is known to keep a session (see the module). False where it
    does not apply: not PostgreSQL, or psycopg prepares by itself (``server_side_binding``)."""
    connection = connections[alias]
    if not _applies(connection):
        return False
    kept = _kept(connection)
    if kept is None:
        _add(connection, _Kept(proven=True))
    else:
        kept.proven = True
    return True


def _applies(connection: BaseDatabaseWrapper) -> bool:
    """PostgreSQL, where psycopg does not prepare by itself (no ``server_side_binding``)."""
    return connection.vendor == "postgresql" and not connection.settings_dict["OPTIONS"].get(
        "server_side_binding"
    )


def keep_off(alias: str) -> None:
    """Stop keeping plans on this thread's connection to ``alias``: what it prepared stays in
    its server session, unused, until the session ends (no statement to send at shutdown)."""
    _KEPT.pop(id(connections[alias]), None)


def keeps(alias: str) -> bool:
    return _kept(connections[alias]) is not None


def fetch(
    connection: BaseDatabaseWrapper, sql: str, params: list[Any] | dict[str, Any], *, alone: bool = False
) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` with ``params`` (``%s`` or ``%(name)s`` placeholders) on
    ``connection``, run from the plan it keeps where it keeps plans, else as any statement.

    ``alone``: the caller sends this statement many times, and where the connection is in
    autocommit it is a transaction by itself; then it is kept on any PostgreSQL connection,
    opted in or not, unless the caller knows the route to the server drops sessions (it
    passes False then: the wake-up listener is off, as behind a transaction-mode pooler).
    Should a pooler show itself anyway (a name the server does not know, or knows already),
    nothing is kept alone on that database again in this process, and the statement runs as
    text: in autocommit, the failed one wrote nothing."""
    kept = _kept(connection) if _KEPT else None  # no lookup where nothing keeps plans
    if kept is None or not kept.proven:
        kept = _alone(connection, kept) if alone else None
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
    name, text, execute, names = _numbered(sql)
    if name not in kept.names and not kept.proven and name not in kept.seen:
        kept.seen.add(name)
        return None
    values = [params[key] for key in names] if isinstance(params, dict) else list(params)
    with connection.cursor() as cursor:
        if kept.unsure or (name not in kept.names and len(kept.names) >= MAX_KEPT):
            cursor.execute("DEALLOCATE ALL")
            kept.names.clear()
            kept.unsure = False
        if name not in kept.names and not _prepare(connection, kept, name, text):
            return None
        try:
            cursor.execute(execute, values)
            return list(cursor.fetchall())
        except DatabaseError as error:
            # The server may have lost it (DISCARD ALL, a pooler's reset) or the transaction
            # failed: prepare again, from a clean slate, next time.
            kept.names.clear()
            kept.unsure = True
            if not kept.proven and _sqlstate(error) == _UNKNOWN_NAME:
                _shared_route(connection, "a statement prepared on it was not found")
                return None
            raise


def _prepare(connection: BaseDatabaseWrapper, kept: _Kept, name: str, text: str) -> bool:
    """``PREPARE`` ``text`` as ``name``, in a savepoint (inside the caller's transaction) so
    that a failure leaves the transaction usable; on failure the connection stops keeping
    plans, with one warning, and the statement runs as text."""
    # Alone, the connection is in autocommit: a failure leaves nothing to roll back.
    savepoint = transaction.atomic(using=connection.alias) if kept.proven else contextlib.nullcontext()
    try:
        with savepoint, connection.cursor() as cursor:
            cursor.execute(f"PREPARE {name} AS {text}")
    except DatabaseError as error:
        if not kept.proven:
            _shared_route(connection, f"preparing a statement failed ({_sqlstate(error)})")
            return False
        logger.warning(
            "could not keep a plan on database '%s'; its statements run as text from now on",
            connection.alias,
            exc_info=True,
        )
        _KEPT.pop(id(connection), None)
        return False
    kept.names.add(name)
    return True


# SQLSTATE of an ``EXECUTE`` whose name the server session does not hold.
_UNKNOWN_NAME = "26000"

# Databases on which a statement kept alone met a pooler that does not keep sessions.
_SHARED_ROUTES: set[str] = set()


def _alone(connection: BaseDatabaseWrapper, kept: _Kept | None) -> _Kept | None:
    """The keeping of a statement run alone on ``connection``, if it may keep one now."""
    if kept is None:
        if connection.alias in _SHARED_ROUTES or not _applies(connection):
            return None
        kept = _Kept(proven=False)
        _add(connection, kept)
    # Django's own flag, which get_autocommit() reads after connecting (False inside atomic).
    autocommit = connection.autocommit if connection.connection is not None else connection.get_autocommit()
    return kept if autocommit else None


def _shared_route(connection: BaseDatabaseWrapper, why: str) -> None:
    """Keep nothing alone on ``connection``'s database from now on, saying so once."""
    _SHARED_ROUTES.add(connection.alias)
    for key, (ref, kept) in list(_KEPT.items()):
        other = ref()
        if other is not None and other.alias == connection.alias and not kept.proven:
            _KEPT.pop(key, None)
    logger.warning(
        "database '%s' does not keep sessions (%s), as behind a transaction-mode pooler: its "
        "statements run as text from now on; set DURABLE_SCHEDULER_LISTEN = False for such a route",
        connection.alias,
        why,
    )


def _sqlstate(error: BaseException) -> str | None:
    return getattr(error.__cause__, "sqlstate", None)


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")
_NUMBERED: dict[str, tuple[str, str, str, list[str]]] = {}


def _numbered(sql: str) -> tuple[str, str, str, list[str]]:
    """For ``sql``: the name of its plan, its text with the placeholders as ``$1``, ``$2``...
    (``%%`` as ``%``), the ``EXECUTE`` that runs it, and for named placeholders the names in
    the order of their numbers (a name used twice keeps its number)."""
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
    name = "dsch_" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:24]
    arity = len(names) or count
    execute = f"EXECUTE {name}({', '.join(['%s'] * arity)})" if arity else f"EXECUTE {name}"
    if len(_NUMBERED) >= 256:
        _NUMBERED.clear()
    _NUMBERED[sql] = found = (name, text, execute, names)
    return found


def _new_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    kept = _kept(connection)
    if kept is not None:
        kept.names.clear()
        kept.seen.clear()
        kept.unsure = False


connection_created.connect(_new_connection, dispatch_uid="django_durable_scheduler.db.kept")
