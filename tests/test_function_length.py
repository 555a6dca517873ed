"""No function over 80 lines in the package, the benchmark or the tests, unless it is listed
below with the reason a reader accepts. A long function is read by scrolling; split into named
steps, it is read by its names."""

from __future__ import annotations

import ast
from pathlib import Path

from .tree import reads_the_tree

ROOT = Path(__file__).resolve().parent.parent

pytestmark = reads_the_tree
TREES = ("django_durable_scheduler", "bench", "tests", "noxfile.py")
LIMIT = 80  # lines, from ``def`` to the last line of the body, docstring and comments included

# "path::qualified name": why it may stay longer. Keep it empty if at all possible.
ALLOWED: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from _functions(node, f"{name}.")
        else:
            yield from _functions(node, prefix)


def long_functions(root: Path = ROOT, trees: tuple[str, ...] = TREES, limit: int = LIMIT) -> dict[str, int]:
    """ "path::qualified name" -> length in lines, of every function longer than ``limit``."""
    found: dict[str, int] = {}
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")) if (root / tree).is_dir() else [root / tree]:
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            module = ast.parse(path.read_text(), str(path))
            for name, node in _functions(module):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found[f"{path.relative_to(root).as_posix()}::{name}"] = length
    return found


def test_no_function_over_80_lines_unless_allowed():
    too_long = {name: length for name, length in long_functions().items() if name not in ALLOWED}
    assert not too_long, "\n".join(f"{name}: {length} lines" for name, length in sorted(too_long.items()))


def test_every_allowed_function_is_still_long():
    stale = ALLOWED.keys() - long_functions().keys()
    assert not stale, f"no longer over {LIMIT} lines, take them off the list: {sorted(stale)}"


def test_methods_and_nested_functions_are_measured(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "class C:\n"
        "    def method(self):\n"
        "        a = 1\n"
        "        return a\n"
        "\n"
        "\n"
        "def outer():\n"
        "    def inner():\n"
        "        a = 1\n"
        "        return a\n"
        "\n"
        "    return inner\n"
        "\n"
        "\n"
        "def short():\n"
        "    return 1\n"
    )
    assert long_functions(tmp_path, ("pkg",), limit=2) == {
        "pkg/m.py::C.method": 3,
        "pkg/m.py::outer": 6,
        "pkg/m.py::outer.inner": 3,
    }
