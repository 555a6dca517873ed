"""The legs of the test matrix and the parts each runs in."""

from __future__ import annotations

from dataclasses import dataclass

from .. import devenv


@dataclass(frozen=True)
class Leg:
    name: str
    venv: str  # "default" or "dj6"
    database: str  # "sqlite", "postgres" or "mariadb"
    url: str | None  # DATABASE_URL; None leaves tests/settings.py on its SQLite file
    env: tuple[tuple[str, str], ...] = ()  # more environment for its pytest runs
    wheel: bool = False  # runs against the built wheel, from devenv.WHEEL_STAGE
    tests: tuple[str, ...] = ()  # a leg of these pytest arguments only (test modules), in one part
    pooler: bool = False  # through devenv.pgbouncer(), in transaction mode


@dataclass(frozen=True)
class Part:
    """One pytest run of a leg: all of it, or a share (``share``) selected by ``env``."""

    title: str = ""
    env: tuple[tuple[str, str], ...] = ()
    exclusive: bool = False  # needs the leg's database server to itself
    order: int = 0  # parts of a lower order start first

    @property
    def share(self) -> bool:
        return bool(self.env)


# With legs side by side, each leg runs in parts that tests/conftest.py selects from the
# environment: its share SHARD_ENV=1 or 2 of the test modules (tests/conftest.py's FIRST_SHARE
# and the rest, so that the lanes end together), and, on the servers in RESTARTED, the tests
# marked restarts_database_server (tests/test_crash.py stops PostgreSQL) apart, with the server
# to themselves, the rest of the leg beside other legs. Parts of one leg never run at once (one
# test database).
RESTARTED = frozenset({"postgres"})
RESTART_ENV = "DSCH_SERVER_RESTART_TESTS"
SHARD_ENV = "DSCH_TEST_SHARD"

# Django 6 runs the whole suite on PostgreSQL; on SQLite, what depends on SQLite and on the
# Django or Python version: migrations and schema changes (SQLite remakes tables as each Django
# version does), the admin in a browser, the README's quickstart, the example project,
# wake-ups, the worker, django.tasks, and the tests that run on SQLite only. (The rest would
# repeat the dj6-postgres leg's work with nothing new.)
DJ6_SQLITE_MODULES = (
    "migrations",
    "schema_change",
    "unmigrated",
    "admin",
    "admin_browser",
    "dashboard",
    "readme",
    "example_project",
    "triggers_property",
    "constraints",
    "notify",
    "wakeups",
    "runscheduler",
    "worker",
    "kernel",
    "tasks_backend",
)

LEGS = (
    Leg("sqlite", "default", "sqlite", None),
    Leg("postgres", "default", "postgres", "postgres://postgres@127.0.0.1:5432/dsch"),
    Leg("mariadb", "default", "mariadb", "mysql://root@127.0.0.1:3306/dsch"),
    Leg(
        "dj6-sqlite",
        "dj6",
        "sqlite",
        None,
        wheel=True,
        tests=tuple(f"tests/test_{name}.py" for name in DJ6_SQLITE_MODULES),
    ),
    # With the PostgreSQL OPTIONS the README suggests (server-side binding, prepared
    # statements), so that both ways of talking to PostgreSQL are tested.
    Leg(
        "dj6-postgres",
        "dj6",
        "postgres",
        "postgres://postgres@127.0.0.1:5432/dsch6",
        (("DSCH_PG_PREPARED", "1"),),
        wheel=True,
    ),
    # The worker through a real PgBouncer in transaction mode (what most PostgreSQL deployments
    # put in front): wake-ups, a drain by several processes, crash recovery. Its test database
    # is created and dropped beside the pooler (prepare.pooler_database), so pytest reuses it.
    Leg(
        "pgbouncer",
        "default",
        "postgres",
        f"postgres://postgres@127.0.0.1:{devenv.PGBOUNCER_PORT}/dschpool",
        (("DSCH_POOLER", "pgbouncer"), (RESTART_ENV, "skip")),
        tests=("--reuse-db", "tests/test_pooler.py", "tests/test_crash.py"),
        pooler=True,
    ),
)
POOLER_TEST_DATABASE = "test_dschpool"
# Slowest first (as measured in CI): with legs side by side, the last to start is a short one.
LEG_ORDER = ("postgres", "mariadb", "dj6-postgres", "sqlite", "dj6-sqlite", "pgbouncer")


def select(names: str) -> list[Leg]:
    """The legs named in a comma-separated list, in LEGS's order; ValueError for an unknown
    name or an empty list."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {leg.name for leg in LEGS})
    if unknown or not wanted:
        raise ValueError(f"unknown legs {unknown}; choose from {', '.join(leg.name for leg in LEGS)}")
    return [leg for leg in LEGS if leg.name in wanted]


def leg_parts(leg: Leg, jobs: int) -> list[Part]:
    """The pytest runs of ``leg`` when ``jobs`` run side by side: one with a single lane or a
    leg of named modules, else two shares and, on a server in RESTARTED, its restart tests."""
    if jobs == 1 or leg.tests:
        return [Part()]
    parts: list[Part] = []
    shared: tuple[tuple[str, str], ...] = ()
    if leg.database in RESTARTED:
        parts.append(Part(" (server restart)", ((RESTART_ENV, "only"),), exclusive=True))
        shared = ((RESTART_ENV, "skip"),)
    for n in (1, 2):
        parts.append(Part(f" (part {n} of 2)", ((SHARD_ENV, str(n)), *shared), order=n))
    return parts
