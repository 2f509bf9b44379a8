"""Page state shared through the URL's query parameters.

``init_from_query`` seeds widget keys once per session from the URL (falling back to a
default when the parameter is absent or malformed); ``sync_to_query`` writes the current
valid values back, so copying the address bar shares exactly what is shown.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import streamlit as st


def init_from_query(spec: Mapping[str, tuple[str, Any, Callable[[str], Any]]]) -> None:
    """``spec``: query name -> (session-state key, default, parser)."""
    for name, (key, default, parse) in spec.items():
        if key in st.session_state:
            continue
        raw = st.query_params.get(name)
        value = default
        if raw is not None:
            try:
                value = parse(raw)
            except (TypeError, ValueError):
                value = default
            if isinstance(default, (int, float)) and not isinstance(default, bool) and value < 1 and default >= 1:
                value = default
        st.session_state[key] = value


def sync_to_query(values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        st.query_params[name] = str(value)
