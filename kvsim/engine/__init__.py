"""Engine bridge: a real serving engine's KV usage, read from its metrics or start-up log.

- :mod:`kvsim.engine.metrics`: one scrape of vLLM, SGLang or TensorRT-LLM metrics ->
  :class:`EngineSnapshot` (engine detected from the metric names, :mod:`kvsim.engine.detect`);
- :mod:`kvsim.engine.poll`: fetch over http(s) with timeouts and a size limit, poll, and turn
  the scrapes into a measured Timeline (counters become rates);
- :mod:`kvsim.engine.logparse`: a vLLM start-up log's capacity lines, beside the planner's;
- :mod:`kvsim.engine.sample`: a bundled example (clearly labelled, not a measurement).
"""

from kvsim.engine.detect import ENGINE_LABELS, detect_engine
from kvsim.engine.logparse import (
    ComparisonRow, VllmLogCapacity, compare_log_with_plan, parse_vllm_log, plan_for_log,
)
from kvsim.engine.metrics import EngineSnapshot, parse_metrics
from kvsim.engine.poll import (
    DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, PollResult, Scrape, check_url, fetch_text, poll, scrape,
    scrapes_to_timeline,
)

__all__ = [
    "ENGINE_LABELS", "detect_engine", "EngineSnapshot", "parse_metrics",
    "VllmLogCapacity", "ComparisonRow", "parse_vllm_log", "plan_for_log", "compare_log_with_plan",
    "DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT_S", "PollResult", "Scrape", "check_url", "fetch_text",
    "poll", "scrape", "scrapes_to_timeline",
]
