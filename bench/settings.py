"""Benchmark settings: one Django project holding this package and every peer.

DATABASE_URL picks the database (``postgres://user@host:port/name`` or ``sqlite:////abs/path``).
The peers' knobs that the workloads vary come from environment variables set by bench/suite.py:
BENCH_Q_WORKERS, BENCH_Q_POLL (django-q2). Procrastinate is installed on PostgreSQL only.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _database(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": unquote(parts.path),
            # What the package's README asks for on SQLite, and WAL so readers never block.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL;",
            },
        }
    if parts.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            # BENCH_PG_PREPARED=1: what the package's README suggests without a transaction-mode
            # pooler (parameters bound by the server, statements prepared after a few runs).
            **(
                {"OPTIONS": {"server_side_binding": True, "prepare_threshold": 5}}
                if os.environ.get("BENCH_PG_PREPARED")
                else {}
            ),
        }
    raise ValueError(f"unsupported DATABASE_URL scheme {parts.scheme!r}")


DATABASES = {"default": _database(os.environ.get("DATABASE_URL", "sqlite:////tmp/dschbench.sqlite3"))}
POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_durable_scheduler",
    "django_tasks",
    "django_tasks_db",
    "django_q",
    *(["procrastinate.contrib.django"] if POSTGRES else []),
    "bench.benchapp",
]

# "default": django-tasks-db (the peer); "durable": this package's backend, whose tasks run as a
# principal of their own that bench/systems.py grants the queue's kind with a budget that never binds.
TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]},
    "durable": {
        "BACKEND": "django_durable_scheduler.tasks.DurableBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"principal": {"type": "user", "id": "bench-tasks"}},
    },
}

# django-q2 with its ORM broker (the database is the queue). save_limit 0 keeps every result,
# which is how a drain is seen to be finished; everything else is django-q2's default.
Q_CLUSTER = {
    "name": "bench",
    "orm": "default",
    "workers": int(os.environ.get("BENCH_Q_WORKERS", "1")),
    "poll": float(os.environ.get("BENCH_Q_POLL", "0.2")),
    "save_limit": 0,
    "timeout": 60,
    "retry": 120,
    "max_attempts": 1,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
