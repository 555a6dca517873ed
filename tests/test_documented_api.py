"""The package reaches the database through Django's and psycopg's documented API
(docs/design.md, "Plain Django underneath"): no SQL-level statement preparation, none of the
ORM's undocumented internals, no model built from positional values. A static check over the
package's source, so that such a shortcut cannot come back unnoticed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import django_durable_scheduler

PACKAGE = Path(django_durable_scheduler.__file__).parent

# Text that stands for a shortcut past the documented API, and why it is refused.
FORBIDDEN = {
    r"\bPREPARE\b|\bEXECUTE\b|\bDEALLOCATE\b": "SQL-level PREPARE (psycopg prepares)",
    r"\bget_col\b": "Field.get_col (undocumented)",
    r"\bget_db_converters\b": "get_db_converters (undocumented: QuerySet.raw converts)",
    r"\bcast_db_type\b": "Field.cast_db_type (undocumented)",
    r"\bsql_with_params\b": "Query.sql_with_params (undocumented: QuerySet.explain)",
    r"\bhas_db_default\b": "Field.has_db_default (undocumented)",
    r"pre_save\s+is\b|pre_save\s+in\s*\(": "an identity check on Django's methods",
    r"_meta\.(local_)?concrete_fields\b": "_meta.concrete_fields (undocumented: _meta.get_fields())",
    r"\bfrom_db\(": "Model.from_db called by hand (QuerySet.raw builds instances)",
}


def _sources() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts)


def test_no_module_keeps_plans_by_hand():
    assert not (PACKAGE / "db" / "kept.py").exists()
    assert not (PACKAGE / "db" / "statements.py").exists()


def test_no_undocumented_shortcut_in_the_package():
    found = []
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, why in FORBIDDEN.items():
                if re.search(pattern, code):
                    found.append(f"{path.relative_to(PACKAGE)}:{number}: {why}: {line.strip()}")
    assert not found, "\n".join(found)


def _model_names() -> set[str]:
    tree = ast.parse((PACKAGE / "models.py").read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and not node.name.endswith(("Status", "Manager"))
    }


def test_models_are_built_from_keywords():
    """``Model(*values)`` relies on the order of the model's fields: a field added with
    ``makemigrations`` would shift every value. Every instance is made from keywords."""
    models = _model_names()
    assert {"Occurrence", "Event", "Job"} <= models
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args:
                name = node.func.id if isinstance(node.func, ast.Name) else None
                if name in models or (name or "").lower() == "model":
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_refuses():
    # The patterns themselves, on the lines the old code had.
    lines = [
        'cursor.execute(f"PREPARE {name} AS {text}")',
        "column = field.get_col(field.model._meta.db_table)",
        "if type(field).pre_save is Field.pre_save:",
        "str(field.cast_db_type(connection))",
        "for field in model._meta.concrete_fields:",
    ]
    for line in lines:
        assert any(re.search(pattern, line) for pattern in FORBIDDEN), line
