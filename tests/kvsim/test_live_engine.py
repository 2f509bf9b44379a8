"""The live engine's must-shows, on the CPU with a tiny model:

- measured KV (counted from the poisoned tensor) equals the calculator's prediction at
  every step, also when a too-small pool preempts; a leaked block or a missed poison shows;
- paged attention equals attention on contiguous K/V, and the paged engine's greedy tokens
  equal the contiguous engine's;
- a shared prompt prefix lowers the measured KV by what the calculator says it saves.

Expected byte counts are computed by hand here from the model's sizes, never read back
from the code under test.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvsim.calculator import kv_usage
from kvsim.errors import KvsimError
from kvsim.live import EngineConfig, LiveModel, LiveModelConfig, LiveSettings, PagedEngine, run_live
from kvsim.live.contiguous import ContiguousEngine
from kvsim.live.requests import prepare_requests
from kvsim.workloads import synthetic_workload, workload_from_lengths

TINY = LiveModelConfig(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                       intermediate_size=128, vocab_size=256, seed=3)
BPT = 2 * 2 * 2 * 16 * 4  # bytes per token: layers x (K, V) x KV heads x head_dim x fp32 = 512


def _settings(**engine) -> LiveSettings:
    return LiveSettings(model=TINY, engine=EngineConfig(**{"num_blocks": 64, "block_size": 8, "check_every": 2,
                                                           **engine}), max_len=128)


def _agree(tl):
    assert (tl["measured_kv_bytes"] == tl["predicted_kv_bytes"]).all()
    assert (tl["live_bytes"] == tl["predicted_live_bytes"]).all()


def test_step_zero_by_hand():
    prompts, outputs = [5, 8, 17, 30], [4, 6, 3, 9]
    w = workload_from_lengths(prompts, outputs)
    r = run_live(w, _settings(check_every=1))
    first = r.paged.timeline.iloc[0]
    assert first["live_bytes"] == sum(prompts) * BPT
    assert first["measured_kv_bytes"] == sum(math.ceil(p / 8) for p in prompts) * 8 * BPT
    _agree(r.paged.timeline)
    assert r.summary["tokens_match"] is True
    assert r.summary["max_abs_error"] < 1e-4
    assert r.summary["layers_agree"] is True
    assert {k: len(v) for k, v in r.paged.outputs.items()} == dict(enumerate(outputs))
    # the run ends empty: every block freed and poisoned, nothing retained without prefix hits
    assert r.paged.timeline.iloc[-1]["measured_kv_bytes"] == 0


def test_pool_too_small_preempts_and_still_agrees():
    w = synthetic_workload(10, "uniform:10:40", "uniform:10:30", seed=5)
    # the longest request is at most 69 tokens = 9 blocks of 8; 12 blocks hold barely one and a half
    r = run_live(w, _settings(num_blocks=12, max_num_seqs=6))
    s = r.summary
    assert s["preemptions"] > 0
    assert s["finished"] == 10 and len(r.paged.outputs) == 10
    assert all(len(r.paged.outputs[i]) == req.output_tokens for i, req in enumerate(w.requests))
    _agree(r.paged.timeline)
    assert s["tokens_match"] is True and s["max_abs_error"] < 1e-4
    assert r.paged.timeline["measured_kv_bytes"].max() <= 12 * 8 * BPT


def test_shared_prefix_saves_what_the_calculator_predicts():
    n, prefix, B = 6, 40, 8
    w = synthetic_workload(n, "fixed:12", "fixed:10", system_prompt_tokens=prefix, seed=1)
    shared = run_live(w, _settings(block_size=B))
    unshared = run_live(w, _settings(block_size=B, enable_prefix_caching=False))
    a, b = shared.paged.timeline, unshared.paged.timeline
    assert len(a) == len(b) and (a["running"] == b["running"]).all()
    _agree(a)
    _agree(b)
    saved = b["measured_kv_bytes"] - a["measured_kv_bytes"]
    # by hand: every running sequence but one stores the prefix's 40 // 8 = 5 full blocks once
    by_hand = (a["running"] - 1).clip(lower=0) * (prefix // B) * B * BPT
    assert (saved == by_hand).all() and saved.max() > 0
    # and it is the calculator's sharing_saved_bytes for the same lengths
    lens = [prefix + 12] * n
    assert saved.iloc[0] == kv_usage(TINY.to_spec(), lens, kv_dtype="fp32", block_size=B,
                                     shared_prefix_len=prefix).sharing_saved_bytes
    assert shared.summary["prefix_hit_blocks"] == (n - 1) * (prefix // B)
    assert shared.paged.outputs == unshared.paged.outputs  # sharing changes memory, not tokens


class _LeakyEngine(PagedEngine):
    """Forgets to free request 0 (a missed free)."""

    def _release(self, seq):
        if seq.req.request_id == 0:
            return
        super()._release(seq)


class _NoPoisonEngine(PagedEngine):
    """Frees in the pool but leaves the K/V in the tensor (a missed poison on free)."""

    def _release(self, seq):
        self.pool.free(seq.req.request_id)


@pytest.mark.parametrize("engine_cls", [_LeakyEngine, _NoPoisonEngine])
def test_a_leak_shows_as_a_mismatch(engine_cls):
    w = workload_from_lengths([9, 20, 14], [3, 12, 8])
    prepared = prepare_requests(w, max_len=128, vocab_size=TINY.vocab_size)
    cfg = EngineConfig(num_blocks=32, block_size=8, enable_prefix_caching=False, check_every=0)
    run = engine_cls(LiveModel(TINY), cfg, kv_dtype="fp32").run(prepared.requests)
    tl = run.timeline
    diff = tl["measured_kv_bytes"] - tl["predicted_kv_bytes"]
    assert diff.iloc[-1] > 0  # request 0's blocks are still counted after everything finished
    good = PagedEngine(LiveModel(TINY), cfg, kv_dtype="fp32").run(prepared.requests).timeline
    assert (good["measured_kv_bytes"] == good["predicted_kv_bytes"]).all()


def test_contiguous_baseline_reserves_max_len():
    w = workload_from_lengths([5, 9, 7], [4, 4, 4])
    r = run_live(w, _settings())
    c = r.contiguous.timeline
    # three reservations of 128 tokens at step 0, K and V, 2 layers: 3 * 128 * 512 bytes
    assert c.iloc[0]["measured_kv_bytes"] == 3 * 128 * BPT
    assert (c["measured_kv_bytes"] == c["predicted_kv_bytes"]).all()
    assert (c["live_bytes"] == c["predicted_live_bytes"]).all()
    assert r.summary["contiguous"]["measured_peak_kv_bytes"] > r.summary["measured_peak_kv_bytes"]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block=st.sampled_from([4, 8, 16]), spare=st.integers(0, 12), seed=st.integers(0, 10_000),
       prefix=st.sampled_from([0, 0, 13]))
def test_any_small_run_agrees(block, spare, seed, prefix):
    w = synthetic_workload(5, "uniform:1:24", "uniform:1:12", seed=seed, system_prompt_tokens=prefix)
    longest = max(r.final_len for r in w.requests)
    blocks = -(-longest // block) + spare
    r = run_live(w, _settings(block_size=block, num_blocks=blocks, max_num_seqs=4, check_every=3))
    _agree(r.paged.timeline)
    assert r.summary["finished"] == 5
    assert r.summary["tokens_match"] is True
    assert r.summary["max_abs_error"] < 1e-4


def test_pool_that_cannot_hold_one_request_is_a_clear_error():
    w = workload_from_lengths([40], [10])
    with pytest.raises(KvsimError, match="pool of 2 blocks"):
        run_live(w, _settings(num_blocks=2))


def test_bad_engine_settings_are_caller_errors():
    with pytest.raises(KvsimError):
        EngineConfig(block_size=12)
    with pytest.raises(KvsimError):
        EngineConfig(num_blocks=0)
    with pytest.raises(KvsimError):
        run_live(workload_from_lengths([4], [4]), replace(_settings(), device="tpu"))


def test_lengths_are_scaled_to_fit():
    w = workload_from_lengths([1000, 500], [600, 100])
    p = prepare_requests(w, max_len=100, vocab_size=64)
    assert all(r.final_len <= 100 for r in p.requests)
    assert p.scale == pytest.approx(100 / 1599)
    assert len(p.requests[0].prompt) > len(p.requests[1].prompt)  # the shape is kept


def test_shared_prefix_tokens_are_equal():
    w = synthetic_workload(3, "fixed:5", "fixed:2", system_prompt_tokens=7)
    p = prepare_requests(w, max_len=64, vocab_size=1000)
    heads = {r.prompt[:7] for r in p.requests}
    tails = {r.prompt[7:] for r in p.requests}
    assert len(heads) == 1 and len(tails) == 3


def test_contiguous_engine_rejects_a_request_longer_than_its_reservation():
    w = workload_from_lengths([30], [10])
    prepared = prepare_requests(w, max_len=64, vocab_size=TINY.vocab_size)
    with pytest.raises(KvsimError, match="exceeds the reservation"):
        ContiguousEngine(LiveModel(TINY), max_len=20).run(prepared.requests)
