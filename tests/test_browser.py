"""The page in a real browser (Debian's Chromium, headless, driven by Playwright): run the bsp-like
example, see the divergence, click the grid, and reopen the share link in a fresh page."""
import re
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

SHOTS = Path(__file__).resolve().parent.parent / "out" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DECODE_MS = 600_000  # the embedded pair on a slow shared CPU


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    assert chromium, "install Debian's chromium (apt-get install chromium); .ci/run does"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_bsp_like_example_divergence_grid_click_and_share_link(browser, app_url, embedded):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.get_by_role("button", name="bsp-like decay").click()
    expect(page.locator("#sv-grid td.sv-cell").first).to_be_visible(timeout=DECODE_MS)
    expect(page.locator("#sv-timeline .sv-round").first).to_be_visible()
    expect(page.locator("#sv-timeline .sv-tok.sv-fork")).to_have_count(1)  # the focused sequence's divergence
    assert page.locator("#sv-grid td.sv-cell.sv-fork").count() >= 1
    expect(page.locator("#sv-forensics")).to_contain_text("sync-bug")
    page.screenshot(path=SHOTS / "bsp-like.png", full_page=True)

    selected = page.locator("#sv-grid td.sv-cell.sv-sel")
    seq = selected.get_attribute("data-seq")
    before = page.inner_text("#sv-forensics")
    other = page.locator(f'#sv-grid td.sv-cell[data-seq="{seq}"]:not(.sv-sel)').first
    round_ = other.get_attribute("data-round")
    other.click()
    expect(page.locator("#sv-forensics .sv-forensics")).to_have_attribute("data-round", round_, timeout=60_000)
    after = page.inner_text("#sv-forensics")
    assert after != before and f"Round {round_}," in after
    expect(page).to_have_url(re.compile(rf"\?run=.*&seq={seq}&round={round_}$"))  # the address bar is the share link
    page.screenshot(path=SHOTS / "bsp-like-clicked.png", full_page=True)

    fresh = browser.new_page(viewport={"width": 1400, "height": 1000})
    fresh.goto(page.url)
    expect(fresh.locator("#sv-status")).to_contain_text("matched the shared run exactly", timeout=DECODE_MS)
    cell = fresh.locator("#sv-grid td.sv-cell.sv-sel")
    expect(cell).to_have_attribute("data-round", round_)
    assert cell.get_attribute("data-seq") == seq
    expect(fresh.locator("#sv-timeline .sv-tok.sv-fork")).to_have_count(1)
    assert fresh.inner_text("#sv-forensics") == after
    expect(fresh.locator("#sv-lanes .main-svg").first).to_be_visible(timeout=60_000)  # plotly has drawn
    fresh.screenshot(path=SHOTS / "share-link.png", full_page=True)  # the README's screenshot
