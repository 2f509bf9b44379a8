"""The app in a real browser: the Calculator page draws its charts and seed numbers."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.browser


def test_calculator_page_renders_chart(app_url, page, tmp_path):
    page.goto(app_url, wait_until="domcontentloaded")
    chart = page.get_by_test_id("stPlotlyChart").first
    chart.wait_for(state="visible", timeout=60_000)
    # Plotly has drawn into the chart container (an SVG with traces), not just an empty div.
    page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=30_000)
    body = page.inner_text("body")
    assert "819,200" in body  # OPT-13B fp16 bytes per token, the seed's example
    titles = page.eval_on_selector_all("[data-testid='stPlotlyChart'] .gtitle", "els => els.map(e => e.textContent)")
    assert any("15 empty slot(s) in the last block" in t for t in titles), titles
    shot = os.environ.get("KVSIM_SCREENSHOT_DIR")
    if shot:
        page.screenshot(path=os.path.join(shot, "calculator.png"), full_page=True)
    assert page.get_by_test_id("stException").count() == 0
