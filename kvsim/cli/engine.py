"""`kvsim engine`: a running engine's KV usage from its metrics, or its start-up log's capacity.

    kvsim engine --url http://localhost:8000/metrics [--samples N] [--interval S] [--timeout S] [--json]
    kvsim engine --log vllm.log [--model ID --gpu ID [--gpu-util F]] [--json]

With ``--model`` the engine's used tokens become bytes; with ``--model`` and ``--gpu`` the
planner's capacity for the same settings sits beside the engine's.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from kvsim.capacity import DEFAULT_GPU_UTIL, WEIGHT_DTYPE_BYTES, plan_capacity
from kvsim.cli._common import (
    add_gpu_args, add_model_args, emit, nonnegative_float, positive_float, positive_int, resolve_gpu,
    resolve_model,
)
from kvsim.engine.detect import ENGINE_LABELS
from kvsim.engine.logparse import compare_log_with_plan, parse_vllm_log, plan_for_log
from kvsim.engine.poll import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, MAX_SAMPLES, poll, scrapes_to_timeline
from kvsim.errors import KvsimError
from kvsim.units import GiB, fmt_bytes

MAX_LOG_BYTES = 64 * 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="a serving engine's measured KV usage (metrics URL or start-up log)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="the engine's Prometheus endpoint, e.g. http://localhost:8000/metrics "
                                   "(no path: /metrics)")
    src.add_argument("--log", metavar="PATH", help="a vLLM start-up log ('-' reads standard input)")
    p.add_argument("--samples", type=positive_int, default=1, help=f"scrapes to take (default 1, at most {MAX_SAMPLES:,})")
    p.add_argument("--interval", type=nonnegative_float, default=1.0, help="seconds between scrapes (default 1)")
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds to wait for each scrape (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--max-bytes", type=positive_int, default=DEFAULT_MAX_BYTES,
                   help=f"refuse responses larger than this (default {DEFAULT_MAX_BYTES:,})")
    add_model_args(p)
    add_gpu_args(p)
    p.add_argument("--gpu-util", type=positive_float, help="gpu_memory_utilization for the planner "
                                                           "(default: the engine's, else 0.9)")
    p.add_argument("--block-size", type=positive_int, help="tokens per block for the planner (default: the engine's, else 16)")
    p.add_argument("--weights-gib", type=nonnegative_float, help="weights per rank in GiB (default: estimated)")
    p.add_argument("--weight-dtype", default="bf16", choices=sorted(WEIGHT_DTYPE_BYTES), help="for the weight estimate")
    p.add_argument("--reserve-gib", type=nonnegative_float, default=1.0, help="activations and buffers per rank, GiB (default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _has_model(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.model, args.config, args.layers, args.kv_heads, args.head_dim))


def _has_gpu(args: argparse.Namespace) -> bool:
    return args.gpu is not None or args.gpu_memory_gib is not None


def _clean(value):
    """NaN -> None, numpy scalars -> Python, for JSON."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run(args: argparse.Namespace) -> int:
    if args.log is not None:
        return _run_log(args)
    return _run_url(args)


def _plan_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        weight_dtype=args.weight_dtype,
        weights_override_bytes=None if args.weights_gib is None else int(args.weights_gib * GiB),
        reserve_bytes=int(args.reserve_gib * GiB),
    )


