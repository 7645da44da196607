"""`collage report`'s page in a real headless browser (Debian's chromium-headless-shell, driven by
playwright): it renders, the graph SVG has a size, nothing is fetched and the console stays clean. Marked
``bench``: CI has no browser (``apt-get install chromium-headless-shell && pip install playwright``); the
HTML-parser checks in test_report.py run everywhere."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from helpers import LIT_INPUTS


pytestmark = pytest.mark.bench


def _browser() -> str:
    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.skip("no chromium installed (apt-get install chromium-headless-shell)")


def test_report_renders_in_headless_chromium(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    browser_path = _browser()
    out = tmp_path / "r.html"
    r = subprocess.run([sys.executable, "-m", "collage_mlir.tools.cli", "report", str(LIT_INPUTS / "mlp-plan.json"),
                        "--model", str(LIT_INPUTS / "mlp.mlir"), "--db", str(tmp_path / "none.sqlite"), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    problems, requests = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda req: requests.append(req.url))
            page.goto(out.resolve().as_uri())
            assert page.title() == "collage placement report"
            box = page.locator("svg").first.bounding_box()
            assert box is not None and box["width"] > 100 and box["height"] > 100  # the graph is drawn
            assert page.locator("svg path").count() > 10  # nodes and edges, not an empty frame
            headings = page.locator("h2").all_inner_texts()
            assert {"Graph", "Regions", "Provenance"} <= set(headings)
            assert "layer1" in page.locator("table").first.inner_text()
        finally:
            browser.close()
    assert problems == []
    assert requests == [out.resolve().as_uri()]  # self-contained: nothing else is fetched
