"""A bundled example of what the engine bridge reads, for when no engine is running.

This is NOT a measurement. It is a short series of vLLM-style expositions written by
:func:`sample_expositions` from vLLM's published metric names and label names, with a made-up
load (a ramp of requests that fills the KV cache until the engine preempts), so the Engine page
and the tests have something to show. Every place that shows it must say so; ``SAMPLE_LABEL``
is the wording.
"""

from __future__ import annotations

import math

from kvsim.engine.metrics import parse_metrics
from kvsim.engine.poll import Scrape

SAMPLE_LABEL = ("bundled example (vLLM metric names, made-up load; not a measurement)")
SAMPLE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SAMPLE_BLOCK_SIZE = 16
SAMPLE_NUM_GPU_BLOCKS = 28_000
SAMPLE_INTERVAL_S = 5.0


def _exposition(running: int, waiting: int, usage: float, preemptions: int, queries: int, hits: int) -> str:
    lab = f'engine="0",model_name="{SAMPLE_MODEL}"'
    return "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{lab}}} {usage!r}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{lab}}} {float(preemptions)}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{lab}}} {float(queries)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{lab}}} {float(hits)}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        ('vllm:cache_config_info{block_size="%d",cache_dtype="auto",enable_prefix_caching="True",engine="0",'
         'gpu_memory_utilization="0.9",kv_cache_size_tokens="%d",num_gpu_blocks="%d"} 1.0')
        % (SAMPLE_BLOCK_SIZE, SAMPLE_BLOCK_SIZE * SAMPLE_NUM_GPU_BLOCKS, SAMPLE_NUM_GPU_BLOCKS),
        "",
    ])


def sample_expositions(n: int = 36) -> list[str]:
    """``n`` expositions, one per ``SAMPLE_INTERVAL_S``: requests ramp up, the cache fills,
    the engine preempts near full and drains afterwards."""
    texts = []
    preemptions = queries = hits = 0
    for i in range(n):
        phase = i / max(1, n - 1)
        load = math.sin(math.pi * phase)  # 0 -> 1 -> 0
        running = int(round(4 + 120 * load))
        waiting = int(max(0, round(60 * (load - 0.7) / 0.3))) if load > 0.7 else 0
        usage = min(0.985, 0.03 + 0.98 * load ** 1.3)
        if usage > 0.95:
            preemptions += 3 + i % 4
        new_queries = 2_000 * running
        queries += new_queries
        hits += int(new_queries * (0.25 + 0.15 * math.cos(3 * phase)))
        texts.append(_exposition(running, waiting, round(usage, 4), preemptions, queries, hits))
    return texts


def sample_scrapes(n: int = 36) -> list[Scrape]:
    """The bundled example read through the same parser as a real scrape."""
    return [Scrape(i * SAMPLE_INTERVAL_S, parse_metrics(text)) for i, text in enumerate(sample_expositions(n))]


#: An example vLLM start-up log (lines in the forms vLLM prints), for the paste box.
SAMPLE_VLLM_LOG = """\
INFO 05-02 10:11:02 [core.py:58] Initializing a V1 LLM engine (v0.9.0) with config: model='meta-llama/Llama-3.1-8B-Instruct', dtype=torch.bfloat16, max_seq_len=8192, tensor_parallel_size=1, kv_cache_dtype=auto, seed=0
INFO 05-02 10:11:31 [gpu_model_runner.py:1329] Model loading took 14.99 GiB and 4.21 seconds
INFO 05-02 10:11:40 [gpu_worker.py:232] Available KV cache memory: 53.13 GiB
INFO 05-02 10:11:40 [kv_cache_utils.py:716] GPU KV cache size: 435,200 tokens
INFO 05-02 10:11:40 [kv_cache_utils.py:720] Maximum concurrency for 8,192 tokens per request: 53.12x
"""
