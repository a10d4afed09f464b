"""Open a page in headless Chromium through Playwright: the browser test of ``segc
graph --format html`` and ``segc graph --screenshot`` use it. Playwright's own Chromium
(``python -m playwright install chromium``) is tried first, then a system Chromium or
Chrome on PATH."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import UsageError

SYSTEM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@contextmanager
def page(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A Playwright page in headless Chromium; a ``UsageError`` saying why when there is
    no Playwright or no browser."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UsageError("needs Playwright: pip install playwright && python -m playwright install chromium") from None
    with sync_playwright() as p:
        browser, errors = None, []
        for exe in [None, *filter(None, (shutil.which(n) for n in SYSTEM))]:
            try:
                browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"], timeout=60_000)
                break
            except Exception as exc:  # the next candidate
                errors.append(f"{exe or 'playwright chromium'}: {str(exc).splitlines()[0]}")
        if browser is None:
            raise UsageError(f"no headless Chromium could start ({'; '.join(errors)})")
        try:
            pg = browser.new_page(viewport={"width": width, "height": height})
            pg.set_default_timeout(60_000)
            yield pg
        finally:
            browser.close()


def screenshot(html: str, png: str) -> int:
    """Render ``html`` (a file) and save a screenshot of the viewport to ``png``; the
    number of segment cards the page rendered."""
    with page() as pg:
        pg.goto(Path(html).resolve().as_uri())
        n = pg.locator("section.segment").count()
        pg.screenshot(path=png)
    return int(n)
