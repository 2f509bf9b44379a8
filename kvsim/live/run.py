"""One live experiment: the paged engine and the contiguous baseline over the same workload,
measured, checked against each other and recorded.

:func:`run_live` is what the CLI (``kvsim live``) and the Live page call. Its summary dict
holds the CLI's ``--json`` keys; :attr:`LiveResult.timeline` stacks both engines'
Timelines (``source`` = ``paged`` / ``contiguous``) for the figures and the CSV export.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import pandas as pd
import torch

from kvsim.errors import KvsimError
from kvsim.live.cache import torch_dtype
from kvsim.live.contiguous import ContiguousEngine
from kvsim.live.engine import EngineConfig, EngineRun, PagedEngine, ProgressFn
from kvsim.live.metrics import kv_agreement, serving_metrics
from kvsim.live.model import LiveModel, LiveModelConfig
from kvsim.live.record import build_record
from kvsim.live.requests import PreparedWorkload, prepare_requests
from kvsim.workloads import Workload


@dataclass(frozen=True)
class LiveSettings:
    """Everything a live run needs besides the workload (hashable: the page caches on it)."""

    model: LiveModelConfig
    engine: EngineConfig = field(default_factory=EngineConfig)
    dtype: str = "fp32"  # model and KV cache precision: fp32, fp16, bf16
    device: str = "auto"  # cpu, cuda or auto (cuda when available)
    max_len: int = 256  # longest request (lengths are scaled to fit); the contiguous reservation
    steps_per_s: float = 10.0  # workload seconds -> engine steps for arrivals
    contiguous: bool = True  # also run the contiguous baseline (and compare tokens)
    workload_seed: int = 0  # token ids of the prompts
    threads: int | None = 1  # torch CPU threads during the run (None: leave as is); 1 is fastest for tiny models


@dataclass
class LiveResult:
    paged: EngineRun
    contiguous: EngineRun | None
    prepared: PreparedWorkload
    summary: dict  # the CLI's --json object (record included)
    timeline: pd.DataFrame  # both engines' timelines stacked, column `source`

    @property
    def record(self) -> dict:
        return self.summary["record"]


def resolve_device(device: str) -> torch.device:
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise KvsimError("device cuda requested but no CUDA device is visible (torch.cuda.is_available() is False)")
        return torch.device(name)
    if name != "cpu":
        raise KvsimError(f"device must be cpu, cuda or auto, got {device!r}")
    return torch.device("cpu")


def default_num_blocks(prepared: PreparedWorkload, block_size: int, max_num_seqs: int) -> int:
    """A pool that never preempts: the largest requests at their final length, as many as
    ``max_num_seqs`` sequences allow (a request of ``n`` samples holds its prompt's full
    blocks once and ``n`` copies of the rest)."""
    fit = max(1, max_num_seqs // min(r.num_samples for r in prepared.requests))
    peaks = sorted((r.peak_blocks_for(block_size) for r in prepared.requests), reverse=True)[:fit]
    return max(1, sum(peaks))


def run_live(workload: Workload, settings: LiveSettings, progress: ProgressFn | None = None) -> LiveResult:
    """Run ``workload`` through the paged engine (and the contiguous baseline); measure and record."""
    device = resolve_device(settings.device)
    dtype = torch_dtype(settings.dtype)
    prepared = prepare_requests(workload, max_len=settings.max_len, vocab_size=settings.model.vocab_size,
                                seed=settings.workload_seed, steps_per_s=settings.steps_per_s)
    saved_threads = torch.get_num_threads()
    if settings.threads is not None and device.type == "cpu":
        if isinstance(settings.threads, bool) or not isinstance(settings.threads, int) or settings.threads <= 0:
            raise KvsimError(f"threads must be a positive integer, got {settings.threads!r}")
        torch.set_num_threads(settings.threads)
    try:
        model = LiveModel(settings.model, device=device, dtype=dtype)
        paged = PagedEngine(model, settings.engine, kv_dtype=settings.dtype)
        paged_progress = (lambda f, m: progress(f * (0.5 if settings.contiguous else 1.0), m)) if progress else None
        prun = paged.run(prepared.requests, paged_progress)
        crun = None
        if settings.contiguous:
            pool_bytes = paged.cache.pool_bytes
            del paged  # free the pool before the baseline allocates its reservations
            if device.type == "cuda":
                torch.cuda.empty_cache()
            cont = ContiguousEngine(model, max_len=settings.max_len, max_num_seqs=settings.engine.max_num_seqs,
                                    kv_dtype=settings.dtype)
            cont_progress = (lambda f, m: progress(0.5 + 0.5 * f, m)) if progress else None
            crun = cont.run(prepared.requests, cont_progress)
        else:
            pool_bytes = paged.cache.pool_bytes
    except torch.cuda.OutOfMemoryError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        raise KvsimError(f"CUDA out of memory ({first[:160]}); lower the pool size, the model size or max_len") from None
    except (ValueError, TypeError, RuntimeError) as exc:
        if isinstance(exc, KvsimError):
            raise
        if isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower():
            raise KvsimError(f"out of memory: {str(exc).splitlines()[0][:160]}; lower the pool size or the model size") from None
        if "backend" in str(exc) or "triton" in str(exc).lower():
            raise KvsimError(str(exc).splitlines()[0]) from None
        raise
    finally:
        torch.set_num_threads(saved_threads)

    summary = summarize(prun, crun, settings=settings, device=device, backend=_backend_name(settings, device),
                        prepared=prepared, pool_bytes=pool_bytes)
    frames = {"paged": prun.timeline}
    if crun is not None:
        frames["contiguous"] = crun.timeline
    timeline = pd.concat(list(frames.values()), ignore_index=True)
    return LiveResult(prun, crun, prepared, summary, timeline)


def _backend_name(settings: LiveSettings, device: torch.device) -> str:
    import kernels
    from kernels import _backend

    chosen = _backend.resolve(settings.engine.backend, device)
    return kernels.triton_mode() if chosen == "triton" else "torch"


def summarize(prun: EngineRun, crun: EngineRun | None, *, settings: LiveSettings, device: torch.device, backend: str,
              prepared: PreparedWorkload, pool_bytes: int) -> dict:
    """The CLI's JSON object: paged metrics, measured vs predicted, the baseline, the record."""
    agree = kv_agreement(prun.timeline)
    serving = serving_metrics(prun)
    tokens_match = None
    if crun is not None:
        tokens_match = prun.samples == crun.samples  # every sample of every request
    out = {
        "backend": backend,
        "device": str(device),
        "dtype": settings.dtype,
        "steps": prun.steps,
        **agree,
        "max_abs_error": prun.max_abs_error,
        "checked_steps": prun.checked_steps,
        "tokens_match": tokens_match,
        "layers_agree": prun.stats.get("layers_agree"),
        **{k: v for k, v in serving.items() if k != "steps"},
        "prefix_hit_blocks": prun.stats.get("prefix_hit_blocks"),
        "prefix_query_blocks": prun.stats.get("prefix_query_blocks"),
        "samples_per_request": max(r.num_samples for r in prepared.requests),
        "cow_copies": prun.stats.get("cow_copies"),
        "peak_retained_prefix_bytes": prun.stats.get("peak_retained_prefix_bytes"),
        "pool_bytes": pool_bytes,
    }
    for key in ("cuda_memory_allocated_bytes", "cuda_max_memory_allocated_bytes"):
        if key in prun.stats:
            out[key] = prun.stats[key]
    if crun is not None:
        cagree = kv_agreement(crun.timeline)
        cserv = serving_metrics(crun)
        out["contiguous"] = {
            "measured_peak_kv_bytes": cagree["measured_peak_kv_bytes"],
            "predicted_peak_kv_bytes": cagree["predicted_peak_kv_bytes"],
            "measured_peak_live_kv_bytes": cagree["measured_peak_live_kv_bytes"],
            "max_step_error_bytes": cagree["max_step_error_bytes"],
            "reservation_bytes": crun.stats["reservation_bytes"],
            **{k: cserv[k] for k in ("tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "steps", "peak_running")},
        }
        if "cuda_max_memory_allocated_bytes" in crun.stats:
            out["contiguous"]["cuda_max_memory_allocated_bytes"] = crun.stats["cuda_max_memory_allocated_bytes"]
        cm = cagree["measured_peak_kv_bytes"]
        out["paged_vs_contiguous_peak_ratio"] = agree["measured_peak_kv_bytes"] / cm if cm else math.nan
    engine_cfg = asdict(settings.engine)
    out["record"] = build_record(
        model_config=settings.model.to_dict(), dtype=settings.dtype, device=device, backend=backend,
        engine_config=engine_cfg, pool_bytes=pool_bytes,
        workload={"name": prepared.name, "description": prepared.description, "length_scale": prepared.scale,
                  "max_len": prepared.max_len, "steps_per_s": settings.steps_per_s,
                  "token_seed": settings.workload_seed, **prepared.length_stats()},
        extra={"bytes_per_token": settings.model.to_spec().bytes_per_token(settings.dtype),
               "contiguous_baseline": settings.contiguous,
               "cpu_threads": settings.threads if device.type == "cpu" else None},
    )
    return out


def with_pool(settings: LiveSettings, num_blocks: int) -> LiveSettings:
    """The same settings with another pool size."""
    return replace(settings, engine=replace(settings.engine, num_blocks=num_blocks))


__all__ = ["LiveSettings", "LiveResult", "run_live", "summarize", "resolve_device", "default_num_blocks", "with_pool"]
