"""Typed, lazy settings: read from ``django.conf.settings`` on first use, then kept.

Reading on use (never at import) and forgetting on Django's ``setting_changed`` signal keeps
``override_settings`` (and pytest-django's ``settings``) working; kept, because the clock and
the claim read them on every operation, and a setting the project leaves out is an
``AttributeError`` raised and caught inside Django each time it is read.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .rules.validation import MAX_RETRY_BASE_DELAY_MS, MAX_RETRY_MAX_DELAY_MS, MAX_TIMEOUT_MS

logger = logging.getLogger("django_durable_scheduler")

DEFAULTS: dict[str, Any] = {
    # Module name autodiscovered in every installed app for @handler registrations.
    "HANDLER_MODULE": "tasks",
    # Import those modules when Django starts (every process, not only runscheduler's), so
    # that an enqueue anywhere computes its handler's concurrency key (apps.py).
    "AUTODISCOVER": True,
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
    # What runscheduler deletes, and how (see housekeeping/retention/; None: workers delete
    # nothing). Ages are seconds or timedeltas, None keeps forever. A partial dict is completed
    # from this one.
    "RETENTION": {
        "succeeded": timedelta(days=7),
        "cancelled": timedelta(days=7),
        # Dead letters are what someone still has to look at: kept longer.
        "dead_letter": timedelta(days=30),
        # Events of no occurrence (job created/updated, skipped slots).
        "job_events": timedelta(days=30),
        # Occurrences enqueued under a trigger key the caller chose (None: their rows stay,
        # so that enqueueing the key again still finds them; see docs/design.md).
        "caller_keys": None,
        # One run per this many seconds across all workers, each batch its own transaction,
        # a pause between batches, and the lease a killed runner's successor waits out.
        "period": 300,
        "batch_size": 500,
        "pause": 0.05,
        "lease": 120,
    },
    # Where retention writes what it deletes before deleting it (archive.py; None: nowhere):
    # {"storage": <a name in STORAGES>, "prefix": <folder in that storage>}.
    "ARCHIVE": None,
}

# What the settings may be (system check E003 holds them to it). Where run-time code takes the
# same value it checks the same bound: a claim's lease, a job's retry delays and run timeout.
MAX_LEASE_MS = 24 * 60 * 60 * 1000  # DEFAULT_LEASE, and any lease a claim asks for
MAX_DEFAULT_LEASE = MAX_LEASE_MS // 1000
# A job's backoff bounds and the longest timeout a handler, a job or the default setting may
# give (31 days): the settings below and the validation of every job share them.
MAX_RETRY_BASE_DELAY = MAX_RETRY_BASE_DELAY_MS // 1000
MAX_RETRY_MAX_DELAY = MAX_RETRY_MAX_DELAY_MS // 1000
MAX_HANDLER_TIMEOUT = MAX_TIMEOUT_MS // 1000
RETRY_JITTER_BELOW = 1  # a share of the delay, less than all of it
MIN_CLAIM_BATCH = 1
TIME_SOURCES = ("host", "database")
MAX_AGE = timedelta(days=36_500)
RETENTION_AGES = ("succeeded", "cancelled", "dead_letter", "job_events", "caller_keys")
# (key, lowest, highest) of RETENTION's numeric knobs: seconds, or rows for batch_size.
RETENTION_LIMITS = (("period", 1, 86_400), ("batch_size", 1, 10_000), ("pause", 0, 60), ("lease", 1, 3_600))
ARCHIVE_KEYS = ("storage", "prefix")


@dataclass(frozen=True)
class Retention:
    """``DURABLE_SCHEDULER_RETENTION``, checked and completed from the defaults."""

    ages: dict[str, timedelta | None]  # by terminal status, and job_events / caller_keys
    period: float
    batch_size: int
    pause: float
    lease: float


def _age(value: Any, key: str) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        age = value
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        age = timedelta(seconds=value)
    else:
        raise ValueError(f"[{key!r}] must be None, seconds or a timedelta, not {value!r}")
    if not timedelta(0) < age <= MAX_AGE:
        raise ValueError(f"[{key!r}] must be more than 0 and at most {MAX_AGE.days} days, not {value!r}")
    return age


def parse_retention(raw: Any) -> Retention | None:
    """The retention setting as workers apply it; ``ValueError`` naming the key when wrong."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"must be None or a dict, not {raw!r}")
    unknown = sorted(set(raw) - set(DEFAULTS["RETENTION"]), key=str)
    if unknown:
        raise ValueError(f"has unknown keys {unknown} (known: {', '.join(DEFAULTS['RETENTION'])})")
    merged = {**DEFAULTS["RETENTION"], **raw}
    ages = {key: _age(merged[key], key) for key in RETENTION_AGES}
    numbers: dict[str, float] = {}
    for key, low, high in RETENTION_LIMITS:
        value = merged[key]
        whole = key != "batch_size" or isinstance(value, int)
        if not (
            isinstance(value, int | float) and not isinstance(value, bool) and whole and low <= value <= high
        ):
            kind = "a whole number" if key == "batch_size" else "seconds"
            raise ValueError(f"[{key!r}] must be {kind} in [{low}, {high}], not {value!r}")
        numbers[key] = value
    return Retention(
        ages,
        float(numbers["period"]),
        int(numbers["batch_size"]),
        float(numbers["pause"]),
        float(numbers["lease"]),
    )


