"""Strategies figures carry the simulator's numbers: stacks add up to the capacity, the
paper's Figure 2 numbers sit beside ours, downsampling keeps averages."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.figures.strategies import (
    activity_figure, block_size_sweep_figure, downsample_timeline, fraction_figure, memory_breakdown_figure,
    summary_frame,
)
from kvsim.simulate import run_strategies, sweep_block_sizes
from kvsim.spec import get_preset
from kvsim.units import GiB
from kvsim.workloads import preset_workload, workload_from_lengths

SPEC = get_preset("opt-13b")


@pytest.fixture(scope="module")
def runs():
    wl = preset_workload("sharegpt-like", 60, max_len=2048, seed=3)
    return run_strategies(wl, SPEC, ("reserve-max", "pow2", "oracle", "paged", "paged+prefix"),
                          kv_memory_bytes=3 * GiB, max_len=2048)


def _hand_timeline(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(n)
    parts = rng.integers(0, 1000, size=(n, 4))
    cap = 5000
    return pd.DataFrame({
        "step": np.arange(n), "time_s": np.arange(n, dtype=float), "running": rng.integers(0, 9, n),
        "live_bytes": parts[:, 0], "reserved_bytes": parts[:, 1], "internal_frag_bytes": parts[:, 2],
        "external_frag_bytes": parts[:, 3], "free_bytes": cap - parts.sum(axis=1),
        "capacity_bytes": np.full(n, cap), "preemptions": np.cumsum(rng.integers(0, 2, n)),
        "prefix_hit_blocks": np.zeros(n, int), "prefix_query_blocks": np.zeros(n, int),
    })


def test_stacks_add_up_to_capacity(runs):
    fig = memory_breakdown_figure({lb: r.timeline for lb, r in runs.items()}, "assumed")
    for label, res in runs.items():
        traces = [t for t in fig.data if t.meta == label]
        assert [t.name for t in traces] == ["token states", "reservation", "internal fragmentation",
                                            "external fragmentation", "free"]
        total = np.sum([np.asarray(t.y, dtype=float) for t in traces], axis=0)
        cap = res.summary.capacity_bytes / GiB
        assert np.allclose(total, cap, rtol=1e-9)
    assert fig.layout.title.text.startswith("Where the KV memory goes")
    assert fig.layout.yaxis.title.text == "KV memory (GiB)"
    assert "engine step" in fig.layout["xaxis5"].title.text
    # one legend entry per category, not per panel
    assert sum(1 for t in fig.data if t.showlegend is not False) == 5


def test_summary_table_puts_the_papers_numbers_beside_ours(runs):
    summaries = {lb: r.summary.to_dict() for lb, r in runs.items()}
    table = summary_frame(summaries).set_index("strategy")
    paper = table["paper Fig. 2 token states (%)"]
    assert paper["reserve-max"] == 20.4 and paper["pow2"] == 26.8 and paper["oracle"] == 38.2
    assert paper["paged"] == 96.3 and pd.isna(paper["paged+prefix"])
    for lb, s in summaries.items():
        assert table.loc[lb, "token states (%)"] == round(100 * s["token_state_fraction"], 1)
        assert table.loc[lb, "preemptions"] == s["preemptions"]
        parts = table.loc[lb, ["token states (%)", "reservation (%)", "internal frag (%)", "external frag (%)"]]
        assert abs(parts.sum() - 100) < 0.3  # four rounded shares of one whole
    assert pd.isna(table.loc["paged", "prefix hit rate (%)"]) and not pd.isna(table.loc["paged+prefix", "prefix hit rate (%)"])
    fig = fraction_figure(summary_frame(summaries), "assumed")
    diamonds = [t for t in fig.data if t.name == "paper Fig. 2: token states"][0]
    assert dict(zip(diamonds.y, diamonds.x)) == {"reserve-max": 20.4, "pow2": 26.8, "oracle": 38.2, "paged": 96.3}
    assert fig.layout.xaxis.title.text == "share of KV memory in use (%)"


def test_block_size_sweep_figure_plots_the_sweep():
    wl = workload_from_lengths([100, 37, 250], [50, 80, 20])
    sweep = sweep_block_sizes(wl, SPEC, (1, 16, 64), kv_memory_bytes=GiB, max_len=2048)
    fig = block_size_sweep_figure(sweep, "assumed", current_block_size=16)
    token = [t for t in fig.data if t.name == "token states (%)"][0]
    assert list(token.x) == ["1", "16", "64"]
    # block size 1 wastes nothing; larger blocks leave more empty slots in each last block
    assert token.y[0] == pytest.approx(100.0)
    assert token.y[2] < token.y[1] < token.y[0]
    assert fig.layout.xaxis.type == "category" and fig.layout.xaxis2.type == "category"
    assert "block size" in fig.layout.xaxis2.title.text


def test_activity_shows_prefix_row_only_with_lookups(runs):
    with_prefix = activity_figure({lb: r.timeline for lb, r in runs.items()}, "assumed")
    assert any("hit rate" in (a.text or "") for a in with_prefix.layout.annotations)
    rates = [t for t in with_prefix.data if t.yaxis == "y3"]
    assert [t.name for t in rates] == ["paged+prefix"]
    assert all(0 <= v <= 100 for v in rates[0].y if v is not None and v == v)
    without = activity_figure({"paged": runs["paged"].timeline}, "assumed")
    assert not any("hit rate" in (a.text or "") for a in without.layout.annotations)
    last = [t for t in without.data if t.yaxis == "y2"][0].y[-1]
    assert last == runs["paged"].summary.preemptions


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.integers(10, 500))
def test_downsampling_keeps_means_and_final_counters(n, max_points):
    tl = _hand_timeline(n)
    out = downsample_timeline(tl, max_points)
    assert len(out) <= max_points
    if n <= max_points:
        assert out is tl
        return
    k = -(-n // max_points)
    full_bins = n // k
    # bins of k steps average their bytes: the weighted mean of bin means is the mean
    sizes = np.full(len(out), k)
    sizes[-1] = n - (len(out) - 1) * k
    assert len(out) == full_bins + (n % k > 0)
    assert np.dot(out["live_bytes"], sizes) / n == pytest.approx(tl["live_bytes"].mean())
    assert out["preemptions"].iloc[-1] == tl["preemptions"].iloc[-1]
    assert (np.diff(out["step"]) > 0).all()
