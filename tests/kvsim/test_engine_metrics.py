"""Reading each engine's exposition format into an EngineSnapshot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.engine import detect_engine, parse_metrics
from kvsim.errors import KvsimError

from tests.kvsim.engine_texts import MODEL, NODE_EXPORTER, SGLANG, TRITON, TRTLLM, VLLM_V0, vllm_v1


def test_vllm_v1_two_engines_are_read_one_by_one_and_combined():
    snap = parse_metrics(vllm_v1())
    assert snap.engine == "vllm"
    assert snap.engine_ids == ("0", "1")
    assert [e.num_running for e in snap.per_engine] == [5, 3]
    assert snap.num_running == 8 and snap.num_waiting == 2
    assert snap.num_preemptions == 10
    # both pools hold 2000 x 16 tokens: weighted mean of 0.5 and 0.25
    assert snap.kv_usage_fraction == pytest.approx(0.375)
    assert snap.prefix_cache_queries == 4000 and snap.prefix_cache_hits == 1750
    assert snap.prefix_cache_hit_rate == pytest.approx(1750 / 4000)
    assert snap.block_size == 16 and snap.num_gpu_blocks == 4000 and snap.blocks_per_engine == 2000
    assert snap.kv_capacity_tokens == 2 * 2000 * 16
    assert snap.kv_used_tokens == pytest.approx(0.5 * 32000 + 0.25 * 32000)
    assert snap.cache_dtype == "auto" and snap.gpu_memory_utilization == 0.9 and snap.enable_prefix_caching is True
    assert snap.model_names == (MODEL,)


def test_vllm_capacity_weighting_uses_each_engines_pool():
    text = vllm_v1(engines=(("0", 1, 0, 0.5, 1000, 0, 0, 0), ("1", 1, 0, 1.0, 3000, 0, 0, 0)))
    snap = parse_metrics(text)
    assert snap.kv_usage_fraction == pytest.approx((0.5 * 1000 + 1.0 * 3000) / 4000)


def test_vllm_single_engine_without_kv_tokens_label():
    snap = parse_metrics(vllm_v1(engines=(("0", 2, 1, 0.1, 500, 0, 10, 5),), kv_tokens_label=False))
    assert snap.engine_ids == ("0",) and snap.per_engine == ()
    assert snap.kv_capacity_tokens == 500 * 16  # blocks x block size when the label is absent


def test_vllm_v0_old_names():
    snap = parse_metrics(VLLM_V0)
    assert snap.kv_usage_fraction == 0.42  # vllm:gpu_cache_usage_perc
    assert snap.num_running == 3 and snap.num_waiting == 1 and snap.num_preemptions == 2
    assert snap.prefix_cache_hit_rate == 0.125  # the v0 gauge
    assert snap.prefix_cache_queries is None
    assert snap.num_gpu_blocks == 5691 and snap.block_size == 16 and snap.enable_prefix_caching is False
    assert snap.engine_ids == ()


def test_vllm_new_name_wins_over_old_when_both_are_exported():
    text = VLLM_V0 + 'vllm:kv_cache_usage_perc{model_name="m"} 0.7\n'
    assert parse_metrics(text).kv_usage_fraction == 0.7


def test_sglang():
    snap = parse_metrics(SGLANG)
    assert snap.engine == "sglang"
    assert snap.kv_usage_fraction == 0.3
    assert snap.kv_used_tokens == 30000 and snap.kv_capacity_tokens == 100000
    assert snap.num_running == 12 and snap.num_waiting == 4
    assert snap.prefix_cache_hit_rate == 0.0075
    # SGLang publishes no preemption counter or block count here: null, not guessed
    assert snap.num_preemptions is None and snap.block_size is None and snap.num_gpu_blocks is None


def test_trtllm_serve():
    snap = parse_metrics(TRTLLM)
    assert snap.engine == "trtllm"
    assert snap.kv_usage_fraction == 0.5 and snap.num_gpu_blocks == 6000 and snap.num_used_blocks == 3000
    assert snap.block_size == 32 and snap.kv_capacity_tokens == 6000 * 32 and snap.kv_used_tokens == 3000 * 32
    assert snap.num_running == 4 and snap.num_waiting == 1 and snap.prefix_cache_hit_rate == 0.2


def test_trtllm_colon_prefix_reads_the_same():
    snap = parse_metrics(TRTLLM.replace("trtllm_", "trtllm:"))
    assert snap.engine == "trtllm" and snap.kv_usage_fraction == 0.5 and snap.block_size == 32


def test_trtllm_usage_from_blocks_when_no_utilization_gauge():
    text = "\n".join(l for l in TRTLLM.splitlines() if "utilization" not in l) + "\n"
    assert parse_metrics(text).kv_usage_fraction == pytest.approx(3000 / 6000)


def test_triton_backend_block_metrics():
    snap = parse_metrics(TRITON)
    assert snap.engine == "triton-trtllm"
    assert snap.kv_usage_fraction == 0.1
    assert snap.num_gpu_blocks == 6240 and snap.num_used_blocks == 624 and snap.block_size == 64
    assert snap.num_running == 3  # request_type="scheduled"
    assert snap.num_waiting == 2
    assert snap.model_names == ("tensorrt_llm",)  # the ensemble model's series are not an engine


def test_nan_values_are_unknown_not_numbers():
    text = vllm_v1(engines=(("0", 1, 0, 0.5, 100, 0, 0, 0),)).replace("vllm:kv_cache_usage_perc{", "vllm:kv_cache_usage_perc_x{")
    text += 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
    assert parse_metrics(text).kv_usage_fraction is None


@pytest.mark.parametrize("text, needle", [
    ("<!DOCTYPE html><html><body>vLLM</body></html>", "not Prometheus metrics"),
    ('{"status": "ok"}', "not Prometheus metrics"),
    ("hello world\n", "not Prometheus metrics"),
    (NODE_EXPORTER, "no vLLM, SGLang or TensorRT-LLM metrics"),
    ("", "no metrics"),
])
def test_not_an_engine(text, needle):
    with pytest.raises(KvsimError, match=needle):
        parse_metrics(text)


def test_detect_prefers_the_engine_with_kv_metrics():
    assert detect_engine(["sglang:prompt_tokens_total", "vllm:kv_cache_usage_perc"]) == "vllm"
    assert detect_engine(["nv_trt_llm_kv_cache_block_metrics", "nv_inference_count"]) == "triton-trtllm"


_engine = st.tuples(
    st.integers(0, 500), st.integers(0, 500), st.floats(0, 1), st.integers(1, 100_000),
    st.integers(0, 10_000), st.integers(0, 10**9),
).flatmap(lambda t: st.tuples(st.just(t), st.integers(0, t[5])))


@settings(max_examples=60, deadline=None)
@given(st.lists(_engine, min_size=1, max_size=6))
def test_combining_engines_holds_for_any_values(parts):
    engines = tuple((str(i), r, w, u, b, p, q, h) for i, ((r, w, u, b, p, q), h) in enumerate(parts))
    snap = parse_metrics(vllm_v1(engines=engines))
    assert snap.num_running == sum(e[1] for e in engines)
    assert snap.num_waiting == sum(e[2] for e in engines)
    assert snap.num_preemptions == sum(e[5] for e in engines)
    assert snap.num_gpu_blocks == sum(e[4] for e in engines)
    want = sum(e[3] * e[4] for e in engines) / sum(e[4] for e in engines)
    assert snap.kv_usage_fraction == pytest.approx(want, abs=1e-12)
    queries = sum(e[6] for e in engines)
    want_hit = sum(e[7] for e in engines) / queries if queries else None
    assert snap.prefix_cache_hit_rate == (pytest.approx(want_hit) if want_hit is not None else None)
    assert 0 <= snap.kv_usage_fraction <= 1
