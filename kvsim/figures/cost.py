"""Figures for the Cost page: what paging does not remove.

Every function takes the DataFrame a :mod:`kvsim.costmodel` (or :mod:`kvsim.ratesweep`)
sweep returns plus a one-line ``assumed`` string naming the inputs (model, GPU, dtypes,
batch or context), which goes into the title so a chart never loses its assumptions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvsim.figures.style import STRATEGY_COLORS, styled, titled

from kvsim.units import GiB

KV_COLOR = "#2f6db5"
WEIGHT_COLOR = "#868e96"
SHARE_COLOR = "#d9480f"
LATENCY_COLOR = "#d9480f"
THROUGHPUT_COLOR = "#2f6db5"


def _vertical(fig: go.Figure, x: float, top: float, name: str, color: str, dash: str, bottom: float = 0.0) -> None:
    """A vertical marker drawn as a legend entry (shapes and annotations misplace on log axes)."""
    fig.add_trace(go.Scatter(x=[x, x], y=[bottom, top], mode="lines", name=name,
                             line=dict(color=color, dash=dash), hoverinfo="name"))


def context_cost_figure(df: pd.DataFrame, assumed: str) -> go.Figure:
    """KV bytes read per decode step (bars, GiB) beside the weights read once per step
    (line), with attention's share of the modelled step time on a second axis (%)."""
    fig = go.Figure()
    ctx = df["context"].tolist()
    fig.add_trace(go.Bar(x=ctx, y=(df["kv_read_bytes"] / GiB).tolist(), name="KV bytes read per step",
                         marker_color=KV_COLOR, hovertemplate="context %{x:,}<br>%{y:.2f} GiB<extra></extra>"))
    fig.add_trace(go.Scatter(x=ctx, y=(df["weight_bytes"] / GiB).tolist(), name="weight bytes per step",
                             mode="lines", line=dict(color=WEIGHT_COLOR, dash="dash"),
                             hovertemplate="%{y:.2f} GiB<extra>weights</extra>"))
    fig.add_trace(go.Scatter(x=ctx, y=(100 * df["attention_share"]).tolist(), name="attention share of step time",
                             mode="lines+markers", yaxis="y2", line=dict(color=SHARE_COLOR),
                             hovertemplate="%{y:.1f} %<extra>attention share</extra>"))
    return styled(
        fig,
        title=titled("Every decode step reads the whole context's KV: paging does not shrink it", assumed),
        xaxis=dict(title="context per sequence (tokens)", type="category"),
        yaxis=dict(title="bytes read per step (GiB)", rangemode="tozero"),
        yaxis2=dict(title="attention share of step time (%)", overlaying="y", side="right", range=[0, 100],
                    tickmode="linear", tick0=0, dtick=20, showgrid=False),
        bargap=0.3,
    )


def batch_cost_figure(df: pd.DataFrame, assumed: str, *, max_batch_in_memory: int | None = None,
                      ridge_batch: float | None = None) -> go.Figure:
    """Decode throughput (tokens/s) and per-token latency (ms) as the batch grows; a
    dotted line marks the largest batch whose KV fits, a dashed one the compute ridge."""
    fig = go.Figure()
    b = df["batch_size"].tolist()
    fig.add_trace(go.Scatter(x=b, y=df["throughput_tokens_per_s"].tolist(), name="throughput (tokens/s)",
                             mode="lines+markers", line=dict(color=THROUGHPUT_COLOR),
                             hovertemplate="batch %{x:,}<br>%{y:,.0f} tokens/s<extra></extra>"))
    fig.add_trace(go.Scatter(x=b, y=(1e3 * df["per_token_latency_s"]).tolist(), name="per-token latency (ms)",
                             mode="lines+markers", yaxis="y2", line=dict(color=LATENCY_COLOR),
                             hovertemplate="batch %{x:,}<br>%{y:.2f} ms/token<extra></extra>"))
    top = float(df["throughput_tokens_per_s"].max()) if len(df) else 1.0
    if max_batch_in_memory is not None and max_batch_in_memory >= 1:
        _vertical(fig, max_batch_in_memory, top, f"KV memory full at batch {max_batch_in_memory:,}", "#495057", "dot")
    if ridge_batch is not None:
        _vertical(fig, ridge_batch, top, f"step compute-bound from batch ~{ridge_batch:,.0f}", "#2b8a3e", "dash")
    return styled(
        fig,
        title=titled("Bigger batches raise throughput and per-token latency", assumed),
        xaxis=dict(title="decode batch (sequences)", type="log"),
        yaxis=dict(title="throughput (tokens/s)", rangemode="tozero"),
        yaxis2=dict(title="per-token latency (ms)", overlaying="y", side="right", rangemode="tozero",
                    tickmode="auto", showgrid=False),
    )


