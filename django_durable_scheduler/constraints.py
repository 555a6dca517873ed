"""Boolean expressions for the check constraints of the occurrence table, written so that
PostgreSQL's stored form of each constraint is small.

PostgreSQL does not keep a check constraint's expression compiled between statements: each
statement that writes a row reads the stored tree of every check constraint of the table
back from its text form, simplifies it and compiles it (``ExecRelCheck``). The one-by-one
enqueue writes one row a statement, so that rebuild is paid on every call. A list of
constants, as Django writes ``field__in``, is stored as one node per constant with its
bytes spelled out, and a condition written as ``(a and b) or (not a and not b)`` names each
side twice. The same conditions written as one array constant (:class:`OneOf`) and as an
equality of two truth values (:class:`SameTruth`) halve what is rebuilt.

Elsewhere (SQLite, MySQL/MariaDB) the same expressions are the plain SQL they stand for:
those databases compile a constraint once per table or per prepared statement.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db.models import BooleanField, Func, Q, Value
from django.db.models.lookups import In
from django.db.models.sql.compiler import SQLCompiler
from django.utils.deconstruct import deconstructible

# Values that need no quoting inside an SQL string or a PostgreSQL array literal.
_PLAIN = re.compile(r"[a-z][a-z0-9_]*\Z")


@deconstructible(path="django_durable_scheduler.constraints.OneOf")
class OneOf(Func):
    """``expression IN (values)``, for a text column and a fixed set of identifiers. On
    PostgreSQL, ``expression::text = ANY('{value,...}'::text[])``: one array constant."""

    output_field = BooleanField()
    conditional = True

    def __init__(self, expression: Any, *values: str) -> None:
        if not values:
            raise ValueError("OneOf needs at least one value")
        for value in values:
            if not isinstance(value, str) or not _PLAIN.match(value):
                raise ValueError(f"OneOf values are lowercase identifiers, not {value!r}")
        super().__init__(expression)
        self.values = tuple(str(value) for value in values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source_expressions[0]!r}, {', '.join(map(repr, self.values))})"

    def as_sql(self, compiler: SQLCompiler, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        # Django's own ``__in`` lookup: its quoting, its parameters.
        sql, params = compiler.compile(In(self.source_expressions[0], list(self.values)))
        return sql, list(params)

    def as_postgresql(self, compiler: SQLCompiler, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"({sql})::text = ANY('{{{','.join(self.values)}}}'::text[])", list(params)


@deconstructible(path="django_durable_scheduler.constraints.SameTruth")
class SameTruth(Func):
    """``(left) = (right)`` for two conditions that are never NULL: both hold or neither."""

    output_field = BooleanField()
    conditional = True

    def __init__(self, left: Q | Func, right: Q | Func) -> None:
        super().__init__(left, right)

    def as_sql(self, compiler: SQLCompiler, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        left, right = self.source_expressions
        left_sql, left_params = _condition(compiler, left)
        right_sql, right_params = _condition(compiler, right)
        return f"({left_sql}) = ({right_sql})", [*left_params, *right_params]


def _condition(compiler: SQLCompiler, condition: Any) -> tuple[str, list[Any]]:
    """A condition's SQL. Django folds a condition on constants (as when it validates a model
    instance against a constraint, with the instance's values in place of the columns) into
    "matches nothing" or "matches everything": that is false or true here."""
    try:
        sql, params = compiler.compile(condition)
    except EmptyResultSet:
        sql, params = compiler.compile(Value(False))
    except FullResultSet:
        sql, params = compiler.compile(Value(True))
    return sql, list(params)
