"""kvsim: make KV-cache memory in LLM serving visible and measurable.

The core (specs, calculator, capacity planner, block pool, scheduler, workloads) needs only
numpy and pandas; the live engine imports torch; the figures import plotly. Nothing here
imports streamlit.
"""

__version__ = "0.1.0"
