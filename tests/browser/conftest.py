"""Browser tests in a real Chromium (Debian's ``/usr/bin/chromium``, installed by ``.ci/setup``) through Playwright.

The demo job's run of the session (``demo_small_run``: ``attnclust run`` of the packaged MiniLM on 24 questions of
the bundled sample, shared with tests/integration), and one browser per test module. Every test here is marked
``browser``, and ``slow`` when it needs the demo run (the packaged MiniLM end to end). They are skipped, with the
reason, only when Playwright cannot be imported or Chromium is not installed; a Chromium that is installed but does
not start is an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
            if "demo_run" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module. Playwright's sync API keeps an event loop running on the main
    thread while it is open; scoped to the module (``tests/browser`` is a plain directory, so "package" would be
    the whole session), it is stopped before tests elsewhere call ``asyncio.run``, which refuses to run inside a
    running loop."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.skip(f"playwright is not installed ({exc}); install the test extra: pip install -e '.[test]'")
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found; .ci/setup installs Debian's chromium (apt-get install chromium)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def demo_run(demo_small_run) -> Path:
    """A finished run of the demo job, its report the one under test: the session's ``demo_small_run``
    (tests/conftest.py: ``attnclust run`` of ``jobs/demo.yaml`` on 24 questions of the bundled sample, on the
    embedded Dask cluster of 2 workers), the run tests/integration checks too.

    ``ATTNCLUST_BROWSER_RUN=DIR`` reuses a finished run instead (read by these tests only, to iterate on them).
    """
    if os.environ.get("ATTNCLUST_BROWSER_RUN"):
        return Path(os.environ["ATTNCLUST_BROWSER_RUN"])
    return demo_small_run[0]


class Watch:
    """What a page did: every request URL, console errors and uncaught exceptions."""

    def __init__(self, page):
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda req: self.requests.append(req.url))
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _console(self, msg) -> None:
        if msg.type == "error":
            where = msg.location.get("url", "") if msg.location else ""
            self.errors.append(f"console: {msg.text} ({where})")


@pytest.fixture
def page(browser):
    """A fresh page (1440 x 900, device scale 1) with a :class:`Watch` as ``page.watch``."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    pg.watch = Watch(pg)
    try:
        yield pg
    finally:
        context.close()
