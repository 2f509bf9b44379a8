"""Figures for the engine bridge: a measured Timeline from a serving engine's metrics, with
the planner's prediction beside it. Pure ``data -> go.Figure``; the page adds captions."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvsim.units import GiB

MEASURED_COLOR = "#1f77b4"
PREDICTED_COLOR = "#ff7f0e"
CAPACITY_COLOR = "#2ca02c"
WAITING_COLOR = "#d62728"


def _finite(series: pd.Series) -> bool:
    return bool(np.isfinite(pd.to_numeric(series, errors="coerce")).any())


def _layout(fig: go.Figure, title: str, y_title: str) -> go.Figure:
    fig.update_layout(
        title=title, xaxis_title="time since first scrape (s)", yaxis_title=y_title,
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), margin=dict(t=80, l=60, r=20, b=50),
        hovermode="x unified",
    )
    return fig


def engine_kv_figure(
    timeline: pd.DataFrame,
    *,
    engine_capacity_bytes: float | None = None,
    predicted_capacity_bytes: float | None = None,
    title: str = "Measured KV cache use beside the prediction",
) -> go.Figure:
    """KV in use over time: in GiB when the timeline has ``measured_kv_bytes`` (then the
    engine's capacity and the planner's predicted capacity are horizontal lines, and
    ``predicted_kv_bytes`` a second series), else the engine's usage fraction in percent."""
    fig = go.Figure()
    t = timeline["time_s"] if "time_s" in timeline else pd.Series(dtype=float)
    in_bytes = "measured_kv_bytes" in timeline and _finite(timeline["measured_kv_bytes"])
    if in_bytes:
        fig.add_trace(go.Scatter(x=t, y=timeline["measured_kv_bytes"] / GiB, mode="lines+markers",
                                 name="measured (engine)", line=dict(color=MEASURED_COLOR)))
        if "predicted_kv_bytes" in timeline and _finite(timeline["predicted_kv_bytes"]):
            fig.add_trace(go.Scatter(x=t, y=timeline["predicted_kv_bytes"] / GiB, mode="lines",
                                     name="predicted for running requests", line=dict(color=PREDICTED_COLOR, dash="dash")))
        for value, name, color, dash in (
            (engine_capacity_bytes, "engine capacity", CAPACITY_COLOR, "solid"),
            (predicted_capacity_bytes, "planner capacity", PREDICTED_COLOR, "dot"),
        ):
            if value is not None and math.isfinite(value):
                fig.add_trace(go.Scatter(x=[t.min(), t.max()] if len(t) else [0, 1], y=[value / GiB] * 2,
                                         mode="lines", name=name, line=dict(color=color, dash=dash)))
        return _layout(fig, title, "KV cache per engine (GiB)")
    if "kv_usage_fraction" in timeline:
        fig.add_trace(go.Scatter(x=t, y=timeline["kv_usage_fraction"] * 100, mode="lines+markers",
                                 name="measured (engine)", line=dict(color=MEASURED_COLOR)))
    if {"predicted_kv_bytes", "capacity_bytes"} <= set(timeline.columns) and _finite(timeline["predicted_kv_bytes"]):
        fig.add_trace(go.Scatter(x=t, y=timeline["predicted_kv_bytes"] / timeline["capacity_bytes"] * 100,
                                 mode="lines", name="predicted for running requests",
                                 line=dict(color=PREDICTED_COLOR, dash="dash")))
    fig.add_trace(go.Scatter(x=[t.min(), t.max()] if len(t) else [0, 1], y=[100, 100], mode="lines",
                             name="full", line=dict(color=CAPACITY_COLOR)))
    fig.update_yaxes(range=[0, 105])
    return _layout(fig, title, "KV cache usage (% of blocks)")


def engine_requests_figure(timeline: pd.DataFrame, title: str = "Requests running and waiting") -> go.Figure:
    """Running batch and queue over time."""
    fig = go.Figure()
    for col, name, color in (("running", "running", MEASURED_COLOR), ("waiting", "waiting", WAITING_COLOR)):
        if col in timeline:
            fig.add_trace(go.Scatter(x=timeline["time_s"], y=timeline[col], mode="lines+markers", name=name,
                                     line=dict(color=color)))
    return _layout(fig, title, "requests")


def engine_rates_figure(timeline: pd.DataFrame, title: str = "Preemption rate and prefix-cache hit rate") -> go.Figure:
    """Counters turned into rates per interval: preemptions/s (left), prefix hit rate % (right)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    if "preemptions_per_s" in timeline:
        fig.add_trace(go.Bar(x=timeline["time_s"], y=timeline["preemptions_per_s"], name="preemptions / s",
                             marker_color=WAITING_COLOR, opacity=0.7), secondary_y=False)
    if "prefix_hit_rate" in timeline:
        fig.add_trace(go.Scatter(x=timeline["time_s"], y=timeline["prefix_hit_rate"] * 100, mode="lines+markers",
                                 name="prefix hit rate", line=dict(color=CAPACITY_COLOR)), secondary_y=True)
    _layout(fig, title, "preemptions per second")
    fig.update_yaxes(title_text="preemptions per second", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="prefix-cache hit rate (%)", range=[0, 100], secondary_y=True)
    return fig


def capacity_ratio_figure(
    quantities: Sequence[str],
    ratios: Sequence[float | None],
    title: str = "Engine's capacity / planner's prediction",
) -> go.Figure:
    """One bar per quantity: the engine's figure over the planner's (1 = exact prediction)."""
    names = [q for q, r in zip(quantities, ratios) if r is not None]
    values = [r for r in ratios if r is not None]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=MEASURED_COLOR,
                           text=[f"{v:.3f}x" for v in values], textposition="outside"))
    fig.add_hline(y=1.0, line_dash="dash", line_color=PREDICTED_COLOR, annotation_text="prediction")
    fig.update_layout(title=title, xaxis_title="quantity", yaxis_title="engine / planner (ratio)",
                      margin=dict(t=60, l=60, r=20, b=50))
    return fig
