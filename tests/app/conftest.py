from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


@pytest.fixture()
def app() -> AppTest:
    """The whole app (sidebar + navigation), run once on its default page."""
    return AppTest.from_file(APP, default_timeout=90).run()
