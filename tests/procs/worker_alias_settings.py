"""Settings of tests/db/test_worker_alias.py's subprocesses: the workers' own alias
("scheduler") to the same database as "default", with the OPTIONS docs/scaling.md gives for
letting psycopg prepare their statements; "default", what web processes use, left as it is."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import database

_default = database(os.environ["DATABASE_URL"])
DATABASES = {
    "default": _default,
    "scheduler": {
        **_default,
        "OPTIONS": {**_default.get("OPTIONS", {}), "server_side_binding": True, "prepare_threshold": 5},
    },
}
