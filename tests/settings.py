"""Test settings: the database comes from DATABASE_URL (SQLite file by default)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_durable_scheduler",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# A file, not :memory:, so that subprocess workers in the tests share the test database.
_default_sqlite = f"sqlite:///{BASE_DIR / '.test-db.sqlite3'}"


def database(url: str) -> dict[str, Any]:
    """A DATABASES entry for ``url``, with the options the README asks for on its backend."""
    db: dict[str, Any] = env.db_url_config(url)
    if db["ENGINE"] == "django.db.backends.sqlite3":
        # One writer at a time: take the write lock at BEGIN so no transaction ever has to
        # upgrade a read lock (which SQLite refuses instead of waiting); WAL lets readers go on.
        db.setdefault("OPTIONS", {}).update(
            {"transaction_mode": "IMMEDIATE", "timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"}
        )
        # One file per test run (pid), so parallel runs on one machine never share it.
        db["TEST"] = {"NAME": str(BASE_DIR / f".test-db-{os.getpid()}.sqlite3")}
    elif db["ENGINE"] == "django.db.backends.postgresql" and os.environ.get("DSCH_PG_PREPARED"):
        # What the README suggests for PostgreSQL without a transaction-mode pooler: parameters
        # bound by the server and statements prepared after a few runs.
        db.setdefault("OPTIONS", {}).update({"server_side_binding": True, "prepare_threshold": 5})
    elif db["ENGINE"] == "django.db.backends.mysql":
        db.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
        db["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_bin"}
    return db


# An empty DATABASE_URL counts as unset.
DATABASES = {"default": database(os.environ.get("DATABASE_URL") or _default_sqlite)}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Test users' passwords need no strength: the default hasher (PBKDF2, over a million
# iterations) took about half a second of every admin test's setup.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Subprocesses of the race tests share a dilated clock (tests/procs/clock.py).
if os.environ.get("DSCH_CLOCK_T0"):
    DURABLE_SCHEDULER_CLOCK = "tests.procs.clock.dilated"
DURABLE_SCHEDULER_TIME_SOURCE = os.environ.get("DSCH_TIME_SOURCE", "host")
DURABLE_SCHEDULER_LISTEN = os.environ.get("DSCH_LISTEN", "1") == "1"
# Every UPDATE of the occurrence table held to the lifecycle table (tests/writecheck.py): off
# only where Python calls are counted (tests/kernel/test_plain_budget.py).
CHECK_OCCURRENCE_WRITES = os.environ.get("DSCH_CHECK_WRITES", "1") != "0"
# A subprocess of tests/test_autodiscover.py starts without importing the handler modules.
DURABLE_SCHEDULER_AUTODISCOVER = os.environ.get("DSCH_AUTODISCOVER", "1") == "1"
# Subprocess workers of the retention tests get their retention (JSON) from the environment.
if os.environ.get("DSCH_RETENTION"):
    DURABLE_SCHEDULER_RETENTION = json.loads(os.environ["DSCH_RETENTION"])
if os.environ.get("DSCH_POOLER"):
    # What Django asks for behind a transaction-mode pooler: no server-side cursors.
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
STATIC_URL = "/static/"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_durable_scheduler": {"handlers": ["console"], "level": "WARNING"}},
}

# The django.tasks backend, where a task framework is installed (Django 6, or the django-tasks
# backport that the dev dependency group brings to Django 5.2); tests/tasks/test_tasks_backend.py
# skips without one.
if importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks"):
    TASKS = {
        "default": {
            "BACKEND": "django_durable_scheduler.tasks.DurableBackend",
            "QUEUES": ["default", "high"],
        }
    }
    if os.environ.get("DSCH_ANY_QUEUE"):
        # Subprocess workers of tests/tasks/test_any_queue.py: a backend that takes any queue name.
        TASKS["default"]["QUEUES"] = []
