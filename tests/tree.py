"""The mark of the tests that read the repository's own files and touch no database.

They run once, on the SQLite legs of Django 5.2: a PostgreSQL or MariaDB leg would repeat them
unchanged, and the Django 6 legs run a copy of ``tests/`` beside the installed wheel, where
there is no tree to read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent

reads_the_tree = pytest.mark.skipif(
    not (ROOT / "django_durable_scheduler").is_dir()
    or "sqlite" not in settings.DATABASES["default"]["ENGINE"],
    reason="reads the repository's tree, no database: the SQLite leg beside the source runs it",
)
