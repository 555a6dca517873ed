"""Settings of the harness adapter: a user's project at this package's defaults.

``DATABASE_URL`` (``postgres://user:pass@host:port/name``) is the database the harness made for
the system. ``BENCH_PREPARED=1`` adds the workers' own alias that docs/scaling.md
("Prepared statements") documents, and the adapter then runs ``runscheduler --database scheduler``.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_durable_scheduler",
    "bench.pgqueue",
]

_url = urlsplit(os.environ["DATABASE_URL"])
DATABASES: dict[str, dict[str, object]] = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}
if os.environ.get("BENCH_PREPARED") == "1":
    DATABASES["scheduler"] = {
        **DATABASES["default"],
        "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5},
    }
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # stdout is the harness's telemetry channel: every log line goes to stderr.
    "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}
