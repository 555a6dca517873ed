"""The package's layers, as they stand on disk: every module belongs to one, and imports run one
way, from the outer layers to the inner ones (``docs/design.md``, "The code's layers").

The graph is the one ``test_import_graph`` reads (every import statement, inside functions
too). A module may import from its own package and from any part of a lower rank; never
from a higher rank, nor from another part of the same rank (the worker and the admin know
nothing of each other). Also checked here: no module or class grows past the size at which
it is read by scrolling instead of by its names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .test_import_graph import import_graph, modules_of
from .tree import reads_the_tree

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_durable_scheduler"

# These read the repository's own tree; the Django 6 legs run a copy of tests/ beside the
# installed wheel, where there is none.
pytestmark = reads_the_tree

# Each part of the package (a subpackage or a top-level module) and its rank: lower ranks
# are the foundations the higher ones build on.
RANKS: dict[str, float] = {
    # The schema and the vocabulary everyone shares.
    "exceptions": 0,
    "signals": 0,
    "constraints": 0,
    # The pure rules: the statuses, lifecycle table, event types, triggers, schedules, chain
    # specs, authority envelopes, outcomes, identity and validation. The models store them.
    "rules": 0.25,
    # The models' own field types (an authority snapshot stored compact), named by migrations.
    "fields": 0.4,
    "models": 0.5,
    # Database-specific SQL behind one interface, and the wake-ups.
    "db": 1,
    # Settings and the clock (the database clock reads the server's time through db).
    "conf": 2,
    # Metrics and traces, which the kernel records as it writes.
    "telemetry": 4,
    # Every transactional writer of occurrence state.
    "kernel": 5,
    # The handlers and the jobs declared in code beside them.
    "handlers": 6,
    # What settled history becomes: retention, archive, partitions, rollups; the health report.
    "housekeeping": 7,
    # The django.tasks backend.
    "tasks": 7.5,
    # The two outer layers: the worker loop and the admin.
    "worker": 9,
    "admin": 9,
    # Wiring: the app config, the system checks, the commands, the migrations, the API.
    "checks": 9.5,
    "apps": 10,
    "management": 10,
    "migrations": 10,
    "": 10,  # django_durable_scheduler/__init__.py, the lazy public API
    "__main__": 11,  # python -m django_durable_scheduler: Django's command line, above the commands
    # The toolkit for testing code that uses the app: it drives the worker's parts by hand.
    "testing": 10,
}

# Lines a module or a class may have before it is split at its seams, and the few that may
# stay longer, each with the reason a reader accepts.
MODULE_LIMIT = 600
CLASS_LIMIT = 250
ALLOWED_LONG: dict[str, str] = {
    "django_durable_scheduler/models.py": (
        "the whole schema in the one module where Django and its readers look for an app's models,"
        " read top to bottom beside the migrations made from it"
    ),
}


def part_of(module: str) -> str:
    """The part (a key of RANKS) that a dotted module name belongs to."""
    inner = module.removeprefix(PACKAGE).lstrip(".")
    return inner.split(".", 1)[0]


def wrong_way_imports() -> list[str]:
    graph = import_graph(modules_of(ROOT, (PACKAGE,)))
    found = []
    for module, targets in sorted(graph.items()):
        here = part_of(module)
        for target in sorted(targets):
            there = part_of(target)
            if there == here or target == PACKAGE:
                continue
            if RANKS[there] > RANKS[here] or (RANKS[there] == RANKS[here]):
                found.append(
                    f"{module} imports {target} ({here} is rank {RANKS[here]}, {there} {RANKS[there]})"
                )
    return found


# The modules at the top of the package: the ones Django and its readers look for there, and
# the check constraints' expressions and the field types, which the migrations name by their
# import path.
TOP_LEVEL = {
    "__init__",
    "__main__",
    "apps",
    "checks",
    "conf",
    "constraints",
    "exceptions",
    "fields",
    "models",
    "signals",
}
# What a module under rules/ may import at run time from the package, and from Django.
PURE_PACKAGE = ("exceptions", "rules")
PURE_DJANGO = ("django.db.models.enums",)


def _runtime_imports(path: Path, module: str, *, typing_too: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file but those under ``if TYPE_CHECKING:``
    (with ``typing_too``, those as well)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if not typing_too and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return found


def impure_rules(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / PACKAGE / "rules").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for line, target in _runtime_imports(path, module):
            inner = target.removeprefix(PACKAGE + ".")
            if target.startswith(PACKAGE + "."):
                allowed = inner.split(".", 1)[0] in PURE_PACKAGE
            elif target.startswith("django."):
                allowed = target.startswith(PURE_DJANGO)
            else:
                allowed = True
            if not allowed:
                found.append(f"{path.relative_to(root).as_posix()}:{line} imports {target}")
    return found


def test_the_rules_touch_no_database():
    """The rules are pure: at run time a module under rules/ imports, of the package, only the
    exceptions and other rules, and of Django only the plain choices enums (``TextChoices``)
    the statuses are written in. Not the models, ``db``, ``conf`` (the database clock), the
    kernel, nor ``django.db``'s connections, transactions, querysets or expressions: whatever
    reads or writes a row is the kernel's. A type named only for annotations (under
    ``if TYPE_CHECKING:``) runs nothing and is allowed."""
    found = impure_rules()
    assert not found, "rules that touch the database (move the read to the kernel):\n" + "\n".join(found)


def _worker_modules(root: Path) -> list[tuple[Path, str]]:
    paths = sorted((root / PACKAGE / "worker").rglob("*.py"))
    return [(p, ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")) for p in paths]


def kernel_internals_used_by_the_worker(root: Path = ROOT) -> list[str]:
    submodules = {path.stem for path in (root / PACKAGE / "kernel").iterdir() if path.stem != "__init__"}
    found = []
    for path, module in _worker_modules(root):
        for line, target in _runtime_imports(path, module, typing_too=True):
            inner = target.removeprefix(f"{PACKAGE}.kernel.")
            if inner != target and inner.split(".", 1)[0] in submodules:
                found.append(f"{path.relative_to(root).as_posix()}:{line} imports {target}")
    return found


# A queryset's or a manager's writes; ``save`` and ``delete`` are also a row's.
ROW_WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_create", "bulk_update", "delete"}
SQL_WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b")


def _from_objects(node: ast.AST, querysets: set[str]) -> bool:
    """Whether an expression is a chain that starts at a manager (``Model.objects...``) or at
    a name bound to one."""
    while isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute) and node.attr == "objects":
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id in querysets


def model_writes_in_the_worker(root: Path = ROOT) -> list[str]:
    found: list[tuple[str, int, str]] = []
    for path, _ in _worker_modules(root):
        tree = ast.parse(path.read_text(), str(path))
        querysets = {  # names bound to a manager or queryset (``rows = Model.objects.using(x)``)
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and _from_objects(node.value, set())
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method, receiver = node.func.attr, node.func.value
                write = method == "save" or (method in ROW_WRITES and _from_objects(receiver, querysets))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                write = SQL_WRITE.search(node.value) is not None
            else:
                continue
            if write:
                found.append((path.relative_to(root).as_posix(), node.lineno, ast.unparse(node)[:80]))
    return [f"{name}:{line}: {code}" for name, line, code in sorted(found)]


def test_the_worker_calls_the_kernel_through_its_facade():
    """The worker imports the kernel as one module (``from .. import kernel``, whose names are
    the facade ``kernel/__init__.py`` lists), never one of its submodules: what the loop may
    do to the database is that list."""
    found = kernel_internals_used_by_the_worker()
    assert not found, (
        "the worker reaches into the kernel (export the name from kernel/__init__.py):\n" + "\n".join(found)
    )


def test_the_worker_writes_no_table():
    """No worker module writes a row itself (a queryset's or manager's update, create, delete,
    bulk_create, or a row's save()): every write is the kernel's. Reads (what the worker
    learns at its start, in ``recent``) are allowed."""
    found = model_writes_in_the_worker()
    assert not found, "the worker writes a table (move the write to the kernel):\n" + "\n".join(found)


def test_the_worker_checks_see_a_reach_and_a_write(tmp_path):
    """Both checks find what the worker once did: a claim through ``kernel.claiming``, and the
    heartbeat's own upsert and update of the workers table (through a name bound to the
    manager, inside a lambda), and a row saved or a table written in SQL."""
    (tmp_path / PACKAGE / "kernel" / "authority").mkdir(parents=True)
    (tmp_path / PACKAGE / "kernel" / "claiming.py").touch()
    worker = tmp_path / PACKAGE / "worker"
    worker.mkdir()
    (worker / "beat.py").write_text(
        "from ..kernel import claiming, claim\n"
        "from ..kernel.authority import reservations\n"
        "def beat(self, values, until):\n"
        "    rows = WorkerHeartbeat.objects.using(self.using)\n"
        "    self._in_turn(lambda: rows.update_or_create(worker_id=self.worker_id, defaults=values), until)\n"
        "    self._in_turn(lambda: rows.filter(worker_id=self.worker_id).update(**values), until)\n"
        "    WorkerHeartbeat.objects.using(alias).filter(worker_id=self.worker_id).update(last_seen_at=now)\n"
        "    row.save(update_fields=['pid'])\n"
        "    cursor.execute('DELETE FROM durable_scheduler_workers WHERE worker_id = %s', [self.worker_id])\n"
        "    values.update(pid=1)  # a dict: no write\n"
        "    WorkerHeartbeat.objects.filter(stopped_at=None).count()  # a read\n"
    )
    assert [line.split(" imports ")[1] for line in kernel_internals_used_by_the_worker(tmp_path)] == [
        f"{PACKAGE}.kernel.claiming",
        f"{PACKAGE}.kernel.authority.reservations",
    ]
    assert [int(line.split(":")[1]) for line in model_writes_in_the_worker(tmp_path)] == [5, 6, 7, 8, 9]


def test_the_top_level_modules_are_the_conventional_ones():
    """Everything else at the top of the package lives in the subpackage of its layer."""
    top = {path.stem for path in (ROOT / PACKAGE).glob("*.py")}
    assert top == TOP_LEVEL, "give a new module a home in a subpackage"


def test_every_part_of_the_package_has_a_rank():
    parts = {part_of(module) for module in modules_of(ROOT, (PACKAGE,))}
    assert parts - RANKS.keys() == set(), "give each new part a rank in RANKS"
    assert RANKS.keys() - parts == set(), "RANKS names parts that are gone"


def test_the_layers_are_subpackages_on_disk():
    for layer in ("db", "rules", "telemetry", "kernel", "housekeeping", "worker", "admin"):
        assert (ROOT / PACKAGE / layer / "__init__.py").is_file(), layer


def test_imports_run_from_the_outer_layers_in():
    wrong = wrong_way_imports()
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def _sizes(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    yield "", len(path.read_text().splitlines()), MODULE_LIMIT
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            yield f"::{node.name}", (node.end_lineno or node.lineno) - node.lineno + 1, CLASS_LIMIT


def too_long() -> dict[str, int]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for suffix, length, limit in _sizes(path):
            if length > limit:
                found[f"{path.relative_to(ROOT).as_posix()}{suffix}"] = length
    return found


def test_no_module_or_class_past_its_size():
    long = {name: n for name, n in too_long().items() if name not in ALLOWED_LONG}
    assert not long, "split at the seams:\n" + "\n".join(f"{k}: {v} lines" for k, v in sorted(long.items()))


def test_every_allowed_long_one_is_still_long():
    assert not ALLOWED_LONG.keys() - too_long().keys()


def test_the_tests_are_laid_out_like_the_package():
    """A test module sits in the folder of the part it tests (tests/kernel/ for the kernel...);
    the ones at the top test the project as a whole or a top-level module."""
    folders = {path.name for path in (ROOT / "tests").iterdir() if (path / "__init__.py").is_file()}
    helpers = {"procs", "testapp"}
    assert folders - helpers <= RANKS.keys(), "a test folder that is no part of the package"
    for layer in ("db", "rules", "kernel", "housekeeping", "worker", "admin"):
        assert list((ROOT / "tests" / layer).glob("test_*.py")), f"no tests under tests/{layer}/"
