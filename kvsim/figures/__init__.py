"""Pure ``data -> plotly.graph_objects.Figure`` functions, one module per area.

Nothing here reads widgets or session state; the pages pass data in and show the figure,
and tests inspect the figure's traces directly.
"""
