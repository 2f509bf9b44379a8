"""The simulator's clock is the cost model's: step times, TTFT, TPOT and normalized latency
follow from the per-step model applied to the batches the scheduler forms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.costmodel import CostModel
from kvsim.gpus import get_gpu
from kvsim.ratesweep import unloaded_normalized_latency
from kvsim.simulate import simulate
from kvsim.spec import get_preset
from kvsim.workloads import workload_from_lengths

OPT13B = get_preset("opt-13b")
MODEL = CostModel(OPT13B, get_gpu("a100-40gb"))


def _prefill(n: int) -> float:
    return MODEL.step_cost(prefill_tokens=[n]).time_s


def _decode(*contexts: int) -> float:
    return MODEL.step_cost(decode_context=list(contexts)).time_s


def test_lone_request_latencies_are_its_steps():
    """P=100, O=4 alone: a prefill step of 100 tokens, then decodes at 101, 102, 103.
    TTFT is the prefill; TPOT the mean of the three decodes; normalized latency e2e / 4."""
    res = simulate(workload_from_lengths([100], [4], [0.0]), OPT13B, step_time_fn=MODEL, num_blocks=100)
    steps = [_prefill(100), _decode(101), _decode(102), _decode(103)]
    assert res.timeline["step_time_s"].tolist() == pytest.approx(steps, rel=1e-12)
    assert res.timeline["time_s"].tolist() == pytest.approx(np.cumsum(steps).tolist(), rel=1e-12)
    lat = res.summary.latency
    assert lat["ttft_p50_s"] == pytest.approx(steps[0], rel=1e-12)
    assert lat["tpot_p50_s"] == pytest.approx(sum(steps[1:]) / 3, rel=1e-12)
    assert lat["normalized_latency_p50_s"] == pytest.approx(sum(steps) / 4, rel=1e-12)
    assert lat["throughput_tokens_per_s"] == pytest.approx(4 / sum(steps), rel=1e-12)
    assert unloaded_normalized_latency(MODEL, 100, 4) == pytest.approx(sum(steps) / 4, rel=1e-12)


def test_a_late_arrival_waits_for_the_clock():
    """Request B (P=50, O=3) arrives at 30 ms, during A's second step (A: P=100, O=4).
    It is admitted in the step after (its prefill batched with A's decode at 102), then
    decodes beside A (contexts 103 and 51), then alone (52)."""
    w = workload_from_lengths([100, 50], [4, 3], [0.0, 0.030])
    res = simulate(w, OPT13B, step_time_fn=MODEL, num_blocks=1000)
    s0, s1 = _prefill(100), _decode(101)
    assert s0 + s1 > 0.030 > s0  # B arrives while step 1 runs
    s2 = MODEL.step_cost(prefill_tokens=[50], decode_context=[102]).time_s
    s3, s4 = _decode(103, 51), _decode(52)
    assert res.timeline["step_time_s"].tolist() == pytest.approx([s0, s1, s2, s3, s4], rel=1e-12)
    req = res.requests.set_index("request")
    assert req.loc[1, "ttft_s"] == pytest.approx(s0 + s1 + s2 - 0.030, rel=1e-12)
    assert req.loc[1, "e2e_s"] == pytest.approx(s0 + s1 + s2 + s3 + s4 - 0.030, rel=1e-12)
    assert req.loc[0, "normalized_latency_s"] == pytest.approx((s0 + s1 + s2 + s3) / 4, rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 1000), strategy=st.sampled_from(["paged", "reserve-max", "oracle"]))
def test_every_step_is_the_model_applied_to_its_batch(n, seed, strategy):
    """Random small workloads: each recorded step time is the model's time for the batch
    the scheduler handed it; no request starts before it arrives."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 300, n).tolist()
    outputs = rng.integers(1, 40, n).tolist()
    arrivals = np.sort(rng.uniform(0, 0.3, n)).tolist()
    seen: list[tuple] = []

    def fn(batch):
        t = MODEL(batch)
        seen.append((batch.prefill_tokens.tolist(), batch.prefill_cached_tokens.tolist(),
                     batch.decode_context_lens.tolist(), t))
        return t

    res = simulate(workload_from_lengths(prompts, outputs, arrivals), OPT13B, strategy=strategy,
                   step_time_fn=fn, num_blocks=64, max_len=400)
    tl = res.timeline
    assert len(seen) == len(tl)
    for (q, p, c, t), recorded in zip(seen, tl["step_time_s"].tolist()):
        assert recorded == pytest.approx(MODEL.step_cost(prefill_tokens=q, prefill_cached=p, decode_context=c).time_s,
                                         rel=1e-12, abs=1e-15)
        assert recorded == pytest.approx(t, rel=1e-12, abs=1e-15)
    assert tl["time_s"].is_monotonic_increasing
    req = res.requests
    done = req[req["finish_step"] >= 0]
    starts = tl["time_s"].to_numpy() - tl["step_time_s"].to_numpy()
    first_start = starts[done["first_step"].to_numpy()]
    assert (first_start >= done["arrival_s"].to_numpy() - 1e-12).all()
