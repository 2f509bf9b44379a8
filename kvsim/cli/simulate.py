"""`kvsim simulate`: replay a workload through a block allocator and a scheduler."""

from __future__ import annotations

import argparse
import math

from kvsim.capacity import WEIGHT_DTYPE_BYTES, plan_capacity
from kvsim.cli._common import add_model_args, emit, positive_float, positive_int, resolve_model
from kvsim.costmodel import CostModel
from kvsim.gpus import get_gpu, gpu_names
from kvsim.errors import KvsimError
from kvsim.scheduler import SchedulerConfig
from kvsim.simulate import simulate
from kvsim.strategies import STRATEGIES
from kvsim.traces import read_trace
from kvsim.units import GiB, fmt_bytes
from kvsim.workloads import PRESET_WORKLOADS, parse_arrivals, preset_workload, synthetic_workload


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="replay a workload or trace through a KV allocation strategy",
        description="Replay requests (a trace or a synthetic workload) through a continuous-batching "
                    "scheduler and a KV allocation strategy; report memory use, fragmentation, "
                    "preemptions and prefix-cache hits.",
    )
    add_model_args(p)
    p.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--strategy", default="paged", choices=STRATEGIES, help="allocation strategy (default paged)")
    p.add_argument("--prefix-caching", action="store_true", help="share cached prompt blocks (paged only)")
    w = p.add_argument_group("workload (a trace, or a synthetic workload)")
    w.add_argument("--trace", metavar="PATH", help="Azure CSV, Mooncake JSONL or ShareGPT-stats CSV (format detected)")
    w.add_argument("--workload", default=None, choices=sorted(PRESET_WORKLOADS),
                   help="synthetic preset (default sharegpt-like when no --trace)")
    w.add_argument("--prompt-len", metavar="SPEC", help="synthetic prompt lengths: N, uniform:LO:HI or lognormal:MEAN:SIGMA")
    w.add_argument("--output-len", metavar="SPEC", help="synthetic output lengths (same forms)")
    w.add_argument("--num-requests", type=positive_int, default=1000, help="synthetic requests (default 1000)")
    w.add_argument("--samples", type=positive_int, default=1, help="parallel samples per request (default 1)")
    w.add_argument("--beam-width", type=positive_int, default=1, help="beam search width (default 1)")
    w.add_argument("--system-prompt", type=_nonneg_int, default=0, metavar="TOKENS",
                   help="tokens of a system prompt shared by every synthetic request")
    w.add_argument("--seed", type=_nonneg_int, default=0, help="random seed (default 0)")
    w.add_argument("--limit", type=positive_int, metavar="N", help="keep the first N requests")
    w.add_argument("--arrivals", default=None, metavar="MODE",
                   help="trace | all-at-once | poisson:RATE (default: trace times when the trace has them, else all-at-once)")
    m = p.add_argument_group("KV memory (one of)")
    m.add_argument("--num-blocks", type=positive_int, help="blocks in the pool (reservation strategies get the same bytes)")
    m.add_argument("--kv-memory-gib", type=positive_float, metavar="X", help="KV memory per rank in GiB")
    m.add_argument("--kv-memory", choices=["unlimited"], help="unlimited: room for every request at once (the default)")
    p.add_argument("--max-len", type=positive_int, help="longest sequence (default: the model's max positions)")
    p.add_argument("--max-num-seqs", type=positive_int, default=256, help="running sequences at most (default 256)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=8192, help="tokens per step at most (default 8192)")
    p.add_argument("--seconds-per-step", type=positive_float, default=0.02,
                   help="trace seconds per engine step, to place arrivals (default 0.02)")
    p.add_argument("--step-by-step", action="store_true", help="plain replay of every step (slow; same results)")
    t = p.add_argument_group("time model (kvsim.costmodel): steps take the roofline time on a GPU")
    t.add_argument("--gpu", choices=gpu_names(), help="GPU preset; adds throughput, TTFT, TPOT and normalized latency, "
                   "and the KV memory defaults to the capacity planner's budget on it")
    t.add_argument("--weight-dtype", default="bf16", choices=sorted(WEIGHT_DTYPE_BYTES), help="weights (default bf16)")
    p.add_argument("--timeline", metavar="PATH.csv", help="write the per-step Timeline as CSV")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _workload(args: argparse.Namespace, max_len: int | None):
    synthetic_opts = args.prompt_len or args.output_len or args.workload
    if args.trace:
        if synthetic_opts:
            raise KvsimError("give --trace or a synthetic workload (--workload / --prompt-len / --output-len), not both")
        if args.samples > 1 or args.beam_width > 1 or args.system_prompt:
            raise KvsimError("--samples, --beam-width and --system-prompt apply to synthetic workloads")
        wl = read_trace(args.trace, limit=args.limit)
        mode = args.arrivals or ("trace" if wl.timed else "all-at-once")
        kind, rate = parse_arrivals(mode)
        if kind == "trace" and not wl.timed:
            raise KvsimError(f"{wl.name} has no timestamps; use --arrivals all-at-once or poisson:RATE")
        if kind == "all-at-once":
            wl = wl.all_at_once()
        elif kind == "poisson":
            wl = wl.with_poisson_arrivals(rate, seed=args.seed)
        return wl, mode
    mode = args.arrivals or "all-at-once"
    if args.prompt_len or args.output_len:
        if args.workload:
            raise KvsimError("give --workload or --prompt-len/--output-len, not both")
        if not (args.prompt_len and args.output_len):
            raise KvsimError("a synthetic workload needs both --prompt-len and --output-len")
        wl = synthetic_workload(
            args.num_requests, args.prompt_len, args.output_len, arrivals=mode, seed=args.seed,
            num_samples=args.samples, beam_width=args.beam_width, system_prompt_tokens=args.system_prompt,
            max_len=max_len,
        )
    else:
        wl = preset_workload(
            args.workload or "sharegpt-like", args.num_requests, arrivals=mode, seed=args.seed, max_len=max_len,
            num_samples=args.samples, beam_width=args.beam_width, system_prompt_tokens=args.system_prompt,
        )
    return wl.limit(args.limit), mode


def run(args: argparse.Namespace) -> int:
    spec = resolve_model(args)
    given = [args.num_blocks is not None, args.kv_memory_gib is not None, args.kv_memory is not None]
    if sum(given) > 1:
        raise KvsimError("give only one of --num-blocks, --kv-memory-gib and --kv-memory unlimited")
    if args.prefix_caching and args.strategy != "paged":
        raise KvsimError("--prefix-caching needs --strategy paged")
    max_len = args.max_len or spec.max_position_embeddings or None
    workload, mode = _workload(args, max_len)
    kv_bytes = None if args.kv_memory_gib is None else int(math.floor(args.kv_memory_gib * GiB))
    cost = None
    if args.gpu is not None:
        cost = CostModel(spec, get_gpu(args.gpu), kv_dtype=args.kv_dtype, weight_dtype=args.weight_dtype, tp=args.tp)
        if not any(given):  # the GPU's KV budget: 0.9 of memory less weights and a 1 GiB reserve
            kv_bytes = plan_capacity(spec, cost.gpu, kv_dtype=args.kv_dtype, tp=args.tp, block_size=args.block_size,
                                     weight_dtype=args.weight_dtype, max_len=max_len).kv_budget_bytes
    cfg = SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens, args.seconds_per_step)
    result = simulate(
        workload, spec, strategy=args.strategy, block_size=args.block_size, prefix_caching=args.prefix_caching,
        kv_dtype=args.kv_dtype, tp=args.tp, num_blocks=args.num_blocks, kv_memory_bytes=kv_bytes,
        max_len=args.max_len, scheduler=cfg, event_driven=not args.step_by_step, step_time_fn=cost,
    )
    if args.timeline:
        try:
            result.timeline.to_csv(args.timeline, index=False)
        except OSError as exc:
            raise KvsimError(f"cannot write {args.timeline}: {exc.strerror or exc}") from None
    s = result.summary
    data = s.to_dict()
    data.update({"workload": workload.name, "arrivals": mode, "kv_dtype": args.kv_dtype, "tp": args.tp})
    if cost is not None:
        norm = result.requests["normalized_latency_s"].dropna()
        data.update({"gpu": cost.gpu.name, "weight_dtype": args.weight_dtype,
                     "normalized_latency_mean_s": float(norm.mean()) if len(norm) else None})
    if args.timeline:
        data["timeline_path"] = args.timeline
    label = s.strategy + (" + prefix caching" if s.prefix_caching else "")
    desc = workload.description or workload.name
    mem = "unlimited" if s.unlimited_memory else fmt_bytes(s.capacity_bytes)
    if s.num_blocks is not None:
        mem += f" ({s.num_blocks:,} blocks of {s.block_size} tokens)"
    lines = [
        f"{spec.name}, {label}, KV {args.kv_dtype}, tp {args.tp}, memory {mem}",
        f"workload         {desc}" + ("" if "arrivals" in desc else f"; arrivals {mode}"),
        f"requests         {s.finished:,} finished, {s.dropped:,} dropped, {s.preemptions:,} preemptions",
        f"steps            {s.steps:,}; running max {s.max_running}, mean {s.mean_running:.1f}",
        f"peak allocated   {fmt_bytes(s.peak_allocated_bytes)} (live {fmt_bytes(s.peak_live_bytes)} at most)",
        "memory split     token states {:.1%}, reservation {:.1%}, internal frag {:.1%}, external frag {:.1%}".format(
            s.token_state_fraction, s.reservation_fraction, s.internal_fraction, s.external_fraction),
    ]
    if cost is not None and s.latency and s.latency.get("ttft_p50_s") is not None:
        lat = s.latency
        lines.append(f"time model       {cost.describe()}; {s.duration_s:,.1f} s modelled")
        lines.append(f"throughput       {lat['throughput_tokens_per_s']:,.0f} output tokens/s, "
                     f"{lat['throughput_requests_per_s']:,.2f} requests/s")
        lines.append(f"latency p50/p99  TTFT {lat['ttft_p50_s']:.3f}/{lat['ttft_p99_s']:.3f} s, "
                     f"TPOT {1e3 * (lat['tpot_p50_s'] or 0):.1f}/{1e3 * (lat['tpot_p99_s'] or 0):.1f} ms, "
                     f"normalized {lat['normalized_latency_p50_s']:.3f}/{lat['normalized_latency_p99_s']:.3f} s/token")
    if s.prefix_caching:
        lines.append(f"prefix cache     {s.prefix_hit_blocks:,} of {s.prefix_query_blocks:,} prompt blocks hit ({s.prefix_hit_rate:.1%})")
    for why, count in s.drop_reasons.items():
        lines.append(f"dropped          {count:,}: {why}")
    if args.timeline:
        lines.append(f"timeline         {len(result.timeline):,} rows -> {args.timeline}")
    emit(data, args.json, "\n".join(lines))
    return 0
