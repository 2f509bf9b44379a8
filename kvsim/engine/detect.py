"""Which serving engine wrote a Prometheus exposition, told from its metric names.

Each engine names its metrics with its own prefix, so the names alone identify it:

- vLLM: ``vllm:`` (``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running`` ...);
- SGLang: ``sglang:`` (``sglang:token_usage``, ``sglang:num_running_reqs`` ...);
- TensorRT-LLM's own server (``trtllm-serve``): ``trtllm_`` (``trtllm_kv_cache_utilization``);
  some front ends re-export the same series as ``trtllm:``, which is read the same way;
- Triton Inference Server with the TensorRT-LLM backend: ``nv_trt_llm_``
  (``nv_trt_llm_kv_cache_block_metrics``).

An endpoint that carries none of these (a plain Python process, a node exporter, a web
page) is a caller's mistake: the message says what was found instead.
"""

from __future__ import annotations

from typing import Iterable

from kvsim.errors import KvsimError

VLLM = "vllm"
SGLANG = "sglang"
TRTLLM = "trtllm"
TRITON_TRTLLM = "triton-trtllm"

#: Engine id -> metric-name prefixes that identify it (checked in this order).
ENGINE_PREFIXES: dict[str, tuple[str, ...]] = {
    VLLM: ("vllm:",),
    SGLANG: ("sglang:",),
    TRTLLM: ("trtllm_", "trtllm:"),
    TRITON_TRTLLM: ("nv_trt_llm_",),
}

#: Display names, for captions and CLI text.
ENGINE_LABELS: dict[str, str] = {
    VLLM: "vLLM",
    SGLANG: "SGLang",
    TRTLLM: "TensorRT-LLM (trtllm-serve)",
    TRITON_TRTLLM: "Triton + TensorRT-LLM backend",
}

#: Metrics that carry KV usage; an engine exposing one of them wins a tie.
_KV_METRICS = {
    VLLM: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    SGLANG: ("sglang:token_usage", "sglang:num_used_tokens"),
    TRTLLM: ("trtllm_kv_cache_utilization", "trtllm_kv_cache_used_blocks",
             "trtllm:kv_cache_utilization", "trtllm:kv_cache_used_blocks"),
    TRITON_TRTLLM: ("nv_trt_llm_kv_cache_block_metrics",),
}


def engine_of(name: str) -> str | None:
    """The engine a single metric name belongs to, or None."""
    for engine, prefixes in ENGINE_PREFIXES.items():
        if name.startswith(prefixes):
            return engine
    return None


def detect_engine(metric_names: Iterable[str]) -> str:
    """The engine whose metrics these are.

    When names of several engines appear (a proxy re-exporting two backends), the one
    with a KV-usage metric wins, then the one with more metrics.
    """
    names = set(metric_names)
    counts: dict[str, int] = {}
    for name in names:
        engine = engine_of(name)
        if engine is not None:
            counts[engine] = counts.get(engine, 0) + 1
    if not counts:
        shown = ", ".join(sorted(names)[:3]) or "none"
        raise KvsimError(
            f"no vLLM, SGLang or TensorRT-LLM metrics in the response ({len(names)} metric(s): {shown}); "
            "is this the engine's metrics endpoint?"
        )

    def rank(engine: str) -> tuple[int, int]:
        has_kv = any(m in names for m in _KV_METRICS[engine])
        return (int(has_kv), counts[engine])

    return max(counts, key=rank)
