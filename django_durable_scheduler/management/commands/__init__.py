"""The app's management commands, and the option they share."""

from __future__ import annotations

import argparse

from django.db import connections


def database_alias(text: str) -> str:
    """``--database``: an alias of ``DATABASES`` (without the option, the database the
    project's routers give this app's models)."""
    if text not in connections:
        known = ", ".join(sorted(connections.settings))
        raise argparse.ArgumentTypeError(f"{text!r} is not in DATABASES (it has: {known})")
    return text


DATABASE_HELP = "database alias (default: where the project's routers put this app's tables)"
