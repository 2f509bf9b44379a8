"""Rate sweep: normalized latency against request rate, per memory strategy.

The PagedAttention paper's Figure 12 replays a workload at growing request rates and plots
*normalized latency* (each request's end-to-end latency divided by its output length,
averaged over requests): flat while the system keeps up, then exploding once the rate
passes what it can serve, because the queue grows without bound. A strategy that fits more
requests in the same KV memory batches more, and its curve explodes later.

This module replays one workload (its lengths) at each rate with arrivals re-drawn, under
each strategy, with the same KV memory, through the scheduler with the step-time cost
model (:mod:`kvsim.costmodel`) as its clock, and reports:

- per (strategy, rate): mean / p50 / p99 normalized latency, TTFT and TPOT p50,
  throughput (output tokens/s and requests/s), preemptions, the most sequences batched;
- per strategy: the *sustained rate*, the highest rate whose mean normalized latency stays
  within a latency bound. Between two swept rates that bracket the bound the crossing is
  interpolated linearly; a strategy within the bound at every swept rate is reported at
  the top of the grid (a lower bound, ``limit="grid top"``); one above it at the lowest
  rate has none (``limit="below grid"``).

The default latency bound is ``DEFAULT_LATENCY_FACTOR`` (5) times the *unloaded* normalized
latency: a lone request of the workload's mean prompt and output lengths on the idle GPU
(prefill, then one decode step per further token, each timed by the cost model). Five
times the unloaded figure is well past the flat part of every curve and well before the
explosion, so the sustained rate marks the knee, not noise.

Arrivals: ``"poisson"`` re-draws a Poisson process at each rate (the paper's method);
``"scaled"`` keeps a timed trace's own inter-arrival pattern (bursts included) and
stretches or compresses it to each mean rate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from kvsim.capacity import WEIGHT_DTYPE_BYTES, plan_capacity
from kvsim.costmodel import CostModel
from kvsim.errors import KvsimError
from kvsim.scheduler import SchedulerConfig
from kvsim.simulate import simulate
from kvsim.strategies import PAPER_NAMES, parse_strategy
from kvsim.workloads import Workload, poisson_arrivals

DEFAULT_STRATEGIES = ("reserve-max", "pow2", "oracle", "paged")
DEFAULT_LATENCY_FACTOR = 5.0

#: What the PagedAttention paper reports (Kwon et al., SOSP 2023, section 6.2, Figure 12,
#: ShareGPT, basic sampling): vLLM sustains these multiples of each baseline's request
#: rate "while maintaining similar latencies", over OPT-13B/66B/175B; and its headline,
#: "2-4x" throughput at the same latency over FasterTransformer and Orca.
PAPER_RATE_GAINS: dict[str, tuple[float, float]] = {"oracle": (1.7, 2.7), "reserve-max": (2.7, 8.0)}
PAPER_HEADLINE = "2-4x throughput at the same latency (vs FasterTransformer and Orca)"
PAPER_SOURCE = "Kwon et al., Efficient Memory Management for LLM Serving with PagedAttention (SOSP 2023), sec. 6.2, Fig. 12"

TABLE_COLUMNS = (
    "strategy", "rate_per_s", "normalized_latency_s", "normalized_latency_p50_s", "normalized_latency_p99_s",
    "ttft_p50_s", "tpot_p50_s", "throughput_tokens_per_s", "throughput_requests_per_s", "finished", "dropped",
    "preemptions", "max_running", "duration_s",
)


@dataclass(frozen=True)
class RateSweepResult:
    """A finished sweep: the table, each strategy's sustained rate, and what it assumed."""

    table: pd.DataFrame  # one row per (strategy, rate): TABLE_COLUMNS
    sustained: pd.DataFrame  # one row per strategy: strategy, sustained_rate_per_s, limit
    latency_bound_s: float  # normalized-latency bound the sustained rates use
    unloaded_latency_s: float  # normalized latency of a lone mean request on the idle GPU
    workload: str  # name and description of the workload
    num_requests: int  # requests replayed at each rate
    arrivals: str  # "poisson" or "scaled"
    model: str  # CostModel.describe()
    kv_memory_bytes: int  # KV memory every strategy gets (per rank)
    block_size: int
    max_len: int

    def sustained_rate(self, strategy: str) -> float | None:
        row = self.sustained[self.sustained["strategy"] == strategy]
        if row.empty:
            raise KvsimError(f"strategy {strategy!r} was not swept")
        value = row["sustained_rate_per_s"].iloc[0]
        return None if value is None or (isinstance(value, float) and np.isnan(value)) else float(value)

    def gain(self, strategy: str = "paged", baseline: str = "reserve-max") -> float | None:
        """Sustained rate of ``strategy`` over ``baseline`` (None when either has none)."""
        a, b = self.sustained_rate(strategy), self.sustained_rate(baseline)
        return None if a is None or b is None or b == 0 else a / b

    def comparison(self) -> pd.DataFrame:
        """Paged's gain over each baseline beside the paper's reported range."""
        rows = []
        for base in self.sustained["strategy"]:
            if base == "paged":
                continue
            lo_hi = PAPER_RATE_GAINS.get(base)
            rows.append({
                "baseline": base,
                "paper_name": PAPER_NAMES.get(base, base),
                "simulator_gain": self.gain("paged", base) if "paged" in set(self.sustained["strategy"]) else None,
                "paper_gain": f"{lo_hi[0]:g}-{lo_hi[1]:g}x" if lo_hi else "not reported",
            })
        return pd.DataFrame(rows, columns=["baseline", "paper_name", "simulator_gain", "paper_gain"])

    def describe(self) -> str:
        """One line naming every input, for captions."""
        return (f"{self.workload}, {self.num_requests:,} requests per rate, {self.arrivals} arrivals; {self.model}; "
                f"KV memory {self.kv_memory_bytes / 2**30:.2f} GiB, block {self.block_size}, max_len {self.max_len:,}; "
                f"latency bound {self.latency_bound_s:.3g} s/token")

    def to_dict(self) -> dict:
        return {
            "latency_bound_s": self.latency_bound_s,
            "unloaded_latency_s": self.unloaded_latency_s,
            "workload": self.workload,
            "num_requests": self.num_requests,
            "arrivals": self.arrivals,
            "model": self.model,
            "kv_memory_bytes": self.kv_memory_bytes,
            "block_size": self.block_size,
            "max_len": self.max_len,
            "sustained": _records(self.sustained),
            "comparison": _records(self.comparison()),
            "paper": {"rate_gains": {k: list(v) for k, v in PAPER_RATE_GAINS.items()},
                      "headline": PAPER_HEADLINE, "source": PAPER_SOURCE},
            "table": _records(self.table),
        }


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
            for row in df.to_dict(orient="records")]


