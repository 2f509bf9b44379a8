"""Replay a workload through a memory strategy and a continuous-batching scheduler.

Entry points (the CLI and the pages use these):

``simulate(workload, spec, *, strategy="paged", block_size=16, prefix_caching=False,
kv_dtype="fp16", tp=1, num_blocks=None, kv_memory_bytes=None, max_len=None,
scheduler=SchedulerConfig(), step_time_fn=None, event_driven=True, progress=None) -> SimResult``
    One replay. Memory is ``num_blocks`` blocks, or ``kv_memory_bytes`` bytes, or, with
    neither, unlimited (enough for every request at once). ``progress(fraction)`` is
    called as requests finish (at most about a hundred times).

``run_strategies(workload, spec, strategies=("reserve-max", "pow2", "oracle", "paged"),
*, progress=None, **simulate_kwargs) -> dict[str, SimResult]``
    The same workload and memory under several strategies (``"paged+prefix"`` names paged
    with prefix caching); ``progress`` runs from 0 to 1 over all of them.

``sweep_block_sizes(workload, spec, block_sizes, **simulate_kwargs) -> pandas.DataFrame``
    One summary row per block size (paged).

A :class:`SimResult` has ``timeline`` (a Timeline, :mod:`kvsim.timeline`: one row per
step with ``step, time_s, running, waiting, live_bytes, allocated_bytes, reserved_bytes,
internal_frag_bytes, external_frag_bytes, free_bytes, capacity_bytes, shared_saved_bytes,
prefix_hit_blocks, prefix_query_blocks, preemptions, finished, dropped,
kv_usage_fraction, source`` and, with a time model, ``step_time_s``), ``summary`` (a
:class:`SimSummary`; ``summary.to_dict()`` is the CLI's ``--json``) and ``requests`` (one row
per request: when it started and finished, preemptions, why it was dropped, and with a
time model its latencies).

How the summary fractions are computed. For each step the KV memory in use is
``allocated + external fragmentation`` (token states + reservation + internal + external).
``token_state_fraction`` is the time integral of ``live_bytes`` divided by the time
integral of that total, over the whole replay (steps weighted by their duration: one unit
each without a time model); likewise ``reservation_fraction``, ``internal_fraction`` and
``external_fraction``; the four add up to 1. This is the paper's Figure 2 "average
percentage of memory" over a serving run, weighted towards busy steps (an idle step adds
nothing).

Bytes are per tensor-parallel rank, every layer counted as full attention (the simulator
does not model sliding-window eviction).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from kvsim.calculator import check_block_size
from kvsim.errors import KvsimError
from kvsim.scheduler import ArenaMemory, Engine, PagedMemory, SchedulerConfig, StepTimeFn
from kvsim.spec import ModelSpec, canonical_dtype
from kvsim.strategies import PAGED, parse_strategy, reservation_tokens
from kvsim.timeline import make_timeline
from kvsim.workloads import Workload

#: Keys ``SimSummary.to_dict()`` always has (the CLI's --json contract).
SUMMARY_KEYS = (
    "peak_allocated_bytes", "peak_live_bytes", "token_state_fraction", "reservation_fraction",
    "internal_fraction", "external_fraction", "preemptions", "finished", "dropped", "max_running",
    "mean_running", "prefix_hit_blocks", "prefix_query_blocks", "steps",
)


@dataclass(frozen=True)
class SimSummary:
    """Whole-run figures of one replay."""

    strategy: str  # reserve-max | pow2 | oracle | paged
    prefix_caching: bool
    block_size: int  # tokens per block (paged; reported for all)
    model: str
    bytes_per_token: int  # KV bytes per token per rank
    capacity_bytes: int  # KV memory of the pool or arena
    num_blocks: int | None  # blocks in the pool (paged)
    unlimited_memory: bool  # memory sized to hold every request at once
    requests: int  # requests in the workload
    finished: int
    dropped: int  # requests that can never fit
    preemptions: int  # recompute preemptions
    steps: int  # engine steps (Timeline rows)
    duration_s: float  # time_s of the last step (steps without a time model)
    peak_allocated_bytes: int
    peak_live_bytes: int
    token_state_fraction: float  # time-integrated live / (allocated + external)
    reservation_fraction: float
    internal_fraction: float
    external_fraction: float
    max_running: int  # most sequences in one step
    mean_running: float  # time-weighted mean of running sequences
    prefix_hit_blocks: int  # prompt blocks served from the prefix cache
    prefix_query_blocks: int  # prompt blocks looked up
    prefix_hit_rate: float  # hits / queries (0 without lookups)
    peak_shared_saved_bytes: int  # most bytes sharing saved in one step
    drop_reasons: dict = field(default_factory=dict)  # reason -> count
    latency: dict | None = None  # time model only: ttft/tpot/normalized latency p50/p99, throughput

    def to_dict(self) -> dict:
        data = asdict(self)
        latency = data.pop("latency")
        if latency is not None:
            data.update(latency)
        return data


@dataclass
class SimResult:
    """A replay: its Timeline, its summary and per-request outcomes."""

    label: str  # e.g. "paged", "paged+prefix", "reserve-max"
    timeline: pd.DataFrame
    summary: SimSummary
    requests: pd.DataFrame


def _memory_for(strategy, prefix, workload, block_size, bpt, num_blocks, kv_memory_bytes, max_len):
    unlimited = num_blocks is None and kv_memory_bytes is None
    if strategy == PAGED:
        probe = PagedMemory(1, block_size, bpt)
        if num_blocks is not None:
            nb = num_blocks
        elif kv_memory_bytes is not None:
            nb = int(kv_memory_bytes) // (block_size * bpt)
            if nb <= 0:
                raise KvsimError(f"{kv_memory_bytes} bytes of KV memory hold no block of {block_size * bpt} bytes")
        else:
            nb = max(1, sum(probe.peak_blocks(r) for r in workload.requests if r.final_len <= max_len))
        return PagedMemory(nb, block_size, bpt, prefix_caching=prefix, hash_block_size=workload.hash_block_size), unlimited
    if prefix:
        raise KvsimError("prefix caching needs the paged strategy")
    if num_blocks is not None:
        cap = num_blocks * block_size
    elif kv_memory_bytes is not None:
        cap = int(kv_memory_bytes) // bpt
        if cap <= 0:
            raise KvsimError(f"{kv_memory_bytes} bytes of KV memory hold no token of {bpt} bytes")
    else:
        cap = max(1, sum(reservation_tokens(strategy, r.final_len, max_len) * r.num_seqs
                         for r in workload.requests if r.final_len <= max_len))
    return ArenaMemory(strategy, cap, bpt, max_len), unlimited


def simulate(
    workload: Workload,
    spec: ModelSpec | None = None,
    *,
    strategy: str = "paged",
    block_size: int = 16,
    prefix_caching: bool = False,
    kv_dtype: str = "fp16",
    tp: int = 1,
    num_blocks: int | None = None,
    kv_memory_bytes: int | None = None,
    max_len: int | None = None,
    scheduler: SchedulerConfig | None = None,
    step_time_fn: StepTimeFn | None = None,
    event_driven: bool = True,
    progress: Callable[[float], None] | None = None,
    bytes_per_token: int | None = None,
    label: str | None = None,
) -> SimResult:
    """Replay ``workload`` (see the module docstring)."""
    if not isinstance(workload, Workload):
        raise KvsimError("simulate needs a Workload (kvsim.workloads / kvsim.traces)")
    block_size = check_block_size(block_size)
    strat, prefix_alias = parse_strategy(strategy)
    prefix = bool(prefix_caching) or prefix_alias
    if num_blocks is not None and kv_memory_bytes is not None:
        raise KvsimError("give the KV memory as blocks or as bytes, not both")
    if num_blocks is not None and (isinstance(num_blocks, bool) or not isinstance(num_blocks, (int, np.integer)) or num_blocks <= 0):
        raise KvsimError(f"number of blocks must be a positive integer, got {num_blocks!r}")
    if kv_memory_bytes is not None and (isinstance(kv_memory_bytes, bool) or not kv_memory_bytes > 0):
        raise KvsimError(f"KV memory must be a positive number of bytes, got {kv_memory_bytes!r}")
    if bytes_per_token is None:
        if spec is None:
            raise KvsimError("give a model spec or bytes_per_token")
        bytes_per_token = spec.bytes_per_token(canonical_dtype(kv_dtype), tp)
    model = spec.name if spec is not None else "custom"
    if max_len is None:
        max_len = (spec.max_position_embeddings if spec is not None else 0) or max(r.final_len for r in workload.requests)
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len <= 0:
        raise KvsimError(f"max_len must be a positive integer, got {max_len!r}")
    cfg = scheduler or SchedulerConfig()
    mem, unlimited = _memory_for(strat, prefix, workload, block_size, int(bytes_per_token),
                                 None if num_blocks is None else int(num_blocks), kv_memory_bytes, int(max_len))
    engine = Engine(workload, mem, cfg, int(max_len), step_time_fn, progress)
    log = engine.run_events() if event_driven else engine.run_steps()
    name = label or (strat + ("+prefix" if prefix else ""))
    timeline = _timeline(log, mem, name)
    summary = _summary(log, timeline, workload, mem, strat, prefix, block_size, model, unlimited)
    if progress is not None:
        progress(1.0)
    return SimResult(name, timeline, summary, _requests_frame(workload, log))


def _timeline(log, mem, name: str) -> pd.DataFrame:
    r = log.rows
    bpt = mem.bytes_per_token
    steps = r["step"]
    data = {
        "step": steps,
        "time_s": log.step_end_s if log.step_end_s is not None else steps.astype(float),
        "running": r["running"],
        "waiting": r["waiting"],
        "live_bytes": r["live_tokens"] * bpt,
        "allocated_bytes": r["allocated_bytes"],
        "reserved_bytes": r["reserved_bytes"],
        "internal_frag_bytes": r["internal_frag_bytes"],
        "external_frag_bytes": r["external_frag_bytes"],
        "free_bytes": r["free_bytes"],
        "capacity_bytes": np.full(steps.size, mem.capacity_bytes, dtype=np.int64),
        "shared_saved_bytes": r["shared_saved_bytes"],
        "prefix_hit_blocks": r["prefix_hit_blocks"],
        "prefix_query_blocks": r["prefix_query_blocks"],
        "preemptions": r["preemptions"],
        "finished": r["finished"],
        "dropped": r["dropped"],
        "kv_usage_fraction": r["allocated_bytes"] / mem.capacity_bytes,
    }
    if log.step_end_s is not None:
        data["step_time_s"] = log.step_time_s  # the model's durations; idle gaps between steps excluded
    df = pd.DataFrame(data)
    df["source"] = name
    return make_timeline(df)


def _summary(log, tl: pd.DataFrame, workload, mem, strat, prefix, block_size, model, unlimited) -> SimSummary:
    n = len(tl)
    if n:
        w = tl["step_time_s"].to_numpy() if "step_time_s" in tl else np.ones(n)
        live = tl["live_bytes"].to_numpy(dtype=float)
        res = tl["reserved_bytes"].to_numpy(dtype=float)
        internal = tl["internal_frag_bytes"].to_numpy(dtype=float)
        ext = tl["external_frag_bytes"].to_numpy(dtype=float)
        total = float(np.dot(w, live + res + internal + ext))
        frac = (lambda x: float(np.dot(w, x)) / total) if total > 0 else (lambda x: 0.0)
        wsum = float(w.sum())
        mean_running = float(np.dot(w, tl["running"].to_numpy(dtype=float)) / wsum) if wsum > 0 else 0.0
        last = tl.iloc[-1]
        peak_alloc, peak_live = int(tl["allocated_bytes"].max()), int(tl["live_bytes"].max())
        max_running = int(tl["running"].max())
        hits, queries = int(last["prefix_hit_blocks"]), int(last["prefix_query_blocks"])
        duration = float(last["time_s"])
        peak_saved = int(tl["shared_saved_bytes"].max())
    else:
        frac = lambda x: 0.0  # noqa: E731
        live = res = internal = ext = None
        mean_running, peak_alloc, peak_live, max_running, hits, queries, duration, peak_saved = 0.0, 0, 0, 0, 0, 0, 0.0, 0
    reasons: dict[str, int] = {}
    for why in log.drop_reasons.values():
        key = why.split(",")[0] if "exceeds max_len" in why else why
        reasons[key] = reasons.get(key, 0) + 1
    latency = _latency(log, workload) if log.step_end_s is not None else None
    return SimSummary(
        strategy=strat, prefix_caching=prefix, block_size=block_size, model=model,
        bytes_per_token=mem.bytes_per_token, capacity_bytes=int(mem.capacity_bytes),
        num_blocks=mem.pool.num_blocks if strat == PAGED else None, unlimited_memory=unlimited,
        requests=len(workload), finished=int((log.finish_step >= 0).sum()), dropped=len(log.drop_reasons),
        preemptions=int(log.preempted.sum()), steps=n, duration_s=duration,
        peak_allocated_bytes=peak_alloc, peak_live_bytes=peak_live,
        token_state_fraction=frac(live), reservation_fraction=frac(res),
        internal_fraction=frac(internal), external_fraction=frac(ext),
        max_running=max_running, mean_running=mean_running,
        prefix_hit_blocks=hits, prefix_query_blocks=queries,
        prefix_hit_rate=hits / queries if queries else 0.0, peak_shared_saved_bytes=peak_saved,
        drop_reasons=reasons, latency=latency,
    )


def _latency(log, workload) -> dict:
    ends = log.step_end_s
    done = np.flatnonzero(log.finish_step >= 0)
    out: dict = {}
    if done.size == 0 or ends.size == 0:
        return {"ttft_p50_s": None, "ttft_p99_s": None, "tpot_p50_s": None, "tpot_p99_s": None,
                "normalized_latency_p50_s": None, "normalized_latency_p99_s": None,
                "throughput_tokens_per_s": 0.0, "throughput_requests_per_s": 0.0}
    reqs = workload.requests
    arrival = np.array([reqs[i].arrival_s for i in done])
    outputs = np.array([reqs[i].output_tokens for i in done], dtype=float)
    seqs = np.array([reqs[i].num_seqs for i in done], dtype=float)
    first = ends[log.first_step[done]]
    finish = ends[log.finish_step[done]]
    ttft = first - arrival
    multi = outputs > 1
    tpot = (finish[multi] - first[multi]) / (outputs[multi] - 1)
    norm = (finish - arrival) / outputs
    span = float(ends[-1])
    for name, arr in (("ttft", ttft), ("tpot", tpot), ("normalized_latency", norm)):
        out[f"{name}_p50_s"] = float(np.percentile(arr, 50)) if arr.size else None
        out[f"{name}_p99_s"] = float(np.percentile(arr, 99)) if arr.size else None
    out["throughput_tokens_per_s"] = float((outputs * seqs).sum() / span) if span > 0 else 0.0
    out["throughput_requests_per_s"] = float(done.size / span) if span > 0 else 0.0
    return out


def _requests_frame(workload, log) -> pd.DataFrame:
    reqs = workload.requests
    df = pd.DataFrame({
        "request": np.arange(len(reqs)),
        "arrival_s": [r.arrival_s for r in reqs],
        "prompt_tokens": [r.prompt_tokens for r in reqs],
        "output_tokens": [r.output_tokens for r in reqs],
        "num_seqs": [r.num_seqs for r in reqs],
        "first_step": log.first_step,
        "finish_step": log.finish_step,
        "preemptions": log.preempted,
        "dropped": [log.drop_reasons.get(i, "") for i in range(len(reqs))],
    })
    if log.step_end_s is not None and log.step_end_s.size:
        ends = log.step_end_s
        ok = df["finish_step"].to_numpy() >= 0
        first = np.where(ok, ends[np.maximum(df["first_step"].to_numpy(), 0)], np.nan)
        fin = np.where(ok, ends[np.maximum(df["finish_step"].to_numpy(), 0)], np.nan)
        df["ttft_s"] = first - df["arrival_s"]
        df["e2e_s"] = fin - df["arrival_s"]
        df["normalized_latency_s"] = df["e2e_s"] / df["output_tokens"]
    return df


def run_strategies(
    workload: Workload,
    spec: ModelSpec | None = None,
    strategies: Sequence[str] = ("reserve-max", "pow2", "oracle", "paged"),
    *,
    progress: Callable[[float], None] | None = None,
    **kwargs,
) -> dict[str, SimResult]:
    """Replay one workload under several strategies with the same memory.

    Returns ``{label: SimResult}`` in the order given; labels are the strategy names
    (``paged+prefix`` for paged with prefix caching). ``progress(fraction)`` covers all runs.
    """
    names = list(strategies)
    if not names:
        raise KvsimError("choose at least one strategy")
    out: dict[str, SimResult] = {}
    k = len(names)
    for i, name in enumerate(names):
        strat, prefix = parse_strategy(name)
        label = strat + ("+prefix" if prefix or (kwargs.get("prefix_caching") and strat == PAGED) else "")
        sub = None if progress is None else (lambda f, i=i: progress((i + f) / k))
        kw = dict(kwargs)
        if strat != PAGED:
            kw["prefix_caching"] = False
        out[label] = simulate(workload, spec, strategy=strat, prefix_caching=prefix or kw.pop("prefix_caching", False),
                              progress=sub, label=label, **kw)
    return out


def sweep_block_sizes(
    workload: Workload,
    spec: ModelSpec | None = None,
    block_sizes: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    **kwargs,
) -> pd.DataFrame:
    """One summary row per block size for the paged strategy (same workload and memory)."""
    rows = []
    for B in block_sizes:
        res = simulate(workload, spec, block_size=B, strategy="paged", **kwargs)
        rows.append(res.summary.to_dict())
    return pd.DataFrame(rows)


__all__ = ["simulate", "run_strategies", "sweep_block_sizes", "SimResult", "SimSummary", "SUMMARY_KEYS"]