def roofline_figure(grid: pd.DataFrame, ridge_point: float, bandwidth_bytes_per_s: float, flops_per_s: float,
                    assumed: str) -> go.Figure:
    """The GPU's roofline (attainable FLOP/s against FLOPs per byte) with decode steps of
    the grid placed on it: each point is a (batch, context) step's intensity and modelled
    achieved FLOP/s (its FLOPs / modelled time). Points left of the ridge are memory-bound."""
    lo = max(1e-2, float(grid["arithmetic_intensity"].min()) / 3) if len(grid) else 0.1
    hi = max(ridge_point * 10, float(grid["arithmetic_intensity"].max()) * 3) if len(grid) else ridge_point * 10
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    roof = np.minimum(xs * bandwidth_bytes_per_s, flops_per_s) / 1e12
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs.tolist(), y=roof.tolist(), mode="lines", name="roofline (attainable)",
                             line=dict(color="#212529"), hovertemplate="%{x:.1f} FLOP/B: %{y:.1f} TFLOP/s<extra></extra>"))
    for ctx, part in grid.groupby("context", sort=True):
        y = part["achieved_flops_per_s"] / 1e12
        fig.add_trace(go.Scatter(
            x=part["arithmetic_intensity"].tolist(), y=y.tolist(), mode="markers+lines", name=f"decode, context {ctx:,}",
            text=[f"batch {b:,}" for b in part["batch_size"].tolist()],
            hovertemplate="%{text}<br>%{x:.1f} FLOP/B, %{y:.2f} TFLOP/s<extra></extra>"))
    _vertical(fig, ridge_point, flops_per_s / 1e12, f"ridge point {ridge_point:,.0f} FLOP/B", "#2b8a3e", "dash",
              bottom=float(roof.min()))
    return styled(
        fig,
        title=titled("Where decode steps sit on the roofline: memory-bound left of the ridge", assumed),
        xaxis=dict(title="arithmetic intensity (FLOPs per byte moved)", type="log"),
        yaxis=dict(title="achieved throughput (TFLOP/s)", type="log"),
    )


def rate_sweep_figure(df: pd.DataFrame, assumed: str, *, latency_bound_s: float | None = None) -> go.Figure:
    """Normalized latency (seconds per output token, mean over requests) against request
    rate, one line per strategy: the shape of the PagedAttention paper's Figure 12."""
    fig = go.Figure()
    for strategy, part in df.groupby("strategy", sort=False):
        part = part.sort_values("rate_per_s")
        fig.add_trace(go.Scatter(
            x=part["rate_per_s"].tolist(), y=part["normalized_latency_s"].tolist(), mode="lines+markers",
            name=str(strategy), line=dict(color=STRATEGY_COLORS.get(str(strategy))),
            hovertemplate="%{x:.2f} req/s<br>%{y:.3f} s/token<extra>" + str(strategy) + "</extra>"))
    if latency_bound_s is not None and len(df):
        rates = [0.0, float(df["rate_per_s"].max())]
        fig.add_trace(go.Scatter(x=rates, y=[latency_bound_s] * 2, mode="lines", hoverinfo="name",
                                 name=f"latency bound {latency_bound_s:.3g} s/token", line=dict(color="#495057", dash="dot")))
    return styled(
        fig,
        title=titled("Normalized latency versus request rate: where each strategy's latency explodes", assumed),
        xaxis=dict(title="request rate (requests/s)", rangemode="tozero"),
        yaxis=dict(title="normalized latency (s per output token)", type="log"),
    )


def step_time_validation_figure(df: pd.DataFrame, assumed: str) -> go.Figure:
    """Measured step time beside the cost model's prediction for the same batch, per step."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=df["step"].tolist(), y=(1e3 * df["measured_step_time_s"]).tolist(),
                             mode="lines+markers", name="measured", line=dict(color="#d9480f"),
                             hovertemplate="step %{x}<br>%{y:.3f} ms<extra>measured</extra>"))
    fig.add_trace(go.Scatter(x=df["step"].tolist(), y=(1e3 * df["predicted_step_time_s"]).tolist(),
                             mode="lines", name="cost model (roofline)", line=dict(color="#2f6db5", dash="dash"),
                             hovertemplate="step %{x}<br>%{y:.3f} ms<extra>predicted</extra>"))
    return styled(
        fig,
        title=titled("Step time: measured against the cost model's prediction", assumed),
        xaxis=dict(title="engine step"),
        yaxis=dict(title="step time (ms)", rangemode="tozero"),
    )


__all__ = [
    "context_cost_figure", "batch_cost_figure", "roofline_figure", "rate_sweep_figure",
    "step_time_validation_figure",
]
