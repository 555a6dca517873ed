"""Settings of tests/db/test_routers.py's subprocesses: this app's tables in a database of their
own ("scheduler", DATABASE_URL), everything else in "default" (DSCH_OTHER_URL), as a router
decides; neither holds the other's tables, so a query sent to the wrong one fails."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import database

APP = "durable_scheduler"
DATABASES = {
    "default": database(os.environ["DSCH_OTHER_URL"]),
    "scheduler": database(os.environ["DATABASE_URL"]),
}
DATABASE_ROUTERS = ["tests.procs.routed_settings.SchedulerRouter"]


class SchedulerRouter:
    def db_for_read(self, model, **hints):
        return "scheduler" if model._meta.app_label == APP else None

    db_for_write = db_for_read

    def allow_migrate(self, db, app_label, **hints):
        return db == ("scheduler" if app_label == APP else "default")
