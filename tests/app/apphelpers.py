"""Shared pieces of the page tests: the app's path, opening a page, reading what it shows."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def open_page(page: str | None = None, *, timeout: float = 90) -> AppTest:
    """The whole app run once, then switched to ``page`` (e.g. "pages/cost.py")."""
    at = AppTest.from_file(APP, default_timeout=timeout).run()
    if page is not None:
        at.switch_page(page).run()
    assert not at.exception
    return at


def charts(at: AppTest) -> list[dict]:
    """Every Plotly figure on the page, as the JSON spec the browser receives."""
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def metrics(at: AppTest) -> dict[str, str]:
    """Metric label -> displayed value (a string, as the user reads it)."""
    return {m.label: m.value for m in at.metric}
