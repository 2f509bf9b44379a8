"""Capacity planner against budgets worked out by hand."""

from __future__ import annotations

import pytest

from kvsim.capacity import plan_capacity, weights_bytes
from kvsim.errors import KvsimError
from kvsim.gpus import custom_gpu, get_gpu
from kvsim.spec import get_preset

GiB = 2**30
MiB = 2**20


def test_llama_8b_on_h100_by_hand():
    spec = get_preset("llama-3.1-8b")
    plan = plan_capacity(spec, get_gpu("h100-80gb"), block_size=16, max_len=8192)
    usable = int(81559 * MiB * 0.9)
    weights = 8_030_261_248 * 2
    budget = usable - weights - 1 * GiB
    block = 16 * 2 * 8 * 128 * 2 * 32  # 16 tokens x 128 KiB
    assert plan.block_bytes == block == 2 * MiB
    assert plan.num_blocks == budget // block
    assert plan.kv_tokens == plan.num_blocks * 16
    assert plan.max_concurrency == pytest.approx(plan.num_blocks / (8192 / 16))
    lines = plan.vllm_log_lines()
    assert lines[0] == f"GPU KV cache size: {plan.num_blocks * 16:,} tokens"
    assert lines[1] == f"Maximum concurrency for 8,192 tokens per request: {plan.num_blocks / 512:.2f}x"


def test_tensor_parallel_splits_weights_and_heads():
    spec = get_preset("llama-3.1-70b")
    plan = plan_capacity(spec, get_gpu("h100-80gb"), tp=4, max_len=4096)
    assert plan.weights_bytes == -(-70_553_706_496 * 2 // 4)
    assert plan.bytes_per_token == 2 * 2 * 128 * 2 * 80  # 8 KV heads / 4 ranks = 2 per rank


def test_concurrency_rounds_requests_up_to_whole_blocks():
    spec = get_preset("opt-13b")
    plan = plan_capacity(spec, custom_gpu(80), block_size=16, max_len=33, weights_override_bytes=0, reserve_bytes=0)
    assert plan.request_bytes == 3 * 16 * 819_200
    assert plan.max_concurrency == pytest.approx(plan.num_blocks / 3)


def test_sliding_window_raises_concurrency():
    spec = get_preset("mistral-7b-v0.1")
    plan = plan_capacity(spec, get_gpu("a100-80gb"), max_len=32768)
    # Every layer keeps at most the 4096-token window: 256 blocks per request, not 2048.
    assert plan.max_concurrency == pytest.approx(plan.num_blocks / 256)


def test_weights_that_do_not_fit_are_a_clear_error():
    with pytest.raises(KvsimError, match="no room for a KV cache"):
        plan_capacity(get_preset("llama-3.1-70b"), get_gpu("l4"))
    with pytest.raises(KvsimError, match="gpu_memory_utilization"):
        plan_capacity(get_preset("opt-13b"), get_gpu("h200"), gpu_util=1.5)
    with pytest.raises(KvsimError):
        plan_capacity(get_preset("opt-13b"), get_gpu("h200"), gpu_util=float("nan"))
    with pytest.raises(KvsimError, match="weight dtype"):
        weights_bytes(get_preset("opt-13b"), "fp5")
    with pytest.raises(KvsimError):
        custom_gpu(-1)
