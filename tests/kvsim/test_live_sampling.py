"""Parallel sampling in the live engine: a request of n samples is prefilled once, forked
n - 1 times (every prompt block shared), and copy-on-write copies the shared, partly filled
last prompt block at each sample's first append.

Expected byte counts are computed by hand from the tiny model's sizes, never read back
from the code under test.
"""

from __future__ import annotations

import math

import pytest

from kvsim.calculator import kv_usage
from kvsim.errors import KvsimError
from kvsim.live import EngineConfig, LiveModelConfig, LiveSettings, run_live
from kvsim.live.engine import predicted_group_usage
from kvsim.live.requests import make_workload
from kvsim.workloads import synthetic_workload

TINY = LiveModelConfig(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                       intermediate_size=128, vocab_size=256, seed=3)
BPT = 2 * 2 * 2 * 16 * 4  # bytes per token: layers x (K, V) x KV heads x head_dim x fp32 = 512
B = 8


def _settings(**engine) -> LiveSettings:
    return LiveSettings(model=TINY, engine=EngineConfig(**{"num_blocks": 64, "block_size": B, "check_every": 2,
                                                           **engine}), max_len=64)


def _agree(tl):
    assert (tl["measured_kv_bytes"] == tl["predicted_kv_bytes"]).all()
    assert (tl["live_bytes"] == tl["predicted_live_bytes"]).all()


def test_three_samples_share_the_prompt_and_copy_on_write():
    n, P, O = 3, 21, 10  # 21 = 2 full blocks of 8 + 5 tokens in a partly filled block
    r = run_live(synthetic_workload(1, f"fixed:{P}", f"fixed:{O}", num_samples=n, seed=2), _settings())
    tl, s = r.paged.timeline, r.summary
    _agree(tl)
    # one copy per sample but the last, which keeps the original partial block
    assert s["cow_copies"] == n - 1
    assert s["tokens_match"] is True and s["max_abs_error"] < 1e-4
    samples = r.paged.samples[0]
    assert len(samples) == n and all(len(t) == O for t in samples)
    assert len(set(samples)) == n  # the samples diverge
    assert r.paged.outputs[0] == samples[0]
    assert s["output_tokens"] == n * O and s["finished"] == 1
    # after the prefill and the fork: one physical copy of the prompt, partial block not yet copied
    first, second = tl.iloc[0], tl.iloc[1]
    assert first["running"] == n
    assert first["measured_kv_bytes"] == math.ceil(P / B) * B * BPT
    assert first["live_bytes"] == P * BPT
    # after the first decode: 2 shared full blocks + one partial block per sample (5 prompt + 1 new)
    assert second["measured_kv_bytes"] == (P // B + n) * B * BPT
    assert second["live_bytes"] == (P // B * B + n * (P % B + 1)) * BPT
    # against three independent requests of the same lengths (other prompt tokens, nothing shared):
    # the peak is lower by the prompt's full blocks stored once instead of three times
    indep = run_live(synthetic_workload(n, f"fixed:{P}", f"fixed:{O}", seed=2), _settings())
    _agree(indep.paged.timeline)
    assert indep.summary["cow_copies"] == 0
    saving = (n - 1) * (P // B) * B * BPT
    assert indep.summary["measured_peak_kv_bytes"] - s["measured_peak_kv_bytes"] == saving
    # the contiguous baseline reserves max_len per sample
    assert r.contiguous.timeline.iloc[0]["measured_kv_bytes"] == n * 64 * BPT
    # sample 0 is greedy: what a one-sample run of the same request decodes
    one = run_live(synthetic_workload(1, f"fixed:{P}", f"fixed:{O}", seed=2), _settings())
    assert one.paged.outputs[0] == samples[0]


def test_a_prompt_of_whole_blocks_needs_no_copy():
    r = run_live(synthetic_workload(2, "fixed:16", "fixed:5", num_samples=3, seed=4), _settings())
    assert r.summary["cow_copies"] == 0
    _agree(r.paged.timeline)
    assert r.summary["tokens_match"] is True


def test_preempted_samples_restart_from_the_prompt_and_still_agree():
    w = synthetic_workload(4, "uniform:9:20", "uniform:8:14", num_samples=3, seed=7)
    # the largest request alone needs at most 2 + 3 x (5 - 2) = 11 blocks; 13 blocks cannot hold two
    r = run_live(w, _settings(num_blocks=13, max_num_seqs=6, check_every=3))
    s = r.summary
    assert s["preemptions"] > 0 and s["cow_copies"] > 0
    assert s["finished"] == 4
    assert all(len(t) == req.output_tokens for i, req in enumerate(w.requests) for t in r.paged.samples[i])
    _agree(r.paged.timeline)
    assert s["tokens_match"] is True and s["max_abs_error"] < 1e-4
    assert r.paged.timeline["running"].max() <= 6


@pytest.mark.parametrize("block, n, prefix, caching, seed", [
    (4, 2, 0, True, 1), (8, 3, 13, True, 2), (8, 4, 13, False, 3), (16, 2, 5, True, 4),
])
def test_small_runs_agree_step_by_step(block, n, prefix, caching, seed):
    w = synthetic_workload(4, "uniform:1:20", "uniform:1:10", num_samples=n, seed=seed, system_prompt_tokens=prefix)
    r = run_live(w, _settings(block_size=block, max_num_seqs=8, enable_prefix_caching=caching, check_every=3))
    _agree(r.paged.timeline)
    assert r.summary["finished"] == 4 and r.summary["tokens_match"] is True


def test_prediction_of_forked_groups_by_hand():
    spec = TINY.to_spec()
    kw = dict(kv_dtype="fp32", block_size=B)
    # three samples still at the fork length are one sequence: 3 blocks, 21 tokens
    assert predicted_group_usage(spec, [(21, [21, 21, 21])], **kw) == (21 * BPT, 3 * B * BPT)
    # after one token each: 2 shared full blocks + 3 private partial blocks; 16 + 3 x 6 tokens
    assert predicted_group_usage(spec, [(21, [22, 22, 22])], **kw) == (34 * BPT, 5 * B * BPT)
    # two requests of 2 samples each, sharing a 9-token system prompt (one full block) across requests
    live, alloc = predicted_group_usage(spec, [(12, [13, 13]), (20, [21, 21])], shared_prefix_len=9, **kw)
    blocks = (1 + 2 * 1) + (2 + 2 * 1) - 1
    tokens = (8 + 2 * 5) + (16 + 2 * 5) - 8
    assert (live, alloc) == (tokens * BPT, blocks * B * BPT)
    # one-sample requests reduce to the calculator with a shared prefix
    u = kv_usage(spec, [13, 30, 7], shared_prefix_len=5, **kw)
    assert predicted_group_usage(spec, [(13, [13]), (30, [30]), (7, [7])], shared_prefix_len=5, **kw) == (
        u.live_bytes, u.allocated_bytes)


def test_bad_samples_are_caller_errors():
    with pytest.raises(KvsimError, match="samples per request"):
        make_workload(num_samples=0)
    with pytest.raises(KvsimError, match="max running sequences is 2"):
        run_live(synthetic_workload(1, "fixed:5", "fixed:3", num_samples=3), _settings(max_num_seqs=2))
    with pytest.raises(KvsimError, match="x 3 samples"):
        run_live(synthetic_workload(1, "fixed:20", "fixed:10", num_samples=3), _settings(num_blocks=6))
