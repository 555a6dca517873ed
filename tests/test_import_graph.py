"""No import cycle in the package or the benchmark.

The graph is read from the source with ``ast``: every import statement counts, at module level,
inside a function or under ``TYPE_CHECKING``. A cycle that only an import inside a function
holds together still ties its modules into one knot that cannot be read or changed alone.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from .tree import reads_the_tree

ROOT = Path(__file__).resolve().parent.parent

pytestmark = reads_the_tree
PACKAGES = ("django_durable_scheduler", "bench")


def modules_of(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under each package."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names one import statement may load (a name after ``from`` may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _with_parents(name: str, importer: str) -> list[str]:
    """Importing ``a.b.c`` runs ``a`` and ``a.b`` first, unless the importer is inside them
    (then they are already loading)."""
    parts = name.split(".")
    names = [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return [n for n in names if n == name or not (importer == n or importer.startswith(f"{n}."))]


def _only_submodules(names: list[str], modules: dict[str, Path]) -> bool:
    """Whether a ``from package import a, b`` takes only submodules of the package: then the
    package itself is only loaded, not read, which from inside it is no dependency."""
    return all(name in modules for name in names[1:])


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = _imported(module, path, node)
                inside = isinstance(node, ast.ImportFrom) and module.startswith(f"{names[0]}.")
                if inside and _only_submodules(names, modules):
                    names = names[1:]
                for name in names:
                    edges.update(_with_parents(name, module))
        graph[module] = {name for name in edges if name in modules and name != module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module, shortest first: ``[a, b, ..., a]``."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & members):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def cycles_under(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Each knot of modules that import one another: one cycle in it, then all its members."""
    graph = import_graph(modules_of(root, packages))
    return [
        f"{' -> '.join(a_cycle(graph, component))} (the knot: {', '.join(component)})"
        for component in strongly_connected(graph)
    ]


def test_no_import_cycle_in_the_package_or_the_bench():
    cycles = cycles_under(ROOT, PACKAGES)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_graph_resolves_relative_imports_and_sees_the_real_edges():
    graph = import_graph(modules_of(ROOT, PACKAGES))
    assert "django_durable_scheduler.kernel.jobs" in graph["django_durable_scheduler.kernel"]
    # in a function:
    assert "django_durable_scheduler.kernel" in graph["django_durable_scheduler.handlers.declared"]
    assert "bench.harness" in graph["bench.scale"]


def test_a_cycle_through_an_import_inside_a_function_is_named(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (package / "d.py").write_text("import pkg.a\n")  # into the cycle, not part of it
    assert cycles_under(tmp_path, ("pkg",)) == [
        "pkg.a -> pkg.sub.b -> pkg.c -> pkg.a (the knot: pkg.a, pkg.c, pkg.sub.b)"
    ]
