"""Figures for the Block table page: a paged KV pool, one :class:`~kvsim.scenario.PoolSnapshot`
at a time.

- :func:`block_grid_figure`: the physical blocks as a grid of cells, each coloured by the
  sequence(s) whose block table points at it (a block shared by k sequences is split into
  k vertical stripes, outlined, and labelled ``ref k``), a fill bar and ``n/B`` for the
  token slots written, free blocks blank, free blocks that still hold a cached prefix
  hatched grey, and the copy-on-write copies of the event drawn as arrows ``src -> dst``.
- :func:`block_table_figure`: each sequence's logical-to-physical table as a row of cells
  (logical block i -> physical id), in the sequence's colour.
- :func:`block_table_frame`: the same tables as plain rows, for a data table and tests.

Colours come from :func:`owner_colors` over the whole story, so a sequence keeps its
colour from step to step. Every cell trace carries ``customdata`` (block id, owners, ref
count, filled slots, cached) so tests read what a cell shows.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from kvsim.scenario import BlockCell, PoolSnapshot

#: Sequence colours, handed out in order of first appearance (colour-blind friendly set).
OWNER_PALETTE = ("#2f6db5", "#e8590c", "#7048e8", "#2b8a3e", "#c2255c", "#1098ad", "#e67700", "#5c940d")
FREE_FILL = "#ffffff"
CACHED_FILL = "#dee2e6"
EDGE = "#868e96"
SHARED_EDGE = "#212529"
COW_COLOR = "#e03131"
_GAP = 0.1  # blank space between cells, in cell widths


def owner_colors(snapshots: Sequence[PoolSnapshot]) -> dict[str, str]:
    """Sequence name -> colour, in order of first appearance over all ``snapshots``."""
    names: list[str] = []
    for snap in snapshots:
        for name in list(snap.tables) + [o for c in snap.blocks for o in c.owners]:
            if name not in names:
                names.append(name)
    return {n: OWNER_PALETTE[i % len(OWNER_PALETTE)] for i, n in enumerate(names)}


def grid_shape(num_blocks: int) -> tuple[int, int]:
    """(rows, columns) of the grid: square-ish, columns first (16 blocks -> 4 x 4)."""
    cols = max(1, math.ceil(math.sqrt(num_blocks)))
    return math.ceil(num_blocks / cols), cols


def _cell_origin(block_id: int, cols: int) -> tuple[float, float]:
    """Top-left corner of a block's cell; rows grow downwards (the y axis is reversed)."""
    return float(block_id % cols), float(block_id // cols)


def _rect(x0: float, y0: float, x1: float, y1: float) -> tuple[list, list]:
    return [x0, x1, x1, x0, x0, None], [y0, y0, y1, y1, y0, None]


def _cell_state(cell: BlockCell) -> str:
    if cell.ref_count > 1:
        return "shared"
    if cell.owners:
        return "owned"
    return "free, cached" if cell.cached else "free"


def _cell_text(cell: BlockCell, block_size: int) -> str:
    lines = [f"<b>#{cell.block_id}</b>"]
    if cell.owners:
        lines.append(", ".join(cell.owners))
        lines.append(f"{cell.filled}/{block_size}" + (f" · ref {cell.ref_count}" if cell.ref_count > 1 else ""))
    elif cell.cached:
        lines.append("cached")
        lines.append("free")
    else:
        lines.append("free")
    return "<br>".join(lines)


def block_grid_figure(snap: PoolSnapshot, colors: Mapping[str, str], *, title: str | None = None) -> go.Figure:
    """The physical pool of ``snap`` as a grid (see the module docstring)."""
    rows, cols = grid_shape(snap.num_blocks)
    w = 1.0 - _GAP
    fig = go.Figure()
    # 1. cell fills: one trace per sequence (stripes of shared blocks included), plus free / cached
    fills: dict[str, tuple[list, list, list]] = {}
    for cell in snap.blocks:
        x0, y0 = _cell_origin(cell.block_id, cols)
        if cell.owners:
            k = len(cell.owners)
            for j, owner in enumerate(cell.owners):
                xs, ys = _rect(x0 + j * w / k, y0, x0 + (j + 1) * w / k, y0 + w)
                f = fills.setdefault(owner, ([], [], []))
                f[0].extend(xs), f[1].extend(ys), f[2].append(cell.block_id)
        else:
            key = "free, cached" if cell.cached else "free"
            xs, ys = _rect(x0, y0, x0 + w, y0 + w)
            f = fills.setdefault(key, ([], [], []))
            f[0].extend(xs), f[1].extend(ys), f[2].append(cell.block_id)
    order = [n for n in colors if n in fills] + [n for n in fills if n not in colors and n not in ("free", "free, cached")]
    for name in order + [n for n in ("free, cached", "free") if n in fills]:
        xs, ys, ids = fills[name]
        if name == "free":
            color, line, legend = FREE_FILL, dict(color=EDGE, width=1), "free"
        elif name == "free, cached":
            color, line, legend = CACHED_FILL, dict(color=EDGE, width=1, dash="dot"), "free, still cached"
        else:
            color, line, legend = colors.get(name, EDGE), dict(color="white", width=1), f"sequence {name}"
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", fill="toself", fillcolor=color, line=line, name=legend,
            customdata=ids, hoverinfo="skip", legendgroup=name,
        ))
    # 2. outlines of shared blocks and the fill bars (token slots written)
    shared_x, shared_y, bar_x, bar_y = [], [], [], []
    for cell in snap.blocks:
        x0, y0 = _cell_origin(cell.block_id, cols)
        if cell.ref_count > 1:
            xs, ys = _rect(x0, y0, x0 + w, y0 + w)
            shared_x += xs
            shared_y += ys
        if cell.owners or cell.cached:
            frac = min(1.0, cell.filled / snap.block_size)
            xs, ys = _rect(x0 + 0.06, y0 + w - 0.16, x0 + 0.06 + (w - 0.12) * frac, y0 + w - 0.08)
            bar_x += xs
            bar_y += ys
    if shared_x:
        fig.add_trace(go.Scatter(x=shared_x, y=shared_y, mode="lines", name="shared (ref count > 1)",
                                 line=dict(color=SHARED_EDGE, width=4), hoverinfo="skip"))
    if bar_x:
        fig.add_trace(go.Scatter(x=bar_x, y=bar_y, mode="lines", fill="toself", fillcolor="rgba(0,0,0,0.55)",
                                 line=dict(width=0), name="token slots written", hoverinfo="skip"))
    # 3. labels and hover, one point per block
    cells = sorted(snap.blocks, key=lambda c: c.block_id)
    fig.add_trace(go.Scatter(
        x=[_cell_origin(c.block_id, cols)[0] + w / 2 for c in cells],
        y=[_cell_origin(c.block_id, cols)[1] + w * 0.42 for c in cells],
        mode="text", text=[_cell_text(c, snap.block_size) for c in cells], name="blocks", showlegend=False,
        textfont=dict(size=13, color=["white" if c.owners else "#495057" for c in cells]),
        customdata=[[c.block_id, ", ".join(c.owners), c.ref_count, c.filled, c.cached, _cell_state(c)] for c in cells],
        hovertemplate="physical block %{customdata[0]}<br>owners: %{customdata[1]}<br>ref count %{customdata[2]}"
                      f"<br>slots written %{{customdata[3]}}/{snap.block_size}<br>cached %{{customdata[4]}}<extra></extra>",
    ))
    # 4. copy-on-write arrows src -> dst, and a red outline on the copy
    for src, dst in snap.copies:
        sx, sy = _cell_origin(src, cols)
        dx, dy = _cell_origin(dst, cols)
        fig.add_annotation(x=dx + w / 2, y=dy + w / 2, ax=sx + w / 2, ay=sy + w / 2, xref="x", yref="y",
                           axref="x", ayref="y", showarrow=True, arrowhead=3, arrowwidth=3, arrowcolor=COW_COLOR,
                           standoff=38, startstandoff=38, text="", name=f"copy-on-write {src}->{dst}")
        xs, ys = _rect(dx - 0.03, dy - 0.03, dx + w + 0.03, dy + w + 0.03)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=COW_COLOR, width=4),
                                 name=f"copy-on-write {src} -> {dst}", hoverinfo="skip"))
    fig.update_layout(
        title=dict(text=title or f"Physical KV blocks ({snap.num_blocks} x {snap.block_size} token slots)",
                   x=0.01, xanchor="left"),
        plot_bgcolor="white", height=190 + 105 * rows, margin=dict(l=10, r=10, t=40, b=10),
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.08, yanchor="top"),
        xaxis=dict(title=f"physical block id = {cols} x row + column", range=[-0.1, cols], showticklabels=False,
                   showgrid=False, zeroline=False, fixedrange=True),
        yaxis=dict(title="", range=[rows, -0.1], showticklabels=False, showgrid=False, zeroline=False,
                   fixedrange=True, scaleanchor="x", scaleratio=1),
    )
    return fig


