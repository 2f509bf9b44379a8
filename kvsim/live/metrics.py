"""Serving metrics of a live run: latency percentiles, throughput and peaks.

- TTFT (time to first token): from the start of the step in which a request arrived to
  the end of the step that produced its first token;
- TPOT (time per output token): ``(finish - first token) / (output tokens - 1)`` per
  request with at least two output tokens;
- throughput: output tokens of all requests (every sample's) / the engine clock (the sum of step times;
  measuring the cache and the correctness checks run between steps and are not counted).

Times are in seconds on the engine clock; percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from kvsim.live.engine import EngineRun, RequestTrace


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of ``values``, NaN when there are none."""
    finite = [v for v in values if v == v]
    return float(np.percentile(finite, q)) if finite else math.nan


def ttft_s(traces: Iterable[RequestTrace]) -> list[float]:
    return [t.first_token_s - t.arrival_s for t in traces]


def tpot_s(traces: Iterable[RequestTrace]) -> list[float]:
    return [(t.finish_s - t.first_token_s) / (t.output_tokens - 1) for t in traces if t.output_tokens > 1]


def serving_metrics(run: EngineRun) -> dict:
    """Throughput, TTFT and TPOT (p50/p99, milliseconds) and counts of one engine run."""
    out_tokens = sum(t.output_tokens * t.samples for t in run.requests)
    ttft, tpot = ttft_s(run.requests), tpot_s(run.requests)
    return {
        "requests": len(run.requests),
        "finished": sum(1 for t in run.requests if t.finish_s == t.finish_s),
        "output_tokens": out_tokens,
        "elapsed_s": run.elapsed_s,
        "tokens_per_s": out_tokens / run.elapsed_s if run.elapsed_s > 0 else math.nan,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "tpot_p50_ms": 1e3 * percentile(tpot, 50),
        "tpot_p99_ms": 1e3 * percentile(tpot, 99),
        "preemptions": run.preemptions,
        "steps": run.steps,
        "peak_running": int(run.timeline["running"].max()) if len(run.timeline) else 0,
    }


def kv_agreement(timeline: pd.DataFrame) -> dict:
    """Measured beside predicted: peaks and the worst per-step difference, allocated and live bytes."""
    m, p = timeline["measured_kv_bytes"], timeline["predicted_kv_bytes"]
    ml, pl = timeline["live_bytes"], timeline["predicted_live_bytes"]
    peak_m, peak_p = int(m.max()), int(p.max())
    return {
        "measured_peak_kv_bytes": peak_m,
        "predicted_peak_kv_bytes": peak_p,
        "measured_peak_live_kv_bytes": int(ml.max()),
        "predicted_peak_live_kv_bytes": int(pl.max()),
        "peak_error_fraction": abs(peak_m - peak_p) / peak_p if peak_p else 0.0,
        "max_step_error_bytes": int(max((m - p).abs().max(), (ml - pl).abs().max())),
        "mismatched_steps": int(((m != p) | (ml != pl)).sum()),
    }


__all__ = ["serving_metrics", "kv_agreement", "percentile", "ttft_s", "tpot_s"]
