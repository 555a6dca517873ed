"""The documentation site builds without a warning, and documents the whole public API.

``sphinx-build -W`` (docs/conf.py, docs/site.md) turns every warning into an error: a link to
a page or heading that does not exist, a docstring that is not valid reStructuredText, a
reference to nothing. The build is the command docs/site.md gives, ``python3 docs/build.py``, run
in a fresh virtual environment that it makes itself, as on a fresh clone.

No database: the build imports the package with the docs' own settings, in its own process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

import django_durable_scheduler

ROOT = Path(__file__).resolve().parent.parent
PAGES = (
    "index.html",
    "README.html",
    "search.html",
    "searchindex.js",
    "docs/tutorial.html",
    "docs/api.html",
    "docs/lifecycle.html",
    "docs/design.html",
)

pytestmark = [
    # The docs are the repository's; the Django 6 legs run a copy of tests/ beside the wheel.
    pytest.mark.skipif(not (ROOT / "docs" / "conf.py").is_file(), reason="no repository tree beside them"),
    # One build per suite run is enough: the SQLite leg builds it.
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the site is built on the SQLite leg"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built by docs/site.md's command, ``python3 docs/build.py``, with a fresh venv
    of its own (``DSCH_DOCS_VENV``): what a fresh clone gets, whatever this environment has."""
    out = tmp_path_factory.mktemp("site")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env["DSCH_DOCS_VENV"] = str(tmp_path_factory.mktemp("venv-docs"))
    build = subprocess.run(
        [sys.executable, "docs/build.py", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert build.returncode == 0, f"the docs site does not build cleanly:\n{build.stderr}{build.stdout}"
    return out


def test_the_site_builds_with_an_index_and_a_search(site: Path) -> None:
    for page in PAGES:
        assert (site / page).is_file(), page


def test_every_public_name_is_documented_under_its_public_name(site: Path) -> None:
    """A name added to ``__all__`` fails here until docs/api.md documents it."""
    api = (site / "docs" / "api.html").read_text(encoding="utf-8")
    documented = set(re.findall(r'id="django_durable_scheduler\.(\w+)"', api))
    missing = sorted(set(django_durable_scheduler.__all__) - documented)
    assert not missing, f"add these names of __all__ to docs/api.md: {missing}"


def test_the_site_needs_nothing_from_the_network(site: Path) -> None:
    """Scripts, styles, fonts and images are the site's own files: it works offline."""
    remote = re.compile(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="(?:https?:)?//[^"]*"')
    found = [
        f"{page.relative_to(site)}: {match}"
        for page in site.rglob("*.html")
        for match in remote.findall(page.read_text(encoding="utf-8"))
    ]
    found += [
        f"{css.relative_to(site)}: remote url()"
        for css in site.rglob("*.css")
        if re.search(r"url\(\s*['\"]?(?:https?:)?//", css.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)
