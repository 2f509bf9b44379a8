from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.apphelpers import APP


@pytest.fixture()
def app() -> AppTest:
    """The whole app (sidebar + navigation), run once on its default page."""
    return AppTest.from_file(APP, default_timeout=90).run()
