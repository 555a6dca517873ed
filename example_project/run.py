#!/usr/bin/env python3
"""Run the example project: ``python3 example_project/run.py [runscheduler arguments]``.

Standard library only. Creates (or reuses) the repository's ``.venv`` exactly as ``tests/run.py``
does, applies the migrations to the example database (``DATABASE_URL``, by default the SQLite file
``example_project/db.sqlite3``), creates the demo jobs and enqueues some work
(``manage.py demo_seed``), then runs ``manage.py runscheduler`` with the given arguments.
Ctrl-C stops the scheduler the way it handles SIGINT, and this script exits with its status.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def _load_devenv() -> ModuleType:
    path = HERE.parent / "tests" / "devenv.py"
    spec = importlib.util.spec_from_file_location("durable_scheduler_devenv", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def run_child(cmd: list[str]) -> int:
    """Run a command in the foreground and wait for it, even through Ctrl-C.

    The child is in our process group, so Ctrl-C reaches it directly; we only wait for it to
    finish its own shutdown (a second Ctrl-C is the child's to handle too).
    """
    proc = subprocess.Popen(cmd, cwd=HERE)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


def main(argv: list[str]) -> int:
    devenv = _load_devenv()
    try:
        venv = devenv.ensure_default_venv()
    except devenv.SetupError as exc:
        print(f"example_project/run.py: {exc}", file=sys.stderr)
        return 1
    manage = [str(venv.python), str(HERE / "manage.py")]

    print("$ manage.py migrate", flush=True)
    if code := run_child([*manage, "migrate", "--no-input"]):
        return code

    print("$ manage.py demo_seed", flush=True)
    if code := run_child([*manage, "demo_seed"]):
        return code
    args = argv or ["--verbosity", "1"]
    print(f"$ manage.py runscheduler {' '.join(args)}  (Ctrl-C to stop)", flush=True)
    return run_child([*manage, "runscheduler", *args])


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # A child killed by SIGINT reports -2; exit as a shell would after Ctrl-C.
    sys.exit(130 if code < 0 else code)
