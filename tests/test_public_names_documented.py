"""Every public name (``django_durable_scheduler.__all__``) is described in the README or in
``docs/*.md``: a name a reader cannot look up is not an API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import django_durable_scheduler as scheduler

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="no repository tree beside these tests")


def test_every_public_name_appears_in_the_docs():
    text = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    missing = [name for name in scheduler.__all__ if not re.search(rf"\b{re.escape(name)}\b", text)]
    assert not missing, f"document these public names in README.md or docs/: {missing}"
