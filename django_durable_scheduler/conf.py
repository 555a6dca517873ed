"""Typed, lazy settings: read from ``django.conf.settings`` on every access.

Reading on access (never at import) keeps ``override_settings`` working in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings as django_settings
from django.utils.module_loading import import_string

_DEFAULTS: dict[str, Any] = {
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
}


class Settings:
    """``DURABLE_SCHEDULER_<NAME>`` settings with typed defaults."""

    def _get(self, name: str) -> Any:
        return getattr(django_settings, f"DURABLE_SCHEDULER_{name}", _DEFAULTS[name])

    @property
    def HANDLER_MODULE(self) -> str:  # noqa: N802
        return str(self._get("HANDLER_MODULE"))

    @property
    def CLOCK(self) -> Callable[[], datetime] | None:  # noqa: N802
        clock = self._get("CLOCK")
        if isinstance(clock, str):
            clock = import_string(clock)
        return clock  # type: ignore[no-any-return]

    @property
    def DEFAULT_LEASE(self) -> float:  # noqa: N802
        return float(self._get("DEFAULT_LEASE"))

    @property
    def RETRY_BASE_DELAY(self) -> float:  # noqa: N802
        return float(self._get("RETRY_BASE_DELAY"))

    @property
    def RETRY_MAX_DELAY(self) -> float:  # noqa: N802
        return float(self._get("RETRY_MAX_DELAY"))

    @property
    def RETRY_JITTER(self) -> float:  # noqa: N802
        return float(self._get("RETRY_JITTER"))

    @property
    def MAX_CLAIM_BATCH(self) -> int:  # noqa: N802
        return int(self._get("MAX_CLAIM_BATCH"))

    @property
    def DEFAULT_PRINCIPAL(self) -> Any:  # noqa: N802
        return self._get("DEFAULT_PRINCIPAL")


settings = Settings()


def now() -> datetime:
    """The scheduler's clock: aware UTC, truncated to milliseconds."""
    clock = settings.CLOCK
    value = clock() if clock is not None else datetime.now(UTC)
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)
