"""The look the figures share: two-line titles that state their assumptions, legends under
the plot (never over a title), light grids, and one colour per allocation strategy."""

from __future__ import annotations

import plotly.graph_objects as go

#: One colour per strategy, the same on every page.
STRATEGY_COLORS = {
    "reserve-max": "#d9480f", "pow2": "#f59f00", "oracle": "#2b8a3e", "paged": "#2f6db5", "paged+prefix": "#7048e8",
}


def titled(text: str, assumed: str) -> dict:
    """A title with the inputs it assumed in small type underneath."""
    return dict(text=f"{text}<br><sup>{assumed}</sup>", x=0.01, xanchor="left")


def legend_below(y: float = -0.2) -> dict:
    return dict(orientation="h", yanchor="top", y=y, x=0, xanchor="left")


def styled(fig: go.Figure, **layout) -> go.Figure:
    """Margins for a two-line title, the legend under the plot, light grids."""
    fig.update_layout(margin=dict(l=10, r=10, t=80, b=40), plot_bgcolor="white", legend=legend_below(), **layout)
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    return fig
