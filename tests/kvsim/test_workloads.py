"""Workloads: length distributions, presets' means, arrivals, sharing options, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.errors import KvsimError
from kvsim.workloads import (
    PRESET_WORKLOADS, LengthDist, Request, Workload, parse_arrivals, parse_length_dist, poisson_arrivals,
    preset_workload, synthetic_workload, workload_from_lengths,
)


def test_parse_length_specs():
    assert parse_length_dist("512") == LengthDist("fixed", 512)
    assert parse_length_dist("uniform:1:10") == LengthDist("uniform", 1, 10)
    assert parse_length_dist("lognormal:161.31:1") == LengthDist("lognormal", 161.31, 1.0)
    for bad in ("", "abc", "uniform:5", "uniform:9:3", "fixed:0", "lognormal:0.5:1", "fixed:2.5", "normal:1:2"):
        with pytest.raises(KvsimError):
            parse_length_dist(bad)


def test_fixed_and_uniform_samples():
    rng = np.random.default_rng(0)
    assert (LengthDist("fixed", 7).sample(rng, 5) == 7).all()
    u = LengthDist("uniform", 3, 5).sample(rng, 2000)
    assert set(np.unique(u)) == {3, 4, 5}


@pytest.mark.parametrize("key,mean_in,mean_out", [("sharegpt-like", 161.31, 337.99), ("alpaca-like", 19.31, 58.45)])
def test_presets_have_the_papers_means(key, mean_in, mean_out):
    p = PRESET_WORKLOADS[key]
    rng = np.random.default_rng(123)
    # sample means of 400k draws: standard error well under 1 %
    assert p.prompt.sample(rng, 400_000).mean() == pytest.approx(mean_in, rel=0.015)
    assert p.output.sample(rng, 400_000).mean() == pytest.approx(mean_out, rel=0.015)


def test_max_len_redraws_long_pairs():
    w = preset_workload("sharegpt-like", 3000, max_len=512, seed=1)
    assert all(r.prompt_tokens + r.output_tokens - 1 <= 512 for r in w.requests)
    assert w.stats()["max_final_len"] <= 512


def test_poisson_arrivals_rate_and_order():
    t = poisson_arrivals(20000, 4.0, seed=3)
    assert (np.diff(t) >= 0).all()
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    w = synthetic_workload(100, "10", "5", arrivals="poisson:2", seed=0)
    assert w.timed and w.requests[-1].arrival_s > 0
    assert all(r.arrival_s == 0 for r in synthetic_workload(5, "10", "5").requests)


def test_parse_arrivals():
    assert parse_arrivals("trace") == ("trace", None)
    assert parse_arrivals("all-at-once") == ("all-at-once", None)
    assert parse_arrivals("poisson:2.5") == ("poisson", 2.5)
    for bad in ("poisson:", "poisson:-1", "poisson:nan", "sometimes"):
        with pytest.raises(KvsimError):
            parse_arrivals(bad)


def test_sharing_options_and_system_prompt():
    w = synthetic_workload(10, "20", "5", num_samples=4, system_prompt_tokens=64)
    assert all(r.num_seqs == 4 and r.prompt_tokens == 84 and r.shared_prefix_tokens == 64 for r in w.requests)
    b = synthetic_workload(3, "20", "5", beam_width=3)
    assert all(r.num_seqs == 3 and r.beam_width == 3 for r in b.requests)
    with pytest.raises(KvsimError):
        synthetic_workload(3, "20", "5", beam_width=2, num_samples=2)
    with pytest.raises(KvsimError):
        synthetic_workload(0, "20", "5")


def test_workload_validation():
    with pytest.raises(KvsimError, match="no requests"):
        Workload("w", ())
    with pytest.raises(KvsimError, match="arrives before"):
        Workload("w", (Request(1.0, 2, 2), Request(0.5, 2, 2)))
    with pytest.raises(KvsimError, match="at least 1"):
        Workload("w", (Request(0.0, 0, 2),))


def test_limit_and_frame():
    w = workload_from_lengths([1, 2, 3], [4, 5, 6])
    assert len(w.limit(2)) == 2 and len(w.limit(None)) == 3
    with pytest.raises(KvsimError):
        w.limit(0)
    df = w.to_frame()
    assert df["prompt_tokens"].tolist() == [1, 2, 3] and df["num_seqs"].tolist() == [1, 1, 1]
    assert Request(0.0, 10, 5).final_len == 14
    assert math.isclose(w.stats()["mean_output_tokens"], 5.0)
