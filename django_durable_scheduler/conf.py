"""Typed, lazy settings: read from ``django.conf.settings`` on every access.

Reading on access (never at import) keeps ``override_settings`` working in tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings as django_settings
from django.utils.module_loading import import_string

from .identity import MAX_RETRY_BASE_DELAY_MS, MAX_RETRY_MAX_DELAY_MS, MAX_TIMEOUT_MS

logger = logging.getLogger("django_durable_scheduler")

DEFAULTS: dict[str, Any] = {
    # Module name autodiscovered in every installed app for @handler registrations.
    "HANDLER_MODULE": "tasks",
    # A callable (or dotted path to one) returning an aware datetime: tests set a clock here.
    "CLOCK": None,
    # Lease given to a claimed occurrence when the caller does not say, in seconds.
    "DEFAULT_LEASE": 30,
    # Retry backoff when a handler gives no retry time: base * 2**(attempt-1), capped, with jitter.
    "RETRY_BASE_DELAY": 10,
    "RETRY_MAX_DELAY": 3600,
    "RETRY_JITTER": 0.2,
    # Largest batch one claim may take.
    "MAX_CLAIM_BATCH": 500,
    # Who a job created without an authority envelope runs as (see policies.grant_default).
    "DEFAULT_PRINCIPAL": {"type": "app", "id": "durable_scheduler"},
    # "host" or "database": whose clock says what time it is (see DatabaseClock).
    "TIME_SOURCE": "host",
    # Workers listen for wake-ups (PostgreSQL LISTEN, SQLite's sockets); False: poll only, as
    # behind a transaction-mode pooler such as PgBouncer, which does not deliver LISTEN.
    "LISTEN": True,
    # How long a run may take when neither its job nor its handler says (seconds or a
    # timedelta; None: no timeout). Checked by durable_scheduler.E003.
    "HANDLER_TIMEOUT": None,
}

# What the settings may be (system check E003 holds them to it). Where run-time code takes the
# same value it checks the same bound: a claim's lease, a job's retry delays and run timeout.
MAX_LEASE_MS = 24 * 60 * 60 * 1000  # DEFAULT_LEASE, and any lease a claim asks for
MAX_DEFAULT_LEASE = MAX_LEASE_MS // 1000
MAX_RETRY_BASE_DELAY = MAX_RETRY_BASE_DELAY_MS // 1000
MAX_RETRY_MAX_DELAY = MAX_RETRY_MAX_DELAY_MS // 1000
MAX_HANDLER_TIMEOUT = MAX_TIMEOUT_MS // 1000
RETRY_JITTER_BELOW = 1  # a share of the delay, less than all of it
MIN_CLAIM_BATCH = 1
TIME_SOURCES = ("host", "database")


class Settings:
    """``DURABLE_SCHEDULER_<NAME>`` settings with typed defaults."""

    def raw(self, name: str) -> Any:
        """The setting as the project gives it (or its default), unconverted: what the
        system checks judge."""
        return getattr(django_settings, f"DURABLE_SCHEDULER_{name}", DEFAULTS[name])

    @property
    def HANDLER_MODULE(self) -> str:  # noqa: N802
        return str(self.raw("HANDLER_MODULE"))

    @property
    def CLOCK(self) -> Callable[[], datetime] | None:  # noqa: N802
        clock = self.raw("CLOCK")
        if isinstance(clock, str):
            clock = import_string(clock)
        return clock  # type: ignore[no-any-return]

    @property
    def DEFAULT_LEASE(self) -> float:  # noqa: N802
        return float(self.raw("DEFAULT_LEASE"))

    @property
    def RETRY_BASE_DELAY(self) -> float:  # noqa: N802
        return float(self.raw("RETRY_BASE_DELAY"))

    @property
    def RETRY_MAX_DELAY(self) -> float:  # noqa: N802
        return float(self.raw("RETRY_MAX_DELAY"))

    @property
    def RETRY_JITTER(self) -> float:  # noqa: N802
        return float(self.raw("RETRY_JITTER"))

    @property
    def MAX_CLAIM_BATCH(self) -> int:  # noqa: N802
        return int(self.raw("MAX_CLAIM_BATCH"))

    @property
    def DEFAULT_PRINCIPAL(self) -> Any:  # noqa: N802
        return self.raw("DEFAULT_PRINCIPAL")

    @property
    def TIME_SOURCE(self) -> str:  # noqa: N802
        return str(self.raw("TIME_SOURCE"))

    @property
    def LISTEN(self) -> bool:  # noqa: N802
        return bool(self.raw("LISTEN"))

    @property
    def HANDLER_TIMEOUT(self) -> float | None:  # noqa: N802
        """Seconds, or None; a timedelta setting is converted."""
        value = self.raw("HANDLER_TIMEOUT")
        if value is None:
            return None
        return value.total_seconds() if isinstance(value, timedelta) else float(value)


settings = Settings()


class DatabaseClock:
    """The database server's clock, read through this host's: the offset between the two is
    measured with one query every ``REFRESH`` seconds (half the round trip is the error),
    so many hosts whose clocks disagree agree on the time at the cost of one ``SELECT`` per
    process per half minute, not one per statement. Until a measurement succeeds, or when
    the database does not answer, the last offset (at first none) is used."""

    REFRESH = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offset = timedelta(0)
        self._measured_at: float | None = None

    def offset(self, host: Callable[[], datetime]) -> timedelta:
        with self._lock:
            due = self._measured_at is None or time.monotonic() - self._measured_at >= self.REFRESH
            if due:
                self._measure(host)
            return self._offset

    def _measure(self, host: Callable[[], datetime]) -> None:
        from django.db import DatabaseError

        from .dialect import alias_for, server_now

        self._measured_at = time.monotonic()
        try:
            before = host()
            server = server_now(alias_for(None))
            after = host()
        except DatabaseError as exc:
            logger.warning("could not read the database's clock (%s); using the last offset", exc)
            return
        if server is not None:
            self._offset = server - (before + (after - before) / 2)

    def reset(self) -> None:
        with self._lock:
            self._offset, self._measured_at = timedelta(0), None


database_clock = DatabaseClock()


def _host_now() -> datetime:
    clock = settings.CLOCK
    return clock() if clock is not None else datetime.now(UTC)


def now() -> datetime:
    """The scheduler's clock: aware UTC, truncated to milliseconds. With
    ``DURABLE_SCHEDULER_TIME_SOURCE = "database"``, this host's clock corrected to the
    database server's (:class:`DatabaseClock`)."""
    value = _host_now()
    if settings.TIME_SOURCE == "database":
        value += database_clock.offset(_host_now)
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)
