"""Figures for the Strategies page: the PagedAttention paper's Figure 2 (where KV memory
goes under each allocation strategy) replayed on a workload.

Inputs are the simulator's outputs as plain data: Timelines (:mod:`kvsim.timeline`) keyed
by strategy label, and summaries as ``SimSummary.to_dict()`` dicts, so these functions are
testable without running anything. Each takes a one-line ``assumed`` string (model,
memory, workload) that goes under the title.

Memory categories, bottom to top, with the colours every chart uses (Timeline columns):
token states (``live_bytes``), reservation (``reserved_bytes``), internal fragmentation
(``internal_frag_bytes``), external fragmentation (``external_frag_bytes``) and free
(``free_bytes``). They add up to ``capacity_bytes`` at every step.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvsim.figures.style import STRATEGY_COLORS, legend_below, titled
from plotly.subplots import make_subplots

from kvsim.strategies import PAPER_NAMES, PAPER_TOKEN_STATE_PERCENT, parse_strategy
from kvsim.units import GiB

#: (Timeline column, legend name, colour), bottom of the stack first.
CATEGORIES = (
    ("live_bytes", "token states", "#2b8a3e"),
    ("reserved_bytes", "reservation", "#fab005"),
    ("internal_frag_bytes", "internal fragmentation", "#f76707"),
    ("external_frag_bytes", "external fragmentation", "#c92a2a"),
    ("free_bytes", "free", "#dee2e6"),
)
_CUMULATIVE = ("preemptions", "finished", "dropped", "prefix_hit_blocks", "prefix_query_blocks", "step", "time_s")
PAPER_SETTING = "paper: OPT-13B on an A100-40GB, ShareGPT requests"


def strategy_color(label: str) -> str:
    return STRATEGY_COLORS.get(label, "#495057")


def paper_token_state_percent(label: str) -> float | None:
    """The paper's Figure 2 token-state share for a strategy label (None for paged+prefix:
    the paper's vLLM number is without prefix caching)."""
    try:
        strat, prefix = parse_strategy(label)
    except Exception:  # noqa: BLE001 - any other label has no paper number
        return None
    return None if prefix else PAPER_TOKEN_STATE_PERCENT.get(strat)


def downsample_timeline(tl: pd.DataFrame, max_points: int = 400) -> pd.DataFrame:
    """At most ``max_points`` rows: consecutive steps averaged in equal bins (so the area
    under a stacked byte series keeps its mean), cumulative counters take the bin's last
    value. Short timelines come back unchanged."""
    n = len(tl)
    if n <= max_points:
        return tl
    k = math.ceil(n / max_points)
    groups = np.arange(n) // k
    numeric = tl.select_dtypes(include="number")
    agg = {c: ("last" if c in _CUMULATIVE else "mean") for c in numeric.columns}
    out = numeric.groupby(groups).agg(agg)
    out["step"] = tl["step"].groupby(groups).mean().to_numpy()  # the bin's centre
    return out.reset_index(drop=True)


def memory_breakdown_figure(timelines: Mapping[str, pd.DataFrame], assumed: str, *, max_points: int = 400) -> go.Figure:
    """One stacked-area panel per strategy: KV memory (GiB) split into the five categories
    over engine steps; the panels share the x axis, so slower strategies run longer."""
    labels = list(timelines)
    rows = max(1, len(labels))
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.2 / rows,
                        subplot_titles=[f"{lb} = {PAPER_NAMES[lb]}" if lb in PAPER_NAMES else lb for lb in labels])
    for i, label in enumerate(labels, start=1):
        tl = downsample_timeline(timelines[label], max_points)
        for col, name, color in CATEGORIES:
            if col not in tl:
                continue
            fig.add_trace(go.Scatter(
                x=tl["step"].tolist(), y=(tl[col] / GiB).tolist(), name=name, legendgroup=name,
                showlegend=i == 1, stackgroup=f"s{i}", mode="lines", line=dict(width=0.5, color=color),
                fillcolor=color, meta=label,
                hovertemplate=f"{label}<br>step %{{x:,.0f}}<br>{name}: %{{y:.2f}} GiB<extra></extra>",
            ), row=i, col=1)
        fig.update_yaxes(title_text="KV memory (GiB)", rangemode="tozero", row=i, col=1)
    fig.update_xaxes(title_text="engine step (one token per running sequence)", row=rows, col=1)
    fig.update_layout(title=titled("Where the KV memory goes, step by step", assumed), height=150 + 190 * rows,
                      margin=dict(l=10, r=10, t=90, b=40), plot_bgcolor="white",
                      legend=legend_below(-0.35 / rows), hovermode="x")
    return fig


