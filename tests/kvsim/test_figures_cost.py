"""Cost figures: each is a titled, axis-labelled figure whose traces carry the sweep's data."""

from __future__ import annotations

import pandas as pd
import pytest

from kvsim.costmodel import CostModel, batch_sweep, compare_step_times, context_sweep, intensity_grid
from kvsim.figures.cost import (
    batch_cost_figure, context_cost_figure, rate_sweep_figure, roofline_figure,
    step_time_validation_figure,
)
from kvsim.gpus import get_gpu
from kvsim.spec import get_preset

MODEL = CostModel(get_preset("opt-13b"), get_gpu("a100-40gb"))
ASSUMED = MODEL.describe()


def _check_labels(fig):
    layout = fig.to_plotly_json()["layout"]
    assert "OPT-13B" in layout["title"]["text"] and "A100 40GB" in layout["title"]["text"]
    assert layout["xaxis"]["title"]["text"] and layout["yaxis"]["title"]["text"]
    return layout


def test_context_figure_bars_are_kv_gib():
    df = context_sweep(MODEL, [256, 2048], batch_size=2)
    fig = context_cost_figure(df, ASSUMED)
    _check_labels(fig)
    bars = fig.data[0]
    assert list(bars.y) == pytest.approx([2 * 256 * 819_200 / 2**30, 2 * 2048 * 819_200 / 2**30])
    share = fig.data[2]
    assert share.yaxis == "y2" and all(0 <= v <= 100 for v in share.y)


def test_batch_figure_marks_memory_and_ridge():
    df = batch_sweep(MODEL, [1, 4, 16], 512)
    fig = batch_cost_figure(df, ASSUMED, max_batch_in_memory=8, ridge_batch=300.0)
    _check_labels(fig)
    assert list(fig.data[0].y) == pytest.approx(df["throughput_tokens_per_s"].tolist())
    assert list(fig.data[1].y) == pytest.approx((1e3 * df["step_time_s"]).tolist())
    markers = {t.name: list(t.x) for t in fig.data[2:]}
    assert markers == {"KV memory full at batch 8": [8, 8], "step compute-bound from batch ~300": [300.0, 300.0]}


def test_roofline_points_never_above_the_roof():
    grid = intensity_grid(MODEL, [1, 16, 256, 4096], [128, 2048])
    fig = roofline_figure(grid, MODEL.ridge_point, MODEL.bandwidth_bytes_per_s, MODEL.flops_per_s, ASSUMED)
    _check_labels(fig)
    points = [t for t in fig.data if t.name.startswith("decode")]
    assert len(points) == 2
    for trace in points:
        for x, y in zip(trace.x, trace.y):
            roof = min(x * MODEL.bandwidth_bytes_per_s, MODEL.flops_per_s) / 1e12
            assert y <= roof * (1 + 1e-9)


def test_rate_sweep_figure_one_line_per_strategy():
    df = pd.DataFrame({"strategy": ["paged", "paged", "reserve-max", "reserve-max"],
                       "rate_per_s": [1.0, 2.0, 1.0, 2.0], "normalized_latency_s": [0.1, 0.2, 0.3, 5.0]})
    fig = rate_sweep_figure(df, ASSUMED, latency_bound_s=1.0)
    _check_labels(fig)
    assert [t.name for t in fig.data] == ["paged", "reserve-max", "latency bound 1 s/token"]
    assert list(fig.data[1].y) == [0.3, 5.0]


def test_validation_figure_draws_both_series():
    df = compare_step_times(MODEL, [{"decode_context": [10], "step_time_s": 0.02},
                                    {"decode_context": [10, 11], "step_time_s": 0.021}])
    fig = step_time_validation_figure(df, ASSUMED)
    _check_labels(fig)
    assert [t.name for t in fig.data] == ["measured", "cost model (roofline)"]
    assert list(fig.data[0].y) == pytest.approx([20.0, 21.0])
