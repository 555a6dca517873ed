#!/usr/bin/env python3
"""Run the whole test matrix: ``python3 tests/run.py [options] [-- pytest arguments]``.

Standard library only. Builds ``.venv`` (this Python, Django 5.2) and ``.venv-dj6`` (Python 3.13 or
3.12, Django 6), runs the migration check and the linters, then pytest on each leg. On a machine
with two cores or more two pytest processes run side by side (``--jobs``), each leg in parts: two
shares of its test modules and, on PostgreSQL, the tests marked ``restarts_database_server``
apart, with the server to themselves (``tests/runner/legs.py``, ``tests/runner/lanes.py``). The legs:

    sqlite        Python 3.11 + Django 5.2 + SQLite file
    postgres      Python 3.11 + Django 5.2 + PostgreSQL  postgres://postgres@127.0.0.1:5432/dsch
    mariadb       Python 3.11 + Django 5.2 + MariaDB     mysql://root@127.0.0.1:3306/dsch
    dj6-sqlite    Python 3.13 + Django 6   + SQLite file (the modules where SQLite and the
                  Django or Python version meet)
    dj6-postgres  Python 3.13 + Django 6   + PostgreSQL  postgres://postgres@127.0.0.1:5432/dsch6
                  (with server-side binding and prepared statements: DSCH_PG_PREPARED=1)
    pgbouncer     Python 3.11 + Django 5.2 + PostgreSQL through PgBouncer (transaction mode),
                  started here: the pooler and crash tests

The Django 6 legs test the package as users get it: the sdist and wheel are built
(``python -m build``) and checked (``twine check``, and that the wheel holds every file of the
package), the wheel replaces ``.venv-dj6``'s editable install, and pytest runs from a copy of
``tests/`` in ``.wheel-tests/``, where no source of the package can shadow it.

A leg whose database server does not answer is skipped (a failure with ``--require-all``).
The last line printed is ``N passed, M failed`` summed over the legs; the exit code is 1 when a
check or a leg failed or no leg ran a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the runner, as tests.runner

from tests import devenv
from tests.runner import lanes, legs, prepare, process, results

LEG_TIMEOUT_MIN = 25
# A leg keeps about one core busy (pytest, the database server and the tests' worker processes
# together, mostly waiting on each other), so two legs side by side fit a two-core machine.
JOBS = max(1, min(2, os.cpu_count() or 1))


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1 :]
    every = ",".join(leg.name for leg in legs.LEGS)
    parser = argparse.ArgumentParser(
        prog="python3 tests/run.py",
        description="Build the venvs, lint, and run pytest on every database and Django version.",
        epilog="Arguments after -- go to pytest, e.g.: python3 tests/run.py --legs sqlite -- -k identity",
    )
    parser.add_argument("--legs", default=every, help=f"comma-separated legs to run (default: all): {every}")
    parser.add_argument(
        "--require-all", action="store_true", help="a leg that cannot run (no server, no Python) fails"
    )
    parser.add_argument(
        "--install-system-deps",
        action="store_true",
        help="apt-get install libmariadb-dev pkg-config (and pgbouncer) when missing (root only)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=JOBS,
        help="legs run side by side (default %(default)s; 1 runs them one after another, output live)",
    )
    parser.add_argument("--no-lint", action="store_true", help="skip ruff and mypy")
    parser.add_argument(
        "--leg-timeout", type=float, default=LEG_TIMEOUT_MIN, help="minutes per leg (default %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        args.legs = legs.select(args.legs)
    except ValueError as exc:
        parser.error(str(exc))
    return args, pytest_args


class PartRunner:
    """Runs one part of a leg and records it in the leg's result; with parts side by side, each
    part's output is printed whole when it ends."""

    def __init__(self, args: argparse.Namespace, pytest_args: list[str], jobs: int, started: float) -> None:
        self.args, self.pytest_args, self.jobs, self.started = args, pytest_args, jobs, started
        self.print_lock = threading.Lock()

    def __call__(self, leg: legs.Leg, part: legs.Part, item: tuple[results.Result, devenv.Venv]) -> None:
        result, venv = item
        title = f"leg {leg.name}{part.title}: Python {venv.python_version}"
        title += f", Django {venv.django_version}, {leg.database}"
        if self.jobs == 1:
            prepare.banner(title)
        else:
            with self.print_lock:
                prepare.say(f"{time.monotonic() - self.started:6.1f} s: leg {leg.name}{part.title} starts")
        start = time.monotonic()
        code, closing, output = process.run_pytest(
            venv.python,
            {**prepare.leg_env(leg.url), **dict(leg.env), **dict(part.env)},
            [*self.pytest_args, *leg.tests],
            self.args.leg_timeout * 60,
            echo=self.jobs == 1,
            cwd=devenv.WHEEL_STAGE if leg.wheel else devenv.ROOT,
        )
        seconds = time.monotonic() - start
        with self.print_lock:
            passed = results.record(result, part, code, closing, seconds, self.args.leg_timeout)
            if self.jobs > 1:
                prepare.banner(f"{title} ({'passed' if passed else 'failed'}, {seconds:.1f} s)")
                sys.stdout.buffer.write(b"".join(output))
                sys.stdout.flush()


def run_legs(
    args: argparse.Namespace,
    ready: list[tuple[legs.Leg, results.Result, devenv.Venv]],
    pytest_args: list[str],
    started: float,
) -> None:
    """Run the legs' parts, ``args.jobs`` at a time."""
    jobs = max(1, min(args.jobs, len(ready)))
    parts = [(leg, part, (result, venv)) for leg, result, venv in ready for part in legs.leg_parts(leg, jobs)]
    if jobs > 1:
        prepare.say(f"{len(ready)} legs in {len(parts)} parts, {jobs} at a time;")
        prepare.say("each part's output follows when it ends")
    for _, part, (result, _), exc in lanes.run_in_lanes(
        parts, jobs, PartRunner(args, pytest_args, jobs, started)
    ):
        result.status = "failed"
        result.add_why(f"{part.title.strip(' ()') or 'leg'}: the runner failed: {exc!r}")


def main(argv: list[str]) -> int:
    args, pytest_args = parse_args(argv)
    started = time.monotonic()
    prepare.banner("virtualenvs")
    venvs, unavailable = prepare.build_venvs(args.legs, args.install_system_deps)
    checks = prepare.checks(venvs, lint=not args.no_lint)
    wheel_failed = ""
    if "default" in venvs and any(leg.wheel for leg in args.legs):
        check = prepare.package_check(venvs["default"], venvs.get("dj6"))
        checks.append(check)
        wheel_failed = check.why if check.status == "failed" else ""
    leg_results, ready = prepare.runnable(args.legs, venvs, unavailable, wheel_failed)
    with contextlib.ExitStack() as stack:
        prepare.pooler(ready, args.install_system_deps, stack)
        run_legs(args, ready, pytest_args, started)
    results.settle(leg_results, require_all=args.require_all)
    prepare.banner("summary")
    text, code = results.summary(checks, leg_results, time.monotonic() - started)
    print(f"\n{text}", flush=True)
    return code


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("\n[run.py] interrupted", file=sys.stderr)
        sys.exit(130)
