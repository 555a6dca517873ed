"""A headless Chromium for the browser tests: Playwright (sync API) driving Debian's chromium.

Needs the ``playwright`` package (the dev dependency group) and ``/usr/bin/chromium``
(``apt-get install chromium``; ``.ci/run`` installs it). Never ``playwright install``: no
browser is downloaded. Without either, the tests skip (``MISSING`` says why), except under CI
(``CI=true``), where they must run and fail instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (it is in the dev dependency group)"
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


MISSING = _missing()
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_unless_browser() -> pytest.MarkDecorator:
    """Skip a browser test when no browser can run, except under CI, where it must run."""
    return pytest.mark.skipif(MISSING is not None and not IN_CI, reason=f"browser tests skipped: {MISSING}")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if MISSING:
        pytest.fail(f"browser tests must run in CI, but {MISSING}")
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch, sync_playwright() as p:
        # Playwright's sync API keeps an asyncio loop on this thread while it runs; the
        # tests' own ORM calls (set-up, checks, the database flush after each test) are
        # still plain synchronous code between browser steps.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = p.chromium.launch(
            executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
            headless=True,
            args=CHROMIUM_ARGS,
        )
        yield browser
        browser.close()