def _run_url(args: argparse.Namespace) -> int:
    if args.samples > MAX_SAMPLES:
        raise KvsimError(f"--samples is at most {MAX_SAMPLES:,}")
    spec = resolve_model(args) if _has_model(args) else None
    gpu = resolve_gpu(args) if _has_gpu(args) else None
    if gpu is not None and spec is None:
        raise KvsimError("--gpu needs a model (--model NAME) to predict a capacity")

    def progress(item) -> None:
        if not args.json and args.samples > 1:
            s = item.snapshot
            usage = "?" if s.kv_usage_fraction is None else f"{s.kv_usage_fraction:.1%}"
            print(f"  t={item.time_s:6.1f}s  KV {usage:>6}  running {s.num_running}  waiting {s.num_waiting}",
                  file=sys.stderr)

    result = poll(args.url, samples=args.samples, interval_s=args.interval, timeout_s=args.timeout,
                  max_bytes=args.max_bytes, on_scrape=progress)
    last = result.scrapes[-1].snapshot
    bpt = spec.bytes_per_token(args.kv_dtype, args.tp) if spec is not None else None
    timeline = scrapes_to_timeline(result.scrapes, bytes_per_token=bpt)
    data = {
        "engine": last.engine,
        "engine_label": ENGINE_LABELS[last.engine],
        "url": result.url,
        "kv_usage_fraction": last.kv_usage_fraction,
        "num_running": last.num_running,
        "num_waiting": last.num_waiting,
        "num_preemptions": last.num_preemptions,
        "block_size": last.block_size,
        "num_gpu_blocks": last.num_gpu_blocks,
        "kv_capacity_tokens": last.kv_capacity_tokens,
        "kv_used_tokens": last.kv_used_tokens,
        "prefix_cache_hit_rate": last.prefix_cache_hit_rate,
        "cache_dtype": last.cache_dtype,
        "gpu_memory_utilization": last.gpu_memory_utilization,
        "enable_prefix_caching": last.enable_prefix_caching,
        "model_names": list(last.model_names),
        "engine_ids": list(last.engine_ids),
        "per_engine": [e.to_dict() for e in last.per_engine],
        "num_samples": len(result.scrapes),
        "preemptions_per_s": _window_rate(result.scrapes, "num_preemptions"),
        "prefix_cache_hit_rate_window": _window_hit_rate(result.scrapes),
        "samples": [{k: _clean(v) for k, v in row.items()} for row in timeline.to_dict(orient="records")],
        "error": result.error,
    }
    lines = [
        f"{ENGINE_LABELS[last.engine]} at {result.url}" + (f" ({', '.join(last.model_names)})" if last.model_names else ""),
        f"KV usage         {_pct(last.kv_usage_fraction)}"
        + (f" of {last.num_gpu_blocks:,} blocks x {last.block_size} tokens" if last.num_gpu_blocks and last.block_size else ""),
        f"requests         {_n(last.num_running)} running, {_n(last.num_waiting)} waiting",
        f"preemptions      {_n(last.num_preemptions)} since start"
        + (f", {data['preemptions_per_s']:.3g}/s over {len(result.scrapes)} samples" if data["preemptions_per_s"] is not None else ""),
        f"prefix hit rate  {_pct(last.prefix_cache_hit_rate)} since start",
    ]
    if len(last.engine_ids) > 1:
        lines.append(f"engines          {len(last.engine_ids)} ({', '.join(last.engine_ids)}); counts summed, usage capacity-weighted")
    if spec is not None:
        used = timeline["measured_kv_bytes"].iloc[-1] if "measured_kv_bytes" in timeline else float("nan")
        data["bytes_per_token"] = bpt
        data["measured_kv_bytes"] = _clean(used)
        if math.isfinite(used):
            lines.append(f"KV in use        {fmt_bytes(used)} per engine ({spec.name}, {args.kv_dtype}, tp {args.tp})")
    if gpu is not None:
        plan = plan_capacity(
            spec, gpu, kv_dtype=args.kv_dtype, tp=args.tp,
            block_size=args.block_size or last.block_size or 16,
            gpu_util=args.gpu_util or last.gpu_memory_utilization or DEFAULT_GPU_UTIL, **_plan_kwargs(args),
        )
        engine_blocks = last.blocks_per_engine
        data["prediction"] = {
            "gpu": gpu.name, "gpu_util": plan.gpu_util, "block_size": plan.block_size,
            "num_blocks": plan.num_blocks, "kv_tokens": plan.kv_tokens, "kv_budget_bytes": plan.kv_budget_bytes,
            "engine_num_blocks": engine_blocks,
            "ratio_engine_to_planner": None if not engine_blocks or not plan.num_blocks else engine_blocks / plan.num_blocks,
        }
        lines.append(f"planner          {plan.num_blocks:,} blocks on {gpu.name} at {plan.gpu_util:g}"
                     + (f"; engine has {engine_blocks:,} ({engine_blocks / plan.num_blocks:.2f}x)"
                        if engine_blocks and plan.num_blocks else ""))
    if result.error:
        lines.append(f"polling stopped early: {result.error}")
    emit(data, args.json, "\n".join(lines))
    return 0


