"""Figures for the Live page: a real paged KV cache measured beside the calculator.

Every function takes the stacked Timeline :func:`kvsim.live.run_live` returns (column
``source``: ``paged`` / ``contiguous``) plus a one-line ``assumed`` string (model, dtype,
device, block and pool size) that goes into the title.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvsim.figures.style import styled, titled

from kvsim.units import KiB, MiB

PAGED_COLOR = "#2f6db5"
CONTIG_COLOR = "#d9480f"
LIVE_COLOR = "#2b8a3e"
WAITING_COLOR = "#868e96"
PREEMPT_COLOR = "#c92a2a"


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) for a byte axis: KiB below 1 MiB, MiB above."""
    return (MiB, "MiB") if max_bytes >= MiB else (KiB, "KiB")


def kv_timeline_figure(timeline: pd.DataFrame, assumed: str) -> go.Figure:
    """KV memory per engine step: paged measured (from the tensor) and predicted (calculator),
    written K/V, and the contiguous baseline's max-length reservations, on one axis."""
    paged = timeline[timeline["source"] == "paged"]
    cont = timeline[timeline["source"] == "contiguous"]
    top = float(timeline[["measured_kv_bytes", "predicted_kv_bytes"]].to_numpy().max()) if len(timeline) else 0.0
    div, unit = byte_unit(top)
    fig = go.Figure()

    def line(df, col, name, color, dash="solid", mode="lines"):
        fig.add_trace(go.Scatter(x=df["step"].tolist(), y=(df[col] / div).tolist(), name=name, mode=mode,
                                 line=dict(color=color, dash=dash, shape="hv"),
                                 hovertemplate=f"step %{{x}}<br>%{{y:,.1f}} {unit}<extra>{name}</extra>"))

    line(paged, "measured_kv_bytes", "paged: measured blocks in use", PAGED_COLOR)
    line(paged, "predicted_kv_bytes", "paged: predicted (calculator)", PAGED_COLOR, dash="dot")
    line(paged, "live_bytes", "paged: measured written K/V", LIVE_COLOR)
    if len(cont):
        line(cont, "measured_kv_bytes", "contiguous: measured reservations", CONTIG_COLOR)
        line(cont, "predicted_kv_bytes", "contiguous: predicted", CONTIG_COLOR, dash="dot")
    return styled(fig, title=titled("KV cache over the run: measured from the tensor vs predicted", assumed),
                   xaxis_title="engine step", yaxis_title=f"KV bytes ({unit})")


def activity_figure(timeline: pd.DataFrame, assumed: str) -> go.Figure:
    """Running and waiting requests per step (paged engine), cumulative preemptions on a second axis."""
    paged = timeline[timeline["source"] == "paged"]
    steps = paged["step"].tolist()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=paged["running"].tolist(), name="running", mode="lines",
                             line=dict(color=PAGED_COLOR, shape="hv")))
    fig.add_trace(go.Scatter(x=steps, y=paged["waiting"].tolist(), name="waiting", mode="lines",
                             line=dict(color=WAITING_COLOR, shape="hv")))
    fig.add_trace(go.Scatter(x=steps, y=paged["preemptions"].tolist(), name="preemptions (cumulative)",
                             mode="lines", yaxis="y2", line=dict(color=PREEMPT_COLOR, dash="dash", shape="hv")))
    top = max(1, int(paged["preemptions"].max()) if len(paged) else 0)  # a count: whole ticks, from 0
    return styled(fig, title=titled("Active requests and preemptions (paged engine)", assumed),
                   xaxis_title="engine step", yaxis_title="requests",
                   yaxis2=dict(title="preemptions (cumulative)", overlaying="y", side="right",
                               range=[0, top * 1.05], tickformat=",d", showgrid=False))


def step_time_figure(compare: pd.DataFrame, assumed: str) -> go.Figure:
    """Measured step time beside the cost model's prediction for the same batch (``compare_step_times``)."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=compare["step"].tolist(), y=(1e3 * compare["measured_step_time_s"]).tolist(),
                             name="measured", mode="lines", line=dict(color=PAGED_COLOR)))
    fig.add_trace(go.Scatter(x=compare["step"].tolist(), y=(1e3 * compare["predicted_step_time_s"]).tolist(),
                             name="cost model (roofline)", mode="lines", line=dict(color=CONTIG_COLOR, dash="dot")))
    return styled(fig, title=titled("Step time: measured vs the cost model", assumed),
                   xaxis_title="engine step", yaxis_title="step time (ms)")


__all__ = ["kv_timeline_figure", "activity_figure", "step_time_figure", "byte_unit"]
