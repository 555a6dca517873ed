"""Throttles: how fast work may start, per key, as a token bucket kept as one instant (the
generic cell rate algorithm), and the arithmetic of admitting and placing work by it
(docs/design.md, "Throttles"). Pure: the kernel locks the bucket rows and writes what these
functions decide.

A throttle ``{"limit": L, "period": P, "burst": B, "key": K}`` lets one start through every
``P / L`` (the interval) and up to ``B`` more at once after a quiet spell, so in any window of
``P`` at most ``L + B`` start. All times are whole microseconds of the database clock
(``conf.now()``); the interval is rounded up to one, so rounding never lets more start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..exceptions import InvalidArgument
from .validation import MAX_KEY_LENGTH, normalize_int, normalize_template, to_duration_ms

MAX_LIMIT = 1_000_000
MAX_BURST = 1_000_000
MAX_PERIOD_MS = 31 * 24 * 3600 * 1000  # a budget window's longest
_KEYS = frozenset({"limit", "period", "burst", "key"})


@dataclass(frozen=True)
class Throttle:
    """One checked throttle: ``limit`` starts per ``period_ms``, ``burst`` more at once, per
    ``key`` (a template on the payload; None: one bucket for all its work)."""

    limit: int
    period_ms: int
    burst: int = 0
    key: str | None = None

    @property
    def interval(self) -> timedelta:
        """The time one start takes from the bucket, rounded up to a microsecond."""
        return timedelta(microseconds=math.ceil(self.period_ms * 1000 / self.limit))

    @property
    def tolerance(self) -> timedelta:
        """How far ahead of now the bucket may run: ``burst`` intervals."""
        return self.interval * self.burst

    def stored(self) -> dict[str, Any]:
        """As a job or policy row stores it (JSON)."""
        return {"limit": self.limit, "period_ms": self.period_ms, "burst": self.burst, "key": self.key}

    @classmethod
    def from_stored(cls, value: Mapping[str, Any]) -> Throttle:
        return cls(
            int(value["limit"]), int(value["period_ms"]), int(value.get("burst") or 0), value.get("key")
        )


def normalize_throttle(value: Any, field: str = "throttle", *, keyed: bool = True) -> Throttle | None:
    """``value`` checked: None, or a dict with ``limit`` (1..1,000,000 starts), ``period``
    (seconds or a timedelta, 1 ms .. 31 days), ``burst`` (0..1,000,000, default 0) and, where
    ``keyed``, ``key`` (a template naming payload fields). A stored throttle (``period_ms``)
    is taken back as it is. Bad input names the field (``throttle.limit``)."""
    if value is None:
        return None
    if isinstance(value, Throttle):
        value = value.stored()
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            field, f"must be a dict with limit and period, or None, not {type(value).__name__}"
        )
    value = dict(value)
    if "period_ms" in value and "period" not in value:  # as stored: read back, edited, saved
        period_ms = value.pop("period_ms")
        value["period"] = timedelta(
            milliseconds=normalize_int(period_ms, f"{field}.period_ms", minimum=1, maximum=MAX_PERIOD_MS)
        )
    unknown = sorted(str(name) for name in value if name not in _KEYS)
    if unknown:
        raise InvalidArgument(
            f"{field}.{unknown[0]}", "is not a throttle setting (limit, period, burst, key)"
        )
    if not keyed and value.get("key") is not None:
        raise InvalidArgument(f"{field}.key", "a principal's throttle counts all its runs: it takes no key")
    for name in ("limit", "period"):
        if value.get(name) is None:
            raise InvalidArgument(f"{field}.{name}", "is required")
    return Throttle(
        limit=normalize_int(value["limit"], f"{field}.limit", minimum=1, maximum=MAX_LIMIT),
        period_ms=to_duration_ms(value["period"], f"{field}.period", minimum_ms=1, maximum_ms=MAX_PERIOD_MS),
        burst=normalize_int(_or_zero(value.get("burst")), f"{field}.burst", minimum=0, maximum=MAX_BURST),
        key=normalize_template(value.get("key"), f"{field}.key"),
    )


def _or_zero(burst: Any) -> Any:
    """An omitted burst (absent or None) is none; any other value is checked as given."""
    return 0 if burst is None else burst


def stored_throttle(value: Any, field: str = "throttle", *, keyed: bool = True) -> dict[str, Any] | None:
    """:func:`normalize_throttle` as the JSON a row stores."""
    throttle = normalize_throttle(value, field, keyed=keyed)
    return None if throttle is None else throttle.stored()


def render_key(template: str | None, payload: Any, field: str = "throttle.key") -> str | None:
    """The throttle key of an occurrence with ``payload``: ``template`` filled from the
    payload's top-level fields; a field it lacks is bad input (refused at enqueue)."""
    if template is None:
        return None
    if not isinstance(payload, dict):
        raise InvalidArgument(field, f"{template!r} needs a payload object with its fields")
    try:
        key = template.format_map(payload)
    except KeyError as exc:
        raise InvalidArgument(field, f"the payload has no field {exc.args[0]!r} for {template!r}") from None
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise InvalidArgument(field, f"cannot be computed from the payload ({exc!r})") from None
    if not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise InvalidArgument(field, f"must compute 1..{MAX_KEY_LENGTH} characters, without NUL")
    return key


# ---------------------------------------------------------------- the bucket


def fresh(now: datetime) -> tuple[datetime, datetime]:
    """A new bucket's (tat, horizon): full, nobody waiting."""
    return now, now


def settled(tat: datetime, now: datetime, throttle: Throttle) -> datetime:
    """``tat`` as it may be at ``now``: a bucket never runs further ahead than just emptied
    (``now + tolerance + interval``). Further means the clock went back: it is taken as just
    emptied now, the strictest state a bucket can be in, so a jump never lets more start."""
    ceiling = now + throttle.tolerance + throttle.interval
    return min(tat, ceiling)


def next_free(tat: datetime, throttle: Throttle) -> datetime:
    """The first instant the bucket lets a start through."""
    return tat - throttle.tolerance


def allows(tat: datetime, now: datetime, throttle: Throttle) -> bool:
    """Whether a start at ``now`` fits the bucket."""
    return now >= next_free(tat, throttle)


def take(tat: datetime, now: datetime, throttle: Throttle) -> datetime:
    """The bucket after a start at ``now`` (which :func:`allows`)."""
    return max(now, tat) + throttle.interval


def place(horizon: datetime, now: datetime, throttle: Throttle) -> datetime:
    """The earliest start this bucket gives work that waits behind ``horizon`` (the places
    handed out so far): its own interval after the last one, never before now; rounded up to
    the millisecond, as every time the scheduler writes (later, never sooner)."""
    return ceil_ms(max(now, next_free(horizon, throttle)))


def ceil_ms(moment: datetime) -> datetime:
    """``moment`` rounded up to a whole millisecond."""
    extra = moment.microsecond % 1000
    return moment if not extra else moment + timedelta(microseconds=1000 - extra)


def placed(horizon: datetime, slot: datetime, throttle: Throttle) -> datetime:
    """The horizon once a waiting occurrence was given the start ``slot`` (>= what
    :func:`place` said)."""
    return max(slot, horizon) + throttle.interval
