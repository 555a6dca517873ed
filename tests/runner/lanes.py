"""The legs' parts, ``jobs`` at a time, in the order and company the rules allow."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Generic, TypeVar

from . import process
from .legs import LEG_ORDER, Leg, Part

T = TypeVar("T")


def may_start(leg: Leg, part: Part, running: list[tuple[Leg, Part]]) -> bool:
    """Whether ``part`` of ``leg`` may start beside the parts ``running``: never beside a part
    of its own leg (one test database), and an exclusive part (one that restarts the server)
    never beside another part on its database server."""
    if any(other.name == leg.name for other, _ in running):
        return False
    if leg.database == "sqlite":
        return True
    now = [other for each, other in running if each.database == leg.database]
    return not now if part.exclusive else not any(other.exclusive for other in now)


def start_order(leg: Leg, part: Part) -> tuple[int, int]:
    """The short server-restart parts first (they wait for nothing then), then the first shares
    of the longest legs, so that the last to start are short ones."""
    return part.order, LEG_ORDER.index(leg.name)


class PartQueue(Generic[T]):
    """The parts waiting, handed out to the lanes as ``may_start`` allows."""

    def __init__(self, items: list[tuple[Leg, Part, T]]) -> None:
        self.waiting = sorted(items, key=lambda item: start_order(item[0], item[1]))
        self.running: list[tuple[Leg, Part]] = []
        self.changed = threading.Condition()

    def take(self) -> tuple[Leg, Part, T] | None:
        """The next part that may start, waiting for one; None once none is left."""
        with self.changed:
            while self.waiting:
                for item in self.waiting:
                    if may_start(item[0], item[1], self.running):
                        self.waiting.remove(item)
                        self.running.append((item[0], item[1]))
                        return item
                self.changed.wait()
            return None

    def done(self, leg: Leg, part: Part) -> None:
        with self.changed:
            self.running.remove((leg, part))
            self.changed.notify_all()

    def clear(self) -> None:
        with self.changed:
            self.waiting.clear()
            self.changed.notify_all()


def run_in_lanes(
    items: list[tuple[Leg, Part, T]], jobs: int, run: Callable[[Leg, Part, T], None]
) -> list[tuple[Leg, Part, T, Exception]]:
    """Call ``run`` on every item, from ``jobs`` threads; the items whose run raised, with the
    exception (printed, and the lanes go on). Ctrl-C stops the pytest runs and re-raises."""
    queue = PartQueue(items)
    errors: list[tuple[Leg, Part, T, Exception]] = []

    def lane() -> None:
        while (item := queue.take()) is not None:
            try:
                run(*item)
            except Exception as exc:
                traceback.print_exc()
                errors.append((*item, exc))
            finally:
                queue.done(item[0], item[1])

    lanes = [threading.Thread(target=lane, name=f"lane-{n}", daemon=True) for n in range(jobs)]
    for thread in lanes:
        thread.start()
    try:
        for thread in lanes:
            while thread.is_alive():
                thread.join(timeout=1)
    except KeyboardInterrupt:
        queue.clear()
        process.stop_all()
        raise
    return errors