def _window_rate(scrapes, field: str) -> float | None:
    if len(scrapes) < 2:
        return None
    a, b = getattr(scrapes[0].snapshot, field), getattr(scrapes[-1].snapshot, field)
    dt = scrapes[-1].time_s - scrapes[0].time_s
    if a is None or b is None or dt <= 0 or b < a:
        return None
    return (b - a) / dt


def _window_hit_rate(scrapes) -> float | None:
    """Hits / queries between the first and last scrape (counters), else the last gauge."""
    last = scrapes[-1].snapshot
    if last.prefix_cache_queries is None:
        return last.prefix_cache_hit_rate
    if len(scrapes) < 2:
        return None
    first = scrapes[0].snapshot
    if first.prefix_cache_queries is None or first.prefix_cache_hits is None or last.prefix_cache_hits is None:
        return None
    dq = last.prefix_cache_queries - first.prefix_cache_queries
    dh = last.prefix_cache_hits - first.prefix_cache_hits
    return dh / dq if dq > 0 and 0 <= dh <= dq else None


def _pct(value: float | None) -> str:
    return "not reported" if value is None else f"{value:.1%}"


def _n(value) -> str:
    return "?" if value is None else f"{value:,.0f}"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def _read_log(path: str) -> str:
    if path == "-":
        return sys.stdin.read(MAX_LOG_BYTES)
    p = Path(path)
    try:
        if p.stat().st_size > MAX_LOG_BYTES:
            raise KvsimError(f"{path} is larger than {MAX_LOG_BYTES // (1 << 20)} MiB; pass the start-up part")
        return p.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise KvsimError(f"cannot read {path}: {exc.strerror or exc}") from None


def _run_log(args: argparse.Namespace) -> int:
    log = parse_vllm_log(_read_log(args.log))
    data = log.to_dict()
    lines = ["vLLM start-up log" + (f" ({log.model})" if log.model else "")]
    if log.kv_cache_tokens is not None:
        lines.append(f"KV cache tokens  {log.kv_cache_tokens:,}")
    if log.num_gpu_blocks is not None:
        lines.append(f"GPU blocks       {log.num_gpu_blocks:,}" + (f" (CPU blocks {log.num_cpu_blocks:,})" if log.num_cpu_blocks is not None else ""))
    if log.max_concurrency is not None:
        lines.append(f"max concurrency  {log.max_concurrency:.2f}x at {log.max_model_len:,} tokens per request")
    if log.kv_memory_bytes is not None:
        lines.append(f"KV memory        {fmt_bytes(log.kv_memory_bytes)} per rank")
    has_model, has_gpu = _has_model(args), _has_gpu(args)
    if has_model != has_gpu:
        raise KvsimError("to compare with the planner give both a model (--model) and a GPU (--gpu)")
    if has_model:
        spec, gpu = resolve_model(args), resolve_gpu(args)
        plan = plan_for_log(log, spec, gpu, kv_dtype=args.kv_dtype, tp=args.tp,
                            block_size=args.block_size or 16, gpu_util=args.gpu_util, **_plan_kwargs(args))
        rows = compare_log_with_plan(log, plan)
        data["plan"] = plan.to_dict()
        data["comparison"] = [r.to_dict() for r in rows]
        lines.append(f"planner: {spec.name} on {gpu.name}, util {plan.gpu_util:g}, tp {plan.tp}, KV {plan.kv_dtype}, block {plan.block_size}")
        for r in rows:
            ratio = "" if r.ratio is None else f"  ({r.ratio:.3f}x)"
            lines.append(f"  {r.quantity:<34} engine {_num(r.engine):>12}  planner {_num(r.planner):>12}{ratio}")
        if log.tensor_parallel_size and log.tensor_parallel_size != args.tp:
            lines.append(f"note: the log says tensor_parallel_size={log.tensor_parallel_size}; planned with --tp {args.tp}")
    emit(data, args.json, "\n".join(lines))
    return 0