def block_table_frame(snap: PoolSnapshot) -> pd.DataFrame:
    """One row per (sequence, logical block): its physical block, slots written, ref count."""
    cells = {c.block_id: c for c in snap.blocks}
    rows = []
    for name, table in snap.tables.items():
        tokens = snap.tokens.get(name, 0)
        for logical, physical in enumerate(table):
            cell = cells[physical]
            slots = max(0, min(snap.block_size, tokens - logical * snap.block_size))
            rows.append({"sequence": name, "logical block": logical, "physical block": physical,
                         "slots written": slots, "ref count": cell.ref_count, "shared": cell.ref_count > 1})
    return pd.DataFrame(rows, columns=["sequence", "logical block", "physical block", "slots written",
                                       "ref count", "shared"])


def block_table_figure(snap: PoolSnapshot, colors: Mapping[str, str], *, min_logical: int = 4) -> go.Figure:
    """Each sequence's block table as a row of cells: logical block i -> physical id.

    Shared entries are outlined and say ``ref k``; the number of slots written is in each
    cell. The x axis is the logical block index (tokens ``[i*B, (i+1)*B)``).
    """
    df = block_table_frame(snap)
    names = list(snap.tables)
    width = max([min_logical] + [len(t) for t in snap.tables.values()])
    fig = go.Figure()
    w = 1.0 - _GAP
    for r, name in enumerate(names):
        sub = df[df["sequence"] == name]
        xs, ys = [], []
        for lg in sub["logical block"]:
            rx, ry = _rect(lg, r, lg + w, r + w)
            xs += rx
            ys += ry
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", fill="toself", fillcolor=colors.get(name, EDGE),
                                 line=dict(color="white", width=1), name=f"{name} ({snap.tokens.get(name, 0)} tokens)",
                                 hoverinfo="skip", customdata=sub["physical block"].tolist(), showlegend=False))
        sx, sy = [], []
        for lg, shared in zip(sub["logical block"], sub["shared"]):
            if shared:
                rx, ry = _rect(lg, r, lg + w, r + w)
                sx += rx
                sy += ry
        if sx:
            fig.add_trace(go.Scatter(x=sx, y=sy, mode="lines", line=dict(color=SHARED_EDGE, width=4),
                                     hoverinfo="skip", showlegend=False, name=f"{name} shared"))
    if len(df):
        fig.add_trace(go.Scatter(
            x=(df["logical block"] + w / 2).tolist(),
            y=[names.index(s) + w / 2 for s in df["sequence"]],
            mode="text", name="entries", showlegend=False, textfont=dict(color="white", size=13),
            text=[f"<b>→ {p}</b><br>{n}/{snap.block_size}" + (f" · ref {k}" if k > 1 else "")
                  for p, n, k in zip(df["physical block"], df["slots written"], df["ref count"])],
            customdata=df[["sequence", "logical block", "physical block", "slots written", "ref count"]].values.tolist(),
            hovertemplate="%{customdata[0]}: logical %{customdata[1]} -> physical %{customdata[2]}"
                          "<br>slots written %{customdata[3]}<br>ref count %{customdata[4]}<extra></extra>",
        ))
    fig.update_layout(
        title=dict(text="Block tables: logical block -> physical block", x=0.01, xanchor="left"),
        plot_bgcolor="white", height=150 + 80 * max(1, len(names)), margin=dict(l=10, r=10, t=40, b=10),
        xaxis=dict(title=f"logical block index (tokens i x {snap.block_size} .. (i+1) x {snap.block_size} - 1)",
                   range=[-0.1, width], tickmode="array", tickvals=[i + w / 2 for i in range(width)],
                   ticktext=[str(i) for i in range(width)], showgrid=False, zeroline=False, fixedrange=True),
        yaxis=dict(title="sequence", range=[max(1, len(names)), -0.1], tickmode="array",
                   tickvals=[r + w / 2 for r in range(len(names))],
                   ticktext=[f"{n} ({snap.tokens.get(n, 0)} tok)" for n in names], showgrid=False, zeroline=False,
                   fixedrange=True),
    )
    if not names:
        fig.add_annotation(x=width / 2, y=0.5, text="no sequences in the pool", showarrow=False,
                           font=dict(size=14, color="#495057"))
    return fig


__all__ = ["owner_colors", "grid_shape", "block_grid_figure", "block_table_frame", "block_table_figure",
           "OWNER_PALETTE"]
