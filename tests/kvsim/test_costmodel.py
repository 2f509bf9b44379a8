"""Step-time cost model: closed-form cases worked by hand, brute-force counting references,
and monotonicity properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.costmodel import (
    COMPUTE, MEMORY, CostModel, batch_sweep, compare_step_times, context_sweep, intensity_grid,
    linear_ridge_tokens, predicted_timeline,
    prefill_sweep, ridge_batch_size, roofline_boundary,
)
from kvsim.errors import KvsimError
from kvsim.gpus import custom_gpu, get_gpu
from kvsim.spec import PRESETS, get_preset

A100_40 = get_gpu("a100-40gb")  # 1,555 GB/s, 312 TFLOP/s
A100_80 = get_gpu("a100-80gb")  # 2,039 GB/s, 312 TFLOP/s
H100 = get_gpu("h100-80gb")  # 3.35 TB/s, 989 TFLOP/s


# ----- closed-form cases, worked by hand ------------------------------------------------


def test_weights_only_step_opt13b_a100():
    """One decode token at context 1: the step is the weights read once.

    OPT-13B: 12,853,473,280 params x 2 B (bf16) = 25,706,946,560 B of weights.
    KV per token: 40 layers x 2 (K,V) x 40 heads x 128 x 2 B = 819,200 B; the token reads its
    own K/V (819,200 B) and writes it (819,200 B).
    FLOPs: linear 2 x 12,853,473,280 = 25,706,946,560; attention 1 pair x 40 layers x
    4 x 40 heads x 128 = 819,200.
    Linear phase: max(25,706,946,560 / 1.555e12, 25,706,946,560 / 312e12) = 16.5318 ms (memory).
    Attention: max(1,638,400 / 1.555e12, 819,200 / 312e12) = 1.0536 us (memory).
    """
    m = CostModel(get_preset("opt-13b"), A100_40)
    s = m.step_cost(decode_context=[1])
    assert s.weight_bytes == 25_706_946_560
    assert s.kv_read_bytes == 819_200
    assert s.kv_write_bytes == 819_200
    assert s.linear_flops == 25_706_946_560
    assert s.attention_flops == 819_200
    assert s.linear_time_s == pytest.approx(25_706_946_560 / 1.555e12, rel=1e-12)
    assert s.attention_time_s == pytest.approx(1_638_400 / 1.555e12, rel=1e-12)
    assert s.time_s == pytest.approx(0.016531798 + 0.0000010536, rel=1e-6)
    assert (s.linear_bound, s.attention_bound, s.bound) == (MEMORY, MEMORY, MEMORY)
    # Arithmetic intensity 1 FLOP/byte, ~200x below the A100's ridge (312e12 / 1.555e12).
    assert s.arithmetic_intensity == pytest.approx((25_706_946_560 + 819_200) / (25_706_946_560 + 1_638_400))
    assert m.ridge_point == pytest.approx(200.643, rel=1e-4)


def test_single_long_context_decode_llama8b_h100():
    """Llama-3.1-8B, one sequence at 131,072 tokens on an H100.

    KV per token: 32 layers x 2 x 8 KV heads x 128 x 2 B = 131,072 B.
    KV read: 131,072 tokens x 131,072 B = 17,179,869,184 B (16 GiB): more than the weights,
    8,030,261,248 x 2 = 16,060,522,496 B.
    Attention FLOPs: 131,072 keys x 32 layers x 4 x 32 q heads x 128 = 68,719,476,736.
    Attention: max((17,179,869,184 + 131,072) / 3.35e12, 68,719,476,736 / 989e12)
             = 5.12832 ms (memory); linear: 16,060,522,496 / 3.35e12 = 4.79418 ms.
    """
    m = CostModel(get_preset("llama-3.1-8b"), H100)
    s = m.step_cost(decode_context=[131_072])
    assert s.kv_read_bytes == 17_179_869_184
    assert s.kv_write_bytes == 131_072
    assert s.weight_bytes == 16_060_522_496
    assert s.attention_flops == 68_719_476_736
    assert s.attention_time_s == pytest.approx((17_179_869_184 + 131_072) / 3.35e12, rel=1e-12)
    assert s.linear_time_s == pytest.approx(16_060_522_496 / 3.35e12, rel=1e-12)
    assert s.time_s == pytest.approx(5.12832e-3 + 4.79418e-3, rel=1e-5)
    assert s.attention_share == pytest.approx(5.12832 / (5.12832 + 4.79418), rel=1e-5)
    assert s.attention_bound == MEMORY


def test_large_prefill_llama8b_a100_80():
    """Llama-3.1-8B, one fresh 8,192-token prompt on an A100 80GB.

    Linear FLOPs: 2 x 8,030,261,248 x 8,192 = 131,567,800,287,232 -> / 312e12 = 421.69 ms,
    against weights 16,060,522,496 B / 2.039e12 = 7.877 ms: compute-bound.
    Causal pairs: 8,192 x 8,193 / 2 = 33,558,528; attention FLOPs x 32 layers x 4 x 32 x 128
    (524,288 per pair) = 17,594,333,528,064 -> / 312e12 = 56.392 ms, against
    KV read 8,192 x 131,072 B + write the same = 2,147,483,648 B / 2.039e12 = 1.053 ms.
    """
    m = CostModel(get_preset("llama-3.1-8b"), A100_80)
    s = m.step_cost(prefill_tokens=[8192])
    assert s.linear_flops == 131_567_800_287_232
    assert s.attention_flops == 8192 * 8193 // 2 * 32 * 4 * 32 * 128 == 17_594_333_528_064
    assert s.kv_read_bytes == 8192 * 131_072
    assert s.kv_write_bytes == 8192 * 131_072
    assert s.weight_bytes == 16_060_522_496
    assert s.linear_time_s == pytest.approx(131_567_800_287_232 / 312e12, rel=1e-12)
    assert s.attention_time_s == pytest.approx(17_594_333_528_064 / 312e12, rel=1e-12)
    assert (s.linear_bound, s.attention_bound, s.bound) == (COMPUTE, COMPUTE, COMPUTE)
    assert s.time_s == pytest.approx(0.42169 + 0.056392, rel=1e-4)


def test_prefill_chunk_after_cached_prefix_counts_causal_pairs():
    """A chunk of q=3 tokens after p=5 cached: queries at positions 5,6,7 see 6,7,8 keys:
    21 pairs = 3*5 + 3*4/2; distinct keys read 8."""
    m = CostModel(get_preset("opt-13b"), A100_40)
    s = m.step_cost(prefill_tokens=[3], prefill_cached=[5])
    assert s.attention_flops == 21 * 40 * 4 * 40 * 128
    assert s.kv_read_bytes == 8 * 819_200
    assert s.kv_write_bytes == 3 * 819_200


def test_sliding_window_reads_at_most_the_window():
    """Mistral-7B (every layer sliding, W=4,096): a decode at 10,000 tokens reads 4,096
    tokens x 131,072 B; 4,096 pairs x 32 layers x 4 x 32 x 128."""
    m = CostModel(get_preset("mistral-7b-v0.1"), A100_40)
    s = m.step_cost(decode_context=[10_000])
    assert s.kv_read_bytes == 4096 * 131_072
    assert s.attention_flops == 4096 * 524_288
    assert m.step_cost(decode_context=[4096]).kv_read_bytes == s.kv_read_bytes
    assert m.step_cost(decode_context=[4095]).kv_read_bytes == 4095 * 131_072


def test_mla_reads_the_latent_and_uses_absorbed_flops():
    """DeepSeek-V3 (61 MLA layers, latent 512 + rope 64, 128 heads): a decode at 1,000 tokens
    reads 1,000 x 61 x 576 x 2 B = 70,272,000 B; FLOPs per pair per layer
    2*128*576 + 2*128*512 = 278,528, x 61 x 1,000 = 16,990,208,000.
    Weights touched by one token: 37e9 active x 2 B = 74e9 B (not all 671B parameters)."""
    m = CostModel(get_preset("deepseek-v3"), H100)
    s = m.step_cost(decode_context=[1000])
    assert s.kv_read_bytes == 70_272_000
    assert s.attention_flops == 16_990_208_000
    assert s.weight_bytes == 74_000_000_000
    assert s.linear_flops == 74_000_000_000
    # 1,000 tokens touch at most every expert: the weights are then read once in full.
    big = m.step_cost(prefill_tokens=[1000])
    assert big.weight_bytes == 671_026_419_200 * 2


def test_tensor_parallel_is_per_rank():
    """tp=2 halves the weights, the KV heads (8 -> 4) and the FLOPs on each rank."""
    one = CostModel(get_preset("llama-3.1-8b"), H100).step_cost(decode_context=[4096, 100])
    two = CostModel(get_preset("llama-3.1-8b"), H100, tp=2).step_cost(decode_context=[4096, 100])
    assert two.weight_bytes == 16_060_522_496 // 2
    assert two.kv_read_bytes * 2 == one.kv_read_bytes
    assert two.attention_flops * 2 == one.attention_flops
    assert two.linear_flops * 2 == one.linear_flops


def test_efficiency_and_overhead():
    base = CostModel(get_preset("opt-13b"), A100_40)
    slow = CostModel(get_preset("opt-13b"), A100_40, bandwidth_efficiency=0.5, step_overhead_s=0.002)
    b = base.step_cost(decode_context=[100, 200])
    s = slow.step_cost(decode_context=[100, 200])
    assert s.time_s == pytest.approx(2 * b.time_s + 0.002, rel=1e-12)  # memory-bound: half BW = double
    assert slow.step_cost().time_s == 0.0  # an empty step costs nothing


def test_activations_add_traffic_when_enabled():
    """OPT-13B, 10 tokens: 10 x 40 layers x 2 B x (4*5,120 + 2*20,480) = 49,152,000 B."""
    m = CostModel(get_preset("opt-13b"), A100_40, include_activations=True)
    assert m.step_cost(prefill_tokens=[10]).activation_bytes == 49_152_000
    assert CostModel(get_preset("opt-13b"), A100_40).step_cost(prefill_tokens=[10]).activation_bytes == 0


@pytest.mark.parametrize("bad", [
    dict(decode_context=[0]), dict(decode_context=[-3]), dict(decode_context=[1.5]),
    dict(prefill_tokens=[0]), dict(prefill_tokens=[4], prefill_cached=[1, 2]),
    dict(prefill_tokens=[4], prefill_cached=[-1]), dict(decode_context=["x"]),
])
def test_bad_step_is_a_kvsim_error(bad):
    m = CostModel(get_preset("opt-13b"), A100_40)
    with pytest.raises(KvsimError):
        m.step_cost(**bad)


@pytest.mark.parametrize("kwargs", [
    dict(tp=0), dict(bandwidth_efficiency=0), dict(compute_efficiency=1.5), dict(step_overhead_s=-1),
    dict(weight_dtype="fp7"), dict(kv_dtype="fp3"), dict(weight_params=0),
])
def test_bad_model_is_a_kvsim_error(kwargs):
    with pytest.raises(KvsimError):
        CostModel(get_preset("opt-13b"), A100_40, **kwargs)


def test_cost_model_is_hashable_and_a_step_time_fn():
    m = CostModel(get_preset("opt-13b"), A100_40)
    assert hash(m) == hash(CostModel(get_preset("opt-13b"), A100_40))

    class Batch:
        prefill_tokens = [3]
        prefill_cached = [5]
        decode_context = [10, 20]

    assert m(Batch()) == m.step_time(prefill_tokens=[3], prefill_cached=[5], decode_context=[10, 20])


# ----- counting against brute force ---------------------------------------------------


def _brute_pairs_and_keys(p: int, q: int, window: int | None) -> tuple[int, int]:
    """Enumerate every (query, key) pair of a chunk of q queries after p cached tokens."""
    keys: set[int] = set()
    pairs = 0
    for i in range(p, p + q):
        lo = 0 if window is None else max(0, i - window + 1)
        seen = range(lo, i + 1)
        pairs += len(seen)
        keys.update(seen)
    return pairs, len(keys)


@settings(max_examples=150, deadline=None)
@given(p=st.integers(0, 60), q=st.integers(1, 40), window=st.integers(1, 50))
def test_sliding_counts_match_enumeration(p, q, window):
    spec = PRESETS["mistral-7b-v0.1"]
    from dataclasses import replace

    spec = replace(spec, sliding_window=window)
    m = CostModel(spec, A100_40)
    s = m.step_cost(prefill_tokens=[q], prefill_cached=[p])
    pairs, keys = _brute_pairs_and_keys(p, q, window)
    assert s.attention_flops == pairs * 32 * 4 * 32 * 128
    assert s.kv_read_bytes == keys * 131_072
    full = CostModel(get_preset("llama-3.1-8b"), A100_40).step_cost(prefill_tokens=[q], prefill_cached=[p])
    pairs, keys = _brute_pairs_and_keys(p, q, None)
    assert full.attention_flops == pairs * 524_288
    assert full.kv_read_bytes == keys * 131_072


# ----- monotonicity ---------------------------------------------------------------------

MODELS = ["opt-13b", "llama-3.1-8b", "mistral-7b-v0.1", "gemma-2-9b", "deepseek-v3"]
contexts = st.lists(st.integers(1, 200_000), min_size=0, max_size=12)
prefills = st.lists(st.tuples(st.integers(1, 20_000), st.integers(0, 50_000)), max_size=4)


@settings(max_examples=120, deadline=None)
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(["a100-40gb", "h100-80gb", "l4"]),
       decode=contexts, prefill=prefills, which=st.integers(0, 100), extra=st.integers(1, 100_000))
def test_more_context_never_makes_a_step_faster(model, gpu, decode, prefill, which, extra):
    m = CostModel(get_preset(model), get_gpu(gpu))
    q = [a for a, _ in prefill]
    p = [b for _, b in prefill]
    before = m.step_cost(decode_context=decode, prefill_tokens=q, prefill_cached=p)
    if decode and which % 2 == 0:
        longer = list(decode)
        longer[which % len(decode)] += extra
        after = m.step_cost(decode_context=longer, prefill_tokens=q, prefill_cached=p)
    elif prefill:
        p2 = list(p)
        p2[which % len(p)] += extra
        after = m.step_cost(decode_context=decode, prefill_tokens=q, prefill_cached=p2)
    else:
        return
    assert after.time_s >= before.time_s
    assert after.kv_read_bytes >= before.kv_read_bytes
    assert after.attention_flops >= before.attention_flops


@settings(max_examples=120, deadline=None)
@given(model=st.sampled_from(MODELS), decode=contexts, new=st.integers(1, 200_000))
def test_a_larger_batch_never_lowers_bytes_read(model, decode, new):
    m = CostModel(get_preset(model), H100)
    before = m.step_cost(decode_context=decode)
    after = m.step_cost(decode_context=decode + [new])
    assert after.kv_read_bytes > before.kv_read_bytes
    assert after.total_bytes > before.total_bytes
    assert after.time_s >= before.time_s


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(MODELS), decode=st.lists(st.integers(1, 50_000), min_size=1, max_size=20))
def test_time_is_at_least_each_roofline(model, decode):
    """The sum of phase maxima is never below the single roofline of the whole step."""
    m = CostModel(get_preset(model), A100_40)
    s = m.step_cost(decode_context=decode)
    assert s.time_s >= s.total_bytes / m.bandwidth_bytes_per_s * (1 - 1e-12)
    assert s.time_s >= s.total_flops / m.flops_per_s * (1 - 1e-12)


# ----- sweeps and the boundary --------------------------------------------------------


def test_context_sweep_kv_bytes_grow_linearly_and_attention_share_rises():
    m = CostModel(get_preset("opt-13b"), A100_40)
    df = context_sweep(m, [512, 1024, 2048], batch_size=4)
    assert df["kv_read_bytes"].tolist() == [4 * c * 819_200 for c in (512, 1024, 2048)]
    assert df["attention_share"].is_monotonic_increasing
    assert (df["weight_bytes"] == 25_706_946_560).all()


def test_batch_sweep_throughput_and_latency():
    m = CostModel(get_preset("opt-13b"), A100_40)
    df = batch_sweep(m, [1, 2, 4, 8, 16], context=1024, max_batch_in_memory=8)
    assert df["per_token_latency_s"].is_monotonic_increasing
    assert df["throughput_tokens_per_s"].is_monotonic_increasing
    t1 = df["step_time_s"].iloc[0]
    assert df["throughput_tokens_per_s"].iloc[0] == pytest.approx(1 / t1)
    assert df["fits_in_memory"].tolist() == [True, True, True, True, False]


def test_linear_ridge_is_ceil_r_bw_over_two_for_a_dense_model():
    """Dense, no activation traffic: linear intensity 2T/b_w, so T* = ceil(R * b_w / 2).
    A100 40GB bf16: R = 312e12 / 1.555e12 = 200.64 -> T* = 201. H100: 295.2 -> 296."""
    assert linear_ridge_tokens(CostModel(get_preset("opt-13b"), A100_40)) == 201
    assert linear_ridge_tokens(CostModel(get_preset("llama-3.1-8b"), H100)) == 296
    assert linear_ridge_tokens(CostModel(get_preset("llama-3.1-8b"), H100, weight_dtype="fp8")) == 148


@pytest.mark.parametrize("model,context", [("deepseek-v3", 2048), ("llama-3.1-8b", 64), ("opt-13b", 4)])
def test_ridge_batch_matches_brute_force(model, context):
    m = CostModel(get_preset(model), A100_40)
    b_star = ridge_batch_size(m, context)
    assert b_star is not None

    def intensity(batch: int) -> float:
        return m.step_cost(decode_context=[context] * batch).arithmetic_intensity

    assert intensity(math.ceil(b_star)) >= m.ridge_point
    assert intensity(math.floor(b_star)) < m.ridge_point


def test_mha_decode_attention_never_reaches_the_ridge():
    """OPT-13B (MHA, fp16): 4*H*d FLOPs per key against 2*H*d*2 B: one FLOP per byte."""
    b = roofline_boundary(CostModel(get_preset("opt-13b"), A100_40), 2048)
    assert b.attention_intensity == pytest.approx(1.0, rel=1e-3)
    assert not b.attention_compute_bound
    assert b.step_ridge_batch is None  # long MHA contexts keep every decode step memory-bound


def test_intensity_grid_and_prefill_sweep_shapes():
    m = CostModel(get_preset("llama-3.1-8b"), custom_gpu(80, 2000, 400))
    g = intensity_grid(m, [1, 64, 512], [128, 4096])
    assert len(g) == 6 and set(g["bound"]) <= {MEMORY, COMPUTE}
    pf = prefill_sweep(m, [16, 4096])
    assert pf["step_time_s"].is_monotonic_increasing
    assert pf["bound"].tolist()[-1] == COMPUTE


# ----- validation hook ------------------------------------------------------------------


def test_compare_step_times_puts_prediction_beside_measurement():
    """Two measured steps: a weights-only decode (prediction 16.5329 ms, worked out in
    test_weights_only_step_opt13b_a100) measured at 20 ms, and a 3-token chunk after 5
    cached tokens measured at 33 ms."""
    m = CostModel(get_preset("opt-13b"), A100_40)
    steps = [
        {"decode_context": [1], "step_time_s": 0.020},
        {"prefill_tokens": [3], "prefill_cached": [5], "step_time_s": 0.033, "step": 7},
    ]
    df = compare_step_times(m, steps)
    assert df["step"].tolist() == [0, 7]
    assert df["predicted_step_time_s"].iloc[0] == pytest.approx(0.0165328521, rel=1e-8)
    assert df["ratio"].iloc[0] == pytest.approx(0.020 / 0.0165328521, rel=1e-8)
    assert df["num_tokens"].tolist() == [1, 3]
    assert df["kv_read_bytes"].tolist() == [819_200, 8 * 819_200]
    tl = predicted_timeline(m, steps)
    assert tl["time_s"].iloc[-1] == pytest.approx(df["predicted_step_time_s"].sum())
    assert set(tl.columns) == {"step", "time_s", "step_time_s", "source"}
    with pytest.raises(KvsimError):
        compare_step_times(m, [{"decode_context": [4], "step_time_s": -1.0}])
    # a chunk wholly served from the prefix cache computes nothing and costs nothing
    zero = compare_step_times(m, [{"prefill_tokens": [0, 3], "prefill_cached": [16, 5], "step_time_s": 0.02}])
    assert zero["predicted_step_time_s"].iloc[0] == pytest.approx(df["predicted_step_time_s"].iloc[1])


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from(MODELS), decode=contexts, prefill=prefills, overhead=st.sampled_from([0.0, 0.003]))
def test_step_time_fn_matches_step_cost(model, decode, prefill, overhead):
    """The scheduler's fast path gives the same seconds as the full StepCost."""
    from kvsim.scheduler import StepBatch

    m = CostModel(get_preset(model), A100_40, step_overhead_s=overhead)
    q = [a for a, _ in prefill]
    p = [b for _, b in prefill]
    batch = StepBatch(0, np.array(q, dtype=np.int64), np.array(p, dtype=np.int64), np.array(decode, dtype=np.int64))
    expected = m.step_cost(prefill_tokens=q, prefill_cached=p, decode_context=decode).time_s
    assert m(batch) == pytest.approx(expected, rel=1e-12, abs=0)
