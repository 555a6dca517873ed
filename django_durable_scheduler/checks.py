"""System checks with stable ids (``durable_scheduler.E001`` ...), each with a hint."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import connections


@register(Tags.database)
def check_sqlite_transaction_mode(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or []:
        conn = connections[alias]
        if conn.vendor != "sqlite":
            continue
        mode = str(conn.settings_dict.get("OPTIONS", {}).get("transaction_mode", "")).upper()
        if mode != "IMMEDIATE":
            messages.append(
                CheckWarning(
                    f"SQLite database '{alias}' does not use transaction_mode IMMEDIATE.",
                    hint=(
                        f"Set DATABASES['{alias}']['OPTIONS']['transaction_mode'] = 'IMMEDIATE' so that "
                        "transactions enqueueing work inside your own atomic() blocks take the write "
                        "lock up front instead of failing with 'database is locked'."
                    ),
                    id="durable_scheduler.W001",
                )
            )
    return messages