def parse_archive(raw: Any) -> dict[str, str] | None:
    """The archive setting: ``{"storage": ..., "prefix": ...}`` or None; ``ValueError`` when wrong."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - set(ARCHIVE_KEYS) or "storage" not in raw:
        raise ValueError(f"must be None or a dict with 'storage' and optionally 'prefix', not {raw!r}")
    storage, prefix = raw["storage"], raw.get("prefix", "durable_scheduler/archive")
    if not isinstance(storage, str) or storage not in getattr(django_settings, "STORAGES", {}):
        raise ValueError(f"['storage'] must name an entry of STORAGES, not {storage!r}")
    if not isinstance(prefix, str) or ".." in prefix.split("/"):
        raise ValueError(f"['prefix'] must be a folder name in that storage, not {prefix!r}")
    return {"storage": storage, "prefix": prefix.strip("/")}


PREFIX = "DURABLE_SCHEDULER_"
_UNREAD: Any = object()


class Settings:
    """``DURABLE_SCHEDULER_<NAME>`` settings with typed defaults."""

    def __init__(self) -> None:
        self._known: dict[str, Any] = {}
        self._clock: Any = _UNREAD  # CLOCK imported, once read

    def raw(self, name: str) -> Any:
        """The setting as the project gives it (or its default), unconverted: what the
        system checks judge."""
        try:
            return self._known[name]
        except KeyError:
            value = self._known[name] = getattr(django_settings, PREFIX + name, DEFAULTS[name])
            return value

    def forget(self) -> None:
        """Read every setting again on its next use (a setting changed)."""
        self._known.clear()
        self._clock = _UNREAD

    @property
    def HANDLER_MODULE(self) -> str:  # noqa: N802
        return str(self.raw("HANDLER_MODULE"))

    @property
    def AUTODISCOVER(self) -> bool:  # noqa: N802
        return self.raw("AUTODISCOVER") is True

    @property
    def CLOCK(self) -> Callable[[], datetime] | None:  # noqa: N802
        if self._clock is _UNREAD:
            clock = self.raw("CLOCK")
            self._clock = import_string(clock) if isinstance(clock, str) else clock
        return self._clock  # type: ignore[no-any-return]

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

    @property
    def RETENTION(self) -> Retention | None:  # noqa: N802
        """What workers delete (None: nothing); checked by durable_scheduler.E003."""
        try:
            return parse_retention(self.raw("RETENTION"))
        except ValueError as exc:
            raise ValueError(f"DURABLE_SCHEDULER_RETENTION {exc}") from None

    @property
    def ARCHIVE(self) -> dict[str, str] | None:  # noqa: N802
        try:
            return parse_archive(self.raw("ARCHIVE"))
        except ValueError as exc:
            raise ValueError(f"DURABLE_SCHEDULER_ARCHIVE {exc}") from None


settings = Settings()


def _changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith(PREFIX):
        settings.forget()


setting_changed.connect(_changed, dispatch_uid="django_durable_scheduler.conf")


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

        from .db.dialect import alias_for, server_now

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
