"""The documentation site in a real browser: ``mkdocs build --strict`` into a temporary folder, then headless Chromium
(Debian's ``chromium``, driven by ``playwright``) opens a few pages, fails on a broken image or on a page that shows
fewer figures than it should, and takes a screenshot of each (into ``$POSENC_SHOTS`` when set, else the test's
temporary folder).

Skipped, with the reason, where ``playwright`` or the browser is missing (``apt-get install chromium`` and
``pip install playwright``; CI machines may have neither)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _atlas_figures() -> int:
    from posenc.analysis import atlas

    return len(atlas.entries())


def _figures_on(page: str) -> int:
    return len(re.findall(r"!\[[^\]]+\]\(", (ROOT / "docs" / page).read_text()))


# site page -> (its Markdown source, the screenshot's name)
PAGES = {"atlas/index.html": ("atlas.md", "atlas"),
         "results/which-method/index.html": ("results/which-method.md", "which-method"),
         "results/quick/index.html": ("results/quick.md", "results-quick"),
         "results/smollm2/index.html": ("results/smollm2.md", "results-smollm2"),
         "results/performance/index.html": ("results/performance.md", "results-performance")}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium): the browser test needs a real browser")
    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
                   cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory, site):
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("profile")  # an empty --user-data-dir
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                        args=FLAGS, viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()


def _shots(tmp_path) -> Path:
    folder = Path(os.environ.get("POSENC_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_shows_every_figure_unbroken(page, site, browser, tmp_path):
    source, shot = PAGES[page]
    tab = browser.new_page()
    try:
        tab.goto((site / page).as_uri(), wait_until="load")
        images = tab.evaluate("""() => Array.from(document.images).map(img => ({
            src: img.getAttribute('src'), complete: img.complete, width: img.naturalWidth}))""")
        broken = [i["src"] for i in images if not i["complete"] or i["width"] == 0]
        assert not broken, f"{page}: broken images {broken}"
        expected = _atlas_figures() if source == "atlas.md" else _figures_on(source)
        assert expected > 0 and len(images) >= expected, f"{page}: {len(images)} images, expected {expected}"
        assert tab.title() and "404" not in tab.title()
        folder = _shots(tmp_path)
        tab.screenshot(path=str(folder / f"{shot}.png"))  # the first screen, as a reader lands on it
        figure = tab.locator("img").first
        figure.scroll_into_view_if_needed()
        tab.screenshot(path=str(folder / f"{shot}-figure.png"))  # the first figure on screen
    finally:
        tab.close()