def _workload_label(workload: Workload) -> str:
    """Name and lengths of the workload; its own arrival mode is dropped (the sweep re-times it)."""
    desc = re.sub(r",?\s*arrivals [^,;)]*", "", workload.description or "").strip(" ,;")
    stats = workload.stats()
    lengths = f"mean prompt {stats['mean_prompt_tokens']:.0f}, output {stats['mean_output_tokens']:.0f} tokens"
    if desc.startswith(workload.name):
        return f"{desc}; {lengths}"
    return f"{workload.name} ({desc}; {lengths})" if desc else f"{workload.name} ({lengths})"


def sustained_rate(rates: Sequence[float], latencies: Sequence[float | None], bound_s: float) -> tuple[float | None, str]:
    """The highest rate whose latency stays within ``bound_s``, and how it was found.

    Rates are sorted ascending; a missing latency (nothing finished) counts as over the
    bound. The first rate over the bound ends the search: the crossing is interpolated
    linearly between it and the rate before (``"crossing"``); no rate over the bound gives
    the top of the grid (``"grid top"``, a lower bound); the lowest already over gives None
    (``"below grid"``).
    """
    order = np.argsort(np.asarray(rates, dtype=float), kind="stable")
    r = [float(rates[i]) for i in order]
    lat = [latencies[i] for i in order]
    for i, value in enumerate(lat):
        over = value is None or not np.isfinite(value) or value > bound_s
        if not over:
            continue
        if i == 0:
            return None, "below grid"
        prev = float(lat[i - 1])
        if value is None or not np.isfinite(value):
            return r[i - 1], "crossing"
        frac = (bound_s - prev) / (float(value) - prev) if value > prev else 0.0
        return r[i - 1] + frac * (r[i] - r[i - 1]), "crossing"
    return (r[-1], "grid top") if r else (None, "below grid")


