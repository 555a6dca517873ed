"""Stop signals of a ``runscheduler`` process from its first moments: SIGTERM and SIGINT are
recorded, not fatal, from the moment this is installed, so a process manager that stops a
worker while Python and Django are still starting sees it exit 0, having claimed nothing.

``python -m django_durable_scheduler runscheduler ...`` installs it before Django is
imported; ``manage.py runscheduler`` when Django imports this app. The command takes what
was recorded (:func:`take`) once its own handlers are in place.
"""

from __future__ import annotations

import signal
import sys
import threading

_stops: list[int] = []
_installed: list[bool] = []


def _record(signum: int, _frame: object) -> None:
    _stops.append(signum)  # a list append takes no lock a signal could find held


def install() -> None:
    """Record SIGTERM and SIGINT from now on (once; only from the main thread)."""
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed.append(True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _record)


def install_for_runscheduler(argv: list[str] | None = None) -> None:
    """:func:`install`, when this process runs the ``runscheduler`` command."""
    args = sys.argv if argv is None else argv
    if args[1:2] == ["runscheduler"]:
        install()


def take() -> list[int]:
    """The signals recorded so far, forgotten here: the caller has its own handlers by now."""
    taken = _stops[:]
    del _stops[: len(taken)]
    return taken
