"""A clock a test freezes and moves: the scheduler's own clock setting,
``DURABLE_SCHEDULER_CLOCK``, pointed at a :class:`Clock` for the length of a ``with`` block.

Everything the scheduler decides by the time reads that setting: which schedule slots are
due, when a retry's backoff ends, when a lease expires, which budget window a run counts
in. Django's ``timezone.now()`` is left alone: it is the project's clock, not the
scheduler's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.test.utils import override_settings

from ..exceptions import InvalidArgument

UNITS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds")


def aware(value: Any, field: str) -> datetime:
    """``value`` as an aware UTC datetime, or ``InvalidArgument`` naming ``field``."""
    if not isinstance(value, datetime):
        raise InvalidArgument(field, f"must be an aware datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, "must be an aware datetime (with a time zone), not a naive one")
    return value.astimezone(UTC)


def duration(delta: Any, units: dict[str, Any]) -> timedelta:
    """The step of :meth:`Clock.advance`: ``delta`` (a timedelta or seconds) plus ``units``
    (``hours=1``...), never negative: a scheduler's time only moves forward."""
    total = timedelta(0)
    if delta is not None:
        if isinstance(delta, timedelta):
            total = delta
        elif isinstance(delta, int | float) and not isinstance(delta, bool) and math.isfinite(delta):
            total = timedelta(seconds=delta)
        else:
            raise InvalidArgument("delta", "must be a timedelta or a number of seconds")
    for name, value in units.items():
        if name not in UNITS:
            raise InvalidArgument(name, f"is not a unit of time (use {', '.join(UNITS)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidArgument(name, "must be a number")
        if value < 0:
            raise InvalidArgument(name, "must not be negative: the clock only moves forward (use set())")
        total += timedelta(**{name: value})
    if total < timedelta(0):
        raise InvalidArgument("delta", "must not be negative: the clock only moves forward (use set())")
    return total


class Clock:
    """The scheduler's time while a test holds it: frozen at :attr:`now` until
    :meth:`advance` or :meth:`set` moves it. Called, it returns :attr:`now` (what the
    ``DURABLE_SCHEDULER_CLOCK`` setting expects)."""

    def __init__(self, at: datetime) -> None:
        self._now = aware(at, "at")

    def __call__(self) -> datetime:
        return self._now

    def __repr__(self) -> str:
        return f"<testing.Clock at {self._now.isoformat()}>"

    @property
    def now(self) -> datetime:
        """The frozen time (aware, UTC)."""
        return self._now

    def advance(self, delta: timedelta | float | None = None, **units: float) -> datetime:
        """Move the clock forward by ``delta`` (a timedelta or seconds) and/or ``weeks=``,
        ``days=``, ``hours=``, ``minutes=``, ``seconds=``, ``milliseconds=``; returns the
        new time. Schedule slots, retries and leases that come due run at the next drain."""
        self._now += duration(delta, units)
        return self._now

    def set(self, at: datetime) -> datetime:
        """Put the clock at ``at`` (an aware datetime), forward or back; returns it."""
        self._now = aware(at, "at")
        return self._now


def _truncated_now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond - now.microsecond % 1000)


@contextmanager
def clock(at: datetime | None = None) -> Iterator[Clock]:
    """Freeze the scheduler's clock at ``at`` (an aware datetime; default: the real time
    now) for the ``with`` block, and yield the :class:`Clock` that moves it::

        with testing.clock(datetime(2026, 3, 29, 0, 30, tzinfo=UTC)) as clock:
            clock.advance(hours=1)
    """
    frozen = Clock(_truncated_now() if at is None else at)
    # The host's time source: the database's would add the server's offset to a frozen clock.
    with override_settings(DURABLE_SCHEDULER_CLOCK=frozen, DURABLE_SCHEDULER_TIME_SOURCE="host"):
        yield frozen