def unloaded_normalized_latency(model: CostModel, prompt_tokens: int, output_tokens: int) -> float:
    """Normalized latency of one request alone on the idle GPU: its prefill step, then one
    decode step at each context ``P + k`` for ``k = 1 .. O-1``, divided by ``O``."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise KvsimError("a request needs at least one prompt and one output token")
    total = model.step_cost(prefill_tokens=[prompt_tokens]).time_s
    for k in range(1, output_tokens):
        total += model.step_cost(decode_context=[prompt_tokens + k]).time_s
    return total / output_tokens


def with_rate(workload: Workload, rate_per_s: float, arrivals: str = "poisson", seed: int = 0) -> Workload:
    """The workload's requests arriving at mean ``rate_per_s`` (see the module docstring)."""
    if arrivals == "poisson":
        return workload.with_poisson_arrivals(rate_per_s, seed)
    if arrivals == "scaled":
        if not workload.timed or len(workload) < 2:
            raise KvsimError("scaled arrivals need a timed trace of at least two requests")
        t = np.array([r.arrival_s for r in workload.requests], dtype=float)
        t = t - t[0]
        span = t[-1]
        if span <= 0:
            raise KvsimError("scaled arrivals need a trace whose arrivals span some time")
        # The trace's own mean rate is (n - 1) / span; stretch it to the target rate.
        scale = (len(t) - 1) / span / rate_per_s
        times = t * scale
        return replace(workload, requests=tuple(replace(r, arrival_s=float(x)) for r, x in zip(workload.requests, times)))
    raise KvsimError(f"unknown arrivals {arrivals!r}; use poisson or scaled")


