"""The package's ``__init__.pyi`` names exactly what ``__init__.py`` exports lazily, each from
the module it is loaded from, so users' type checkers see the API that runs (and
``tests/typed_api_usage.py``, which the lint leg type-checks, shows they see its types)."""

from __future__ import annotations

import ast
from importlib import import_module
from pathlib import Path

import pytest
from django.conf import settings as django_settings

import django_durable_scheduler as scheduler

STUB = Path(scheduler.__file__).with_suffix(".pyi")

no_database = pytest.mark.skipif(
    "sqlite" not in django_settings.DATABASES["default"]["ENGINE"],
    reason="no database here: the SQLite legs run it",
)


def stub_exports() -> dict[str, str]:
    """Each name the stub re-exports (``from .module import name as name``) and its module."""
    found: dict[str, str] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            assert node.level == 1 and node.module, ast.unparse(node)
            for alias in node.names:
                assert alias.asname == alias.name, f"{alias.name} is not re-exported: {ast.unparse(node)}"
                found[alias.name] = node.module
    return found


def stub_all() -> list[str]:
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__":
            return list(ast.literal_eval(node.value))
    raise AssertionError("the stub has no __all__")


@no_database
def test_the_stub_names_each_export_from_its_module():
    assert stub_exports() == scheduler._EXPORTS
    assert stub_all() == scheduler.__all__


@no_database
def test_each_export_is_the_object_its_module_holds():
    for name, module in stub_exports().items():
        assert getattr(scheduler, name) is getattr(import_module(f"{scheduler.__name__}.{module}"), name)