def summary_frame(summaries: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per strategy from ``SimSummary.to_dict()`` dicts, percentages rounded to
    0.1, with the paper's Figure 2 token-state share beside ours."""
    rows = []
    for label, s in summaries.items():
        rows.append({
            "strategy": label,
            "token states (%)": round(100 * s["token_state_fraction"], 1),
            "paper Fig. 2 token states (%)": paper_token_state_percent(label),
            "reservation (%)": round(100 * s["reservation_fraction"], 1),
            "internal frag (%)": round(100 * s["internal_fraction"], 1),
            "external frag (%)": round(100 * s["external_fraction"], 1),
            "peak allocated (GiB)": round(s["peak_allocated_bytes"] / GiB, 2),
            "preemptions": int(s["preemptions"]),
            "finished": int(s["finished"]),
            "dropped": int(s["dropped"]),
            "max running": int(s["max_running"]),
            "mean running": round(float(s["mean_running"]), 1),
            "prefix hit rate (%)": round(100 * s["prefix_hit_rate"], 1) if s["prefix_query_blocks"] else None,
            "steps": int(s["steps"]),
        })
    return pd.DataFrame(rows)


def fraction_figure(frame: pd.DataFrame, assumed: str) -> go.Figure:
    """The paper's Figure 2 as horizontal stacked bars (share of the KV memory in use, %),
    with the paper's token-state numbers as black diamonds."""
    labels = frame["strategy"].tolist()
    fig = go.Figure()
    cols = [("token states (%)", "token states"), ("reservation (%)", "reservation"),
            ("internal frag (%)", "internal fragmentation"), ("external frag (%)", "external fragmentation")]
    colors = {name: color for _, name, color in CATEGORIES}
    for col, name in cols:
        fig.add_trace(go.Bar(y=labels, x=frame[col].tolist(), name=name, orientation="h", marker_color=colors[name],
                             text=[f"{v:.1f}" if v >= 6 else "" for v in frame[col]], textposition="inside",
                             insidetextanchor="middle",
                             hovertemplate="%{y}: %{x:.1f} %<extra>" + name + "</extra>"))
    paper = frame["paper Fig. 2 token states (%)"]
    has = paper.notna()
    if has.any():
        fig.add_trace(go.Scatter(y=frame.loc[has, "strategy"].tolist(), x=paper[has].astype(float).tolist(),
                                 mode="markers", name="paper Fig. 2: token states",
                                 marker=dict(symbol="diamond", size=13, color="black", line=dict(color="white", width=1)),
                                 hovertemplate="paper: %{x:.1f} %<extra></extra>"))
    fig.update_layout(
        title=titled("Share of the KV memory in use, averaged over the run", assumed), barmode="stack",
        height=170 + 48 * len(labels), margin=dict(l=10, r=10, t=80, b=40), plot_bgcolor="white",
        legend=dict(legend_below(-0.3), traceorder="normal"), xaxis=dict(title="share of KV memory in use (%)", range=[0, 100], gridcolor="#eee"),
        yaxis=dict(title="strategy", autorange="reversed"),
    )
    return fig


def block_size_sweep_figure(sweep: pd.DataFrame, assumed: str, *, current_block_size: int | None = None) -> go.Figure:
    """Paged, one replay per block size: token-state share and internal fragmentation (%, top),
    preemptions and the most sequences running at once (bottom)."""
    x = [str(int(b)) for b in sweep["block_size"]]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=["memory in use (%)", "preemptions and batch size"])
    fig.add_trace(go.Scatter(x=x, y=(100 * sweep["token_state_fraction"]).tolist(), name="token states (%)",
                             mode="lines+markers", line=dict(color=CATEGORIES[0][2]),
                             hovertemplate="block %{x}: %{y:.1f} %<extra>token states</extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=(100 * sweep["internal_fraction"]).tolist(), name="internal fragmentation (%)",
                             mode="lines+markers", line=dict(color=CATEGORIES[2][2]),
                             hovertemplate="block %{x}: %{y:.1f} %<extra>internal fragmentation</extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=sweep["preemptions"].tolist(), name="preemptions", marker_color="#adb5bd",
                         hovertemplate="block %{x}: %{y:,} preemptions<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=x, y=sweep["max_running"].tolist(), name="max running (sequences)",
                             mode="lines+markers", line=dict(color=STRATEGY_COLORS["paged"]),
                             hovertemplate="block %{x}: %{y:,} sequences<extra>max running</extra>"), row=2, col=1)
    if current_block_size is not None and str(current_block_size) in x:
        top = float(100 * sweep["token_state_fraction"].max())
        fig.add_trace(go.Scatter(x=[str(current_block_size)] * 2, y=[0, max(top, 1.0)], mode="lines",
                                 name=f"chosen block size ({current_block_size})",
                                 line=dict(color="black", dash="dot")), row=1, col=1)
    fig.update_yaxes(title_text="share of KV in use (%)", range=[0, 100], row=1, col=1)
    fig.update_yaxes(title_text="count", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=x)
    fig.update_xaxes(title_text="block size (tokens per block)", row=2, col=1)
    fig.update_layout(title=titled("Block size: slack in the last block versus sharing the pool", assumed), height=560,
                      margin=dict(l=10, r=10, t=90, b=40), plot_bgcolor="white", legend=legend_below(-0.14))
    return fig


