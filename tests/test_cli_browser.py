"""The HTML graph of ``segc graph --format html`` opened in headless Chromium
(Playwright): the page renders one card per segment, each visible and named, and the
Graphviz drawing's clusters when Graphviz is installed. Skipped, with the reason, only
where Playwright or a Chromium cannot be had (``make install`` installs both where it
can: ``python -m playwright install chromium``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install 'segc[test]')")

from segc.cli.browser import page
from segc.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def browser_page():  # type: ignore[no-untyped-def]
    try:
        with page() as pg:
            yield pg
    except UsageError as exc:
        pytest.skip(reason=f"no headless browser: {exc}")


def test_html_graph_renders_every_segment(browser_page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "g.html"
    res = subprocess.run(
        [sys.executable, "-m", "segc", "graph", "llama:layers=3,hidden=32", "--format", "html", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stderr
    browser_page.goto(out.resolve().as_uri())
    cards = browser_page.locator("section.segment")
    assert cards.count() == 4
    names = [cards.nth(k).locator("h2 code").inner_text() for k in range(4)]
    assert names == ["model.layers.0", "model.layers.1", "model.layers.2", "tail"]
    for k in range(4):
        box = cards.nth(k).bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 40
    # the boundary values are shown with their types; clicking one highlights its uses
    value = browser_page.locator("section.segment[data-index='1'] .bnd").first
    value.click()
    assert browser_page.locator(".hl").count() >= 2
    if shutil.which("dot") is not None:
        assert browser_page.locator(".svg svg g.cluster").count() == 5  # the inputs and 4 segments
