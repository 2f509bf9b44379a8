"""vLLM start-up log lines in each historical form, and the comparison with the planner."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.capacity import plan_capacity
from kvsim.engine import compare_log_with_plan, parse_vllm_log, plan_for_log
from kvsim.errors import KvsimError
from kvsim.gpus import get_gpu
from kvsim.spec import get_preset

V0_LOG = """\
INFO 01-13 11:35:21 model_runner.py:1099] Loading model weights took 14.9595 GB
INFO 01-13 11:35:23 worker.py:241] Memory profiling takes 1.32 seconds
INFO 01-13 11:35:23 worker.py:241] the current vLLM instance can use total_gpu_memory (39.50GiB) x gpu_memory_utilization (0.90) = 35.55GiB
INFO 01-13 11:35:23 worker.py:241] model weights take 14.96GiB; non_torch_memory takes 0.10GiB; PyTorch activation peak memory takes 9.37GiB; the rest of the memory reserved for KV Cache is 11.12GiB.
INFO 01-13 11:35:23 gpu_executor.py:76] # GPU blocks: 5691, # CPU blocks: 2048
INFO 01-13 11:35:23 gpu_executor.py:80] Maximum concurrency for 8192 tokens per request: 11.12x
"""

V1_TWO_LINES = """\
INFO 03-10 09:00:01 [core.py:61] Initializing a V1 LLM engine (v0.8.1) with config: model='Qwen/Qwen2.5-7B', speculative_config=None, max_seq_len=32768, tensor_parallel_size=2, kv_cache_dtype=fp8, seed=0
INFO 03-10 09:00:40 [gpu_worker.py:227] Available KV cache memory: 51.62 GiB
INFO 03-10 09:00:40 [kv_cache_utils.py:634] GPU KV cache size: 1,933,056 tokens
INFO 03-10 09:00:40 [kv_cache_utils.py:637] Maximum concurrency for 32,768 tokens per request: 58.99x
"""

V1_ONE_LINE = ("(EngineCore_DP0 pid=123) INFO 09-01 12:00:00 [kv_cache_utils.py:1087] GPU KV cache size: 34,952 tokens, "
               "Maximum concurrency for 8,192 tokens per request: 4.27x\n")


def test_v0_blocks_and_concurrency_without_separators():
    log = parse_vllm_log(V0_LOG)
    assert log.num_gpu_blocks == 5691 and log.num_cpu_blocks == 2048
    assert log.max_model_len == 8192 and log.max_concurrency == 11.12
    assert log.kv_cache_tokens is None
    # the printed concurrency is blocks x 16 / max_len, to two decimals
    assert round(5691 * 16 / 8192, 2) == log.max_concurrency
    assert log.gpu_memory_utilization == 0.90
    assert log.total_gpu_memory_bytes == int(39.50 * 2**30)
    assert log.weights_bytes == int(14.96 * 2**30)
    assert log.kv_reserved_bytes == int(11.12 * 2**30) == log.kv_memory_bytes


def test_device_named_blocks_line():
    log = parse_vllm_log("INFO executor_base.py:110] # cuda blocks: 27891, # CPU blocks: 2048\n")
    assert log.num_gpu_blocks == 27891 and log.num_cpu_blocks == 2048


def test_early_v1_blocks_alone():
    log = parse_vllm_log("INFO kv_cache_utils.py:537] # GPU blocks: 27891\n"
                         "INFO kv_cache_utils.py:540] Maximum concurrency for 131072 tokens per request: 3.40x\n")
    assert log.num_gpu_blocks == 27891 and log.num_cpu_blocks is None
    assert log.max_model_len == 131072 and log.max_concurrency == 3.40


def test_v1_two_lines_with_thousands_separators_and_config():
    log = parse_vllm_log(V1_TWO_LINES)
    assert log.kv_cache_tokens == 1_933_056
    assert log.max_model_len == 32_768 and log.max_concurrency == 58.99
    assert log.available_kv_bytes == int(51.62 * 2**30)
    assert log.model == "Qwen/Qwen2.5-7B" and log.tensor_parallel_size == 2
    assert log.kv_cache_dtype == "fp8" and log.max_seq_len == 32768
    assert log.num_gpu_blocks is None


def test_single_line_form():
    log = parse_vllm_log(V1_ONE_LINE)
    assert log.kv_cache_tokens == 34_952
    assert log.max_model_len == 8_192 and log.max_concurrency == 4.27
    assert round(34_952 / 8_192, 2) == 4.27


def test_last_occurrence_wins():
    log = parse_vllm_log(V1_ONE_LINE + V1_ONE_LINE.replace("34,952", "40,000"))
    assert log.kv_cache_tokens == 40_000 and log.lines_matched == 4


@pytest.mark.parametrize("text", ["", "INFO starting server on port 8000\n", "GPU KV cache size: lots"])
def test_no_capacity_lines(text):
    with pytest.raises(KvsimError, match="no KV capacity lines"):
        parse_vllm_log(text)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 10**9), st.integers(1, 10**7), st.integers(0, 10**6), st.booleans(), st.booleans())
def test_any_numbers_in_either_spelling_read_back(tokens, max_len, conc_hundredths, commas, one_line):
    fmt = (lambda n: f"{n:,}") if commas else str
    conc = conc_hundredths / 100
    a = f"GPU KV cache size: {fmt(tokens)} tokens"
    b = f"Maximum concurrency for {fmt(max_len)} tokens per request: {conc:.2f}x"
    text = f"INFO x] {a}, {b}\n" if one_line else f"INFO x] {a}\nINFO y] {b}\n"
    log = parse_vllm_log(text)
    assert log.kv_cache_tokens == tokens and log.max_model_len == max_len
    assert math.isclose(log.max_concurrency, float(f"{conc:.2f}"))


def test_comparison_with_the_planner():
    spec, gpu = get_preset("llama-3.1-8b"), get_gpu("h100-80gb")
    log = parse_vllm_log(V1_ONE_LINE)
    plan = plan_for_log(log, spec, gpu, kv_dtype="bf16")
    assert plan.max_len == 8_192 and plan.gpu_util == 0.9
    assert plan == plan_capacity(spec, gpu, kv_dtype="bf16", max_len=8_192)
    rows = {r.quantity: r for r in compare_log_with_plan(log, plan)}
    tokens = rows["KV cache tokens"]
    assert tokens.engine == 34_952 and tokens.planner == plan.kv_tokens
    assert tokens.ratio == pytest.approx(34_952 / plan.kv_tokens)
    blocks = rows["KV blocks"]
    assert blocks.engine == 34_952 // 16 and "block size 16" in blocks.note
    conc = rows["max concurrency at 8,192 tokens"]
    assert conc.ratio == pytest.approx(4.27 / plan.max_concurrency)
    assert rows["KV memory per rank (GiB)"].engine is None  # the log does not say


def test_v0_log_utilization_feeds_the_planner():
    log = parse_vllm_log(V0_LOG.replace("(0.90)", "(0.80)"))
    plan = plan_for_log(log, get_preset("llama-3.1-8b"), get_gpu("a100-40gb"))
    assert plan.gpu_util == 0.80
    rows = {r.quantity: r for r in compare_log_with_plan(log, plan)}
    assert rows["KV cache tokens"].engine == 5691 * 16
    assert rows["KV memory per rank (GiB)"].engine == pytest.approx(11.12, abs=1e-6)
