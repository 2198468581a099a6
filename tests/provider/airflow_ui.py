"""Airflow's own UI in a real browser, for the tests that read it and take the docs' screenshots.

Headless Chromium is Debian's ``chromium`` package driven by Playwright with
``executable_path``: nothing is downloaded (``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1`` in .ci/run).
The shared `airflow standalone` runs the simple auth manager with every user an admin
(``SIMPLE_AUTH_MANAGER_ALL_ADMINS``), so a page opened on its address is logged in by the UI
itself: no login form to fill.

Screenshots go to ``$STREAMBATCH_SCREENSHOTS`` (docs/images/ when refreshing the docs'
pictures), else to the test's tmp dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

UI_TIMEOUT_MS = 60_000  # the API server builds a page's data on its first request: slow on a busy machine


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Playwright ``Browser`` on Debian's Chromium, closed on exit."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable, "no `chromium` on PATH: install Debian's package (apt-get install chromium), as .ci/run does"
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to run as root (CI containers)
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def screenshots_dir(tmp_path: Path) -> Path:
    """Where a test saves its screenshots: ``$STREAMBATCH_SCREENSHOTS``, else under ``tmp_path``."""
    where = Path(os.environ.get("STREAMBATCH_SCREENSHOTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def open_ui(page, server, path: str) -> None:
    """``page`` at ``path`` (``/dags/<dag_id>/runs``) of ``server``'s UI."""
    page.goto(f"http://127.0.0.1:{server.port}{path}", timeout=UI_TIMEOUT_MS)


@contextlib.contextmanager
def error_screenshot(page, path: Path) -> Iterator[None]:
    """On an exception inside, save what the browser showed to ``path`` (for whoever reads the CI log)."""
    try:
        yield
    except Exception:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(path))
        raise
