"""Figures for the Calculator page: a sequence's blocks, bytes versus concurrency, the
block-size sweep and the GPU memory budget."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvsim.capacity import CapacityPlan
from kvsim.units import GiB

FILLED = "#2f6db5"
EMPTY = "#e9ecef"
SLACK_EDGE = "#d9480f"

#: Blocks drawn in full before the drawing elides the middle of a long sequence.
MAX_DRAWN_BLOCKS = 24


def _drawn_blocks(num_blocks: int) -> list[int | None]:
    """Logical block ids to draw; ``None`` marks the elided middle."""
    if num_blocks <= MAX_DRAWN_BLOCKS:
        return list(range(num_blocks))
    head = MAX_DRAWN_BLOCKS // 2
    tail = MAX_DRAWN_BLOCKS - head - 1
    return list(range(head)) + [None] + list(range(num_blocks - tail, num_blocks))


def sequence_blocks_figure(num_tokens: int, block_size: int, block_table: list[int] | None = None) -> go.Figure:
    """One row per logical block, one cell per token slot: filled slots blue, the empty
    slots of the last block grey with an orange outline (the final-block slack).

    ``block_table`` (logical -> physical ids) labels each row with its physical block.
    """
    num_blocks = -(-num_tokens // block_size) if num_tokens > 0 else 0
    rows = _drawn_blocks(num_blocks)
    fig = go.Figure()
    cell_w = 1.0
    xs_filled, ys_filled, text_filled = [], [], []
    xs_empty, ys_empty = [], []
    labels = []
    for row, logical in enumerate(rows):
        y = len(rows) - 1 - row
        if logical is None:
            labels.append((y, "…"))
            continue
        phys = f" -> physical {block_table[logical]}" if block_table is not None and logical < len(block_table) else ""
        labels.append((y, f"logical {logical}{phys}"))
        first = logical * block_size
        for slot in range(block_size):
            token = first + slot
            if token < num_tokens:
                xs_filled.append(slot * cell_w)
                ys_filled.append(y)
                text_filled.append(f"token {token}")
            else:
                xs_empty.append(slot * cell_w)
                ys_empty.append(y)
    marker = dict(symbol="square", size=max(6, min(22, int(560 / max(block_size, 1)))), line=dict(width=1, color="white"))
    fig.add_trace(go.Scatter(x=xs_filled, y=ys_filled, mode="markers", name="token slot in use",
                             marker=dict(color=FILLED, **marker), text=text_filled, hoverinfo="text"))
    fig.add_trace(go.Scatter(x=xs_empty, y=ys_empty, mode="markers", name="empty slot (slack)",
                             marker=dict(color=EMPTY, **{**marker, "line": dict(width=1.5, color=SLACK_EDGE)}),
                             hoverinfo="skip"))
    slack = num_blocks * block_size - num_tokens
    fig.update_layout(
        title=f"{num_tokens:,} tokens in {num_blocks:,} blocks of {block_size}: {slack} empty slot(s) in the last block",
        xaxis=dict(title="slot within block (token offset)", range=[-0.7, block_size - 0.3], zeroline=False),
        yaxis=dict(tickmode="array", tickvals=[y for y, _ in labels], ticktext=[t for _, t in labels],
                   range=[-0.7, max(len(rows), 1) - 0.3], zeroline=False, showgrid=False),
        height=max(180, 34 * len(rows) + 120),
        margin=dict(l=10, r=10, t=60, b=40),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0),
        plot_bgcolor="white",
    )
    return fig


def concurrency_figure(df: pd.DataFrame, context: int, max_len: int | None) -> go.Figure:
    """Live, allocated (paged) and reserved (max-length) bytes as concurrency grows."""
    fig = go.Figure()
    series = [
        ("reserved_bytes", f"reserved (max_len {max_len:,} each)" if max_len else "reserved", "#c92a2a", "dash"),
        ("allocated_bytes", "allocated (paged blocks)", FILLED, "solid"),
        ("live_bytes", "live (tokens written)", "#2b8a3e", "dot"),
    ]
    for col, name, color, dash in series:
        fig.add_trace(go.Scatter(x=df["concurrency"], y=df[col].astype(float) / GiB, name=name,
                                 mode="lines+markers", line=dict(color=color, dash=dash)))
    fig.update_layout(
        title=f"KV memory as concurrency grows ({context:,} tokens per sequence)",
        xaxis_title="concurrent sequences", yaxis_title="KV memory (GiB)",
        margin=dict(l=10, r=10, t=60, b=40), legend=dict(orientation="h", y=-0.25),
    )
    return fig


def block_size_sweep_figure(df: pd.DataFrame) -> go.Figure:
    """Slack (% of allocated) against block-table entries, per block size."""
    fig = go.Figure()
    fig.add_trace(go.Bar(x=df["block_size"].astype(str), y=100 * df["slack_fraction"], name="slack (% of allocated)",
                         marker_color=SLACK_EDGE, yaxis="y"))
    fig.add_trace(go.Scatter(x=df["block_size"].astype(str), y=df["blocks"], name="block-table entries",
                             mode="lines+markers", line=dict(color=FILLED), yaxis="y2"))
    fig.update_layout(
        title="Block size: less slack means more block-table entries",
        xaxis=dict(title="block size (tokens)", type="category"),
        yaxis=dict(title="slack (% of allocated)", rangemode="tozero"),
        yaxis2=dict(title="block-table entries", overlaying="y", side="right", type="log"),
        margin=dict(l=10, r=10, t=60, b=40), legend=dict(orientation="h", y=-0.25),
    )
    return fig


def capacity_figure(plan: CapacityPlan) -> go.Figure:
    """One horizontal stacked bar: weights, reserve, KV blocks, rounding, headroom."""
    kv_used = plan.num_blocks * plan.block_bytes
    parts = [
        ("weights", plan.weights_bytes, "#495057"),
        ("activation/overhead reserve", plan.reserve_bytes, "#adb5bd"),
        (f"KV cache: {plan.num_blocks:,} blocks", kv_used, FILLED),
        ("KV budget left over (< 1 block)", plan.kv_budget_bytes - kv_used, "#a5d8ff"),
        (f"held back (1 - utilization {plan.gpu_util:g})", plan.gpu_memory_bytes - plan.usable_bytes, EMPTY),
    ]
    fig = go.Figure()
    for name, nbytes, color in parts:
        fig.add_trace(go.Bar(y=["GPU memory"], x=[nbytes / GiB], name=name, orientation="h", marker_color=color,
                             hovertemplate=f"{name}: %{{x:.2f}} GiB<extra></extra>"))
    fig.update_layout(
        barmode="stack", title=f"{plan.model} on {plan.gpu} (tp {plan.tp}, per GPU)",
        xaxis_title="memory (GiB)", height=230, margin=dict(l=10, r=10, t=60, b=40),
        legend=dict(orientation="h", y=-0.6),
    )
    return fig
