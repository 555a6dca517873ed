"""Settings of the soak (bench/soak.py): this package and the soak's handlers only, so that the
soak runs in the test environment as well as in .venv-bench. DATABASE_URL picks the database;
every connection is named by DSCH_SOAK_APP (the worker's id), so that the soak counts each
worker's connections in ``pg_stat_activity``; DSCH_SOAK_CLOCK names the file of the movable clock
(bench/soakapp/clock.py)."""

from __future__ import annotations

import os

from bench.settings import _database

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": _database(os.environ["DATABASE_URL"])}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    options = DATABASES["default"].setdefault("OPTIONS", {})
    options["application_name"] = os.environ.get("DSCH_SOAK_APP", "soak-driver")  # type: ignore[index]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_durable_scheduler",
    "bench.soakapp",
]

DURABLE_SCHEDULER_CLOCK = "bench.soakapp.clock.now"
# Retention (and with it the workers' budget recount) every minute rather than every five, so
# that a short soak sees it run; its ages are days, so it deletes nothing of the soak's.
DURABLE_SCHEDULER_RETENTION = {"period": 60}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