def rate_sweep(
    workload: Workload,
    model: CostModel,
    rates: Sequence[float],
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    *,
    kv_memory_bytes: int | None = None,
    block_size: int = 16,
    max_len: int | None = None,
    scheduler: SchedulerConfig | None = None,
    latency_bound_s: float | None = None,
    arrivals: str = "poisson",
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
) -> RateSweepResult:
    """Replay ``workload`` at each rate under each strategy (see the module docstring).

    ``kv_memory_bytes`` defaults to the capacity planner's KV budget for the cost model's
    model and GPU (0.9 of memory, weights, 1 GiB reserve); ``max_len`` to the model's
    context (what reserve-max reserves per request).
    """
    rate_list = [float(r) for r in rates]
    if not rate_list:
        raise KvsimError("give at least one request rate")
    if any(not np.isfinite(r) or r <= 0 for r in rate_list):
        raise KvsimError(f"request rates must be positive numbers, got {rates!r}")
    names = list(strategies)
    if not names:
        raise KvsimError("choose at least one strategy")
    for name in names:
        parse_strategy(name)
    if arrivals not in ("poisson", "scaled"):
        raise KvsimError(f"unknown arrivals {arrivals!r}; use poisson or scaled")
    spec = model.spec
    if max_len is None:
        max_len = spec.max_position_embeddings or max(r.final_len for r in workload.requests)
    if kv_memory_bytes is None:
        plan = plan_capacity(spec, model.gpu, kv_dtype=model.kv_dtype, tp=model.tp, block_size=block_size,
                             weight_dtype=model.weight_dtype, max_len=max_len,
                             weights_override_bytes=None if spec.num_params else
                             int(np.ceil(model.num_params * WEIGHT_DTYPE_BYTES[model.weight_dtype] / model.tp)))
        kv_memory_bytes = plan.kv_budget_bytes
    if latency_bound_s is None:
        stats = workload.stats()
        unloaded = unloaded_normalized_latency(model, max(1, round(stats["mean_prompt_tokens"])),
                                               max(1, round(stats["mean_output_tokens"])))
        latency_bound_s = DEFAULT_LATENCY_FACTOR * unloaded
    else:
        if not (isinstance(latency_bound_s, (int, float)) and np.isfinite(latency_bound_s) and latency_bound_s > 0):
            raise KvsimError(f"latency bound must be a positive number of seconds, got {latency_bound_s!r}")
        stats = workload.stats()
        unloaded = unloaded_normalized_latency(model, max(1, round(stats["mean_prompt_tokens"])),
                                               max(1, round(stats["mean_output_tokens"])))

    rows = []
    total = len(names) * len(rate_list)
    done = 0
    for rate in sorted(rate_list):
        timed = with_rate(workload, rate, arrivals, seed)
        for name in names:
            sub = None if progress is None else (lambda f, d=done: progress((d + f) / total))
            res = simulate(timed, spec, strategy=name, block_size=block_size, kv_dtype=model.kv_dtype, tp=model.tp,
                           kv_memory_bytes=int(kv_memory_bytes), max_len=int(max_len), scheduler=scheduler,
                           step_time_fn=model, progress=sub)
            lat = res.summary.latency or {}
            norm = res.requests["normalized_latency_s"].dropna() if "normalized_latency_s" in res.requests else pd.Series([], dtype=float)
            rows.append({
                "strategy": res.label, "rate_per_s": rate,
                "normalized_latency_s": float(norm.mean()) if len(norm) else None,
                "normalized_latency_p50_s": lat.get("normalized_latency_p50_s"),
                "normalized_latency_p99_s": lat.get("normalized_latency_p99_s"),
                "ttft_p50_s": lat.get("ttft_p50_s"), "tpot_p50_s": lat.get("tpot_p50_s"),
                "throughput_tokens_per_s": lat.get("throughput_tokens_per_s"),
                "throughput_requests_per_s": lat.get("throughput_requests_per_s"),
                "finished": res.summary.finished, "dropped": res.summary.dropped,
                "preemptions": res.summary.preemptions, "max_running": res.summary.max_running,
                "duration_s": res.summary.duration_s,
            })
            done += 1
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    sust = []
    for label in dict.fromkeys(table["strategy"]):
        part = table[table["strategy"] == label]
        rate, how = sustained_rate(part["rate_per_s"].tolist(), part["normalized_latency_s"].tolist(), latency_bound_s)
        sust.append({"strategy": label, "sustained_rate_per_s": rate, "limit": how})
    if progress is not None:
        progress(1.0)
    return RateSweepResult(
        table=table, sustained=pd.DataFrame(sust, columns=["strategy", "sustained_rate_per_s", "limit"]),
        latency_bound_s=float(latency_bound_s), unloaded_latency_s=float(unloaded),
        workload=_workload_label(workload),
        num_requests=len(workload), arrivals=arrivals, model=model.describe(),
        kv_memory_bytes=int(kv_memory_bytes), block_size=int(block_size), max_len=int(max_len),
    )


__all__ = [
    "rate_sweep", "RateSweepResult", "sustained_rate", "unloaded_normalized_latency", "with_rate",
    "DEFAULT_STRATEGIES", "DEFAULT_LATENCY_FACTOR", "PAPER_RATE_GAINS", "PAPER_HEADLINE", "PAPER_SOURCE",
    "TABLE_COLUMNS",
]
