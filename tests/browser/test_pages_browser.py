"""Every page in a real browser, reached the way a person does: open the app, click the page
in the sidebar, wait for its charts, and find no exception on screen."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.browser

# (sidebar label, text the page must show, whether it draws a chart before any click)
PAGES = [
    ("Block table", "logical blocks 0, 1, 2 map to physical 7, 2, 11", True),
    ("Strategies", "Where the KV memory goes", True),
    ("Cost", "what paging does not remove", True),
    ("Engine", "bundled example", True),
    ("Live", "Choose the settings and press Run", False),
]


def _shot(page, name: str) -> None:
    folder = os.environ.get("KVSIM_SCREENSHOT_DIR")
    if folder:
        page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


@pytest.mark.parametrize("label,text,charted", PAGES)
def test_page_renders_from_the_sidebar(app_url, page, label, text, charted):
    page.goto(app_url, wait_until="domcontentloaded")
    page.get_by_test_id("stPlotlyChart").first.wait_for(state="visible", timeout=60_000)  # the Calculator
    page.get_by_test_id("stSidebarNav").get_by_text(label, exact=True).click()
    page.get_by_text(text).first.wait_for(state="visible", timeout=90_000)
    if charted:
        page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=90_000)
    _shot(page, label.lower().replace(" ", "_"))
    assert page.get_by_test_id("stException").count() == 0


def test_live_page_runs_in_the_browser(app_url, page):
    page.goto(app_url, wait_until="domcontentloaded")
    page.get_by_test_id("stPlotlyChart").first.wait_for(state="visible", timeout=60_000)
    page.get_by_test_id("stSidebarNav").get_by_text("Live", exact=True).click()
    page.get_by_text("Choose the settings and press Run").wait_for(timeout=60_000)
    page.get_by_role("button", name="Run").click()
    page.get_by_text("KV cache over the run").first.wait_for(timeout=120_000)
    match = page.get_by_test_id("stMetric").filter(has_text="Tokens match contiguous")
    assert match.get_by_test_id("stMetricValue").inner_text().strip() == "yes"
    diff = page.get_by_test_id("stMetric").filter(has_text="Worst step difference")
    assert diff.get_by_test_id("stMetricValue").inner_text().strip() == "0 B"  # measured == predicted
    _shot(page, "live_run")
    assert page.get_by_test_id("stException").count() == 0