def activity_figure(timelines: Mapping[str, pd.DataFrame], assumed: str, *, max_points: int = 400) -> go.Figure:
    """Per strategy over engine steps: sequences running, cumulative preemptions, and (when a
    strategy looked up any prompt block) the cumulative prefix-cache hit rate (%)."""
    with_prefix = [lb for lb, tl in timelines.items()
                   if "prefix_query_blocks" in tl and len(tl) and int(tl["prefix_query_blocks"].iloc[-1]) > 0]
    rows = 3 if with_prefix else 2
    titles = ["sequences running", "preemptions so far"] + (["prefix-cache hit rate so far"] if with_prefix else [])
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.1, subplot_titles=titles)
    for label, full in timelines.items():
        tl = downsample_timeline(full, max_points)
        color = strategy_color(label)
        dash = "dash" if "prefix" in label else "solid"  # paged+prefix often equals paged: keep both visible
        fig.add_trace(go.Scatter(x=tl["step"].tolist(), y=tl["running"].tolist(), name=label, legendgroup=label,
                                 mode="lines", line=dict(color=color, dash=dash),
                                 hovertemplate=f"{label}: %{{y:.0f}} running<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=tl["step"].tolist(), y=tl["preemptions"].tolist(), name=label, legendgroup=label,
                                 showlegend=False, mode="lines", line=dict(color=color, dash=dash),
                                 hovertemplate=f"{label}: %{{y:,}} preemptions<extra></extra>"), row=2, col=1)
        if label in with_prefix:
            q = tl["prefix_query_blocks"].to_numpy(dtype=float)
            rate = np.where(q > 0, 100 * tl["prefix_hit_blocks"].to_numpy(dtype=float) / np.maximum(q, 1), np.nan)
            fig.add_trace(go.Scatter(x=tl["step"].tolist(), y=rate.tolist(), name=label, legendgroup=label,
                                     showlegend=False, mode="lines", line=dict(color=color, dash=dash),
                                     hovertemplate=f"{label}: %{{y:.1f}} % of prompt blocks hit<extra></extra>"),
                          row=3, col=1)
    fig.update_yaxes(title_text="sequences", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="preemptions", rangemode="tozero", row=2, col=1)
    if with_prefix:
        fig.update_yaxes(title_text="hit rate (%)", range=[0, 100], row=3, col=1)
    fig.update_xaxes(title_text="engine step", row=rows, col=1)
    fig.update_layout(title=titled("Batch size, preemptions and prefix-cache hits over the run", assumed),
                      height=170 + 200 * rows, margin=dict(l=10, r=10, t=90, b=40), plot_bgcolor="white",
                      legend=legend_below(-0.3 / rows))
    return fig


__all__ = ["CATEGORIES", "STRATEGY_COLORS", "PAPER_SETTING", "downsample_timeline", "memory_breakdown_figure",
           "summary_frame", "fraction_figure", "block_size_sweep_figure", "activity_figure",
           "paper_token_state_percent", "strategy_color"]
