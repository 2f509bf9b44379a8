"""kvsim app: `streamlit run app.py`.

st.navigation over the page files in pages/ (auto-discovery stays off); the sidebar that
picks the model, KV dtype and tensor parallelism is shared by every page.
"""

import streamlit as st

from ui.sidebar import render_sidebar

st.set_page_config(page_title="kvsim: KV-cache explorer", page_icon=":material/memory:", layout="wide")

PAGES = [
    st.Page("pages/calculator.py", title="Calculator", icon=":material/calculate:", default=True),
    st.Page("pages/block_table.py", title="Block table", icon=":material/grid_view:"),
    st.Page("pages/strategies.py", title="Strategies", icon=":material/stacked_bar_chart:"),
    st.Page("pages/cost.py", title="Cost", icon=":material/speed:"),
    st.Page("pages/engine.py", title="Engine", icon=":material/monitoring:"),
    st.Page("pages/live.py", title="Live", icon=":material/play_circle:"),
    # One line per page; keep the order a newcomer would read them in.
]

nav = st.navigation(PAGES)
render_sidebar()
nav.run()
