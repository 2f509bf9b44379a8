"""`kvsim live`: a small Llama-style model decoding through a real paged KV cache, measured.

Runs the paged engine and the contiguous (max-length reservation) baseline over the same
workload; prints measured beside predicted KV peaks, the correctness checks, throughput
and latency; ``--timeline`` / ``--record`` write the Timeline CSV and the run record JSON.
Torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from kvsim.cli._common import emit, positive_float, positive_int
from kvsim.errors import KvsimError
from kvsim.units import fmt_bytes

LIVE_DTYPES = ("fp32", "fp16", "bf16")


def _nonneg_int(text: str) -> int:
    if text.strip() == "0":
        return 0
    return positive_int(text)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("live", help="run a small model through a real paged KV cache and measure it")
    m = p.add_argument_group("model (a preset scaled down, or set by hand with --layers ...)")
    m.add_argument("--model", default="llama-3.1-8b", help="preset whose shape is scaled down (default llama-3.1-8b)")
    m.add_argument("--size", default="tiny",
                   help="tiny (1/8), small (1/4), base (1/2) or a divisor of layers, KV heads and head_dim (default tiny)")
    m.add_argument("--layers", type=positive_int, help="hand-set: decoder layers")
    m.add_argument("--heads", type=positive_int, help="hand-set: query heads (default: --kv-heads)")
    m.add_argument("--kv-heads", type=positive_int, help="hand-set: K/V heads")
    m.add_argument("--head-dim", type=positive_int, help="hand-set: head dimension")
    m.add_argument("--hidden", type=positive_int, help="hand-set: hidden size (default heads x head_dim)")
    m.add_argument("--intermediate", type=positive_int, help="hand-set: MLP width (default 3 x hidden)")
    m.add_argument("--vocab", type=positive_int, default=512, help="vocabulary size (default 512)")
    m.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts (default 0)")
    e = p.add_argument_group("engine")
    e.add_argument("--block-size", type=positive_int, default=16, help="tokens per block, a power of two (default 16)")
    e.add_argument("--num-blocks", type=positive_int,
                   help="blocks in the pool (default: enough for --max-num-seqs of the longest requests)")
    e.add_argument("--max-num-seqs", type=positive_int, default=8, help="most sequences running at once (default 8)")
    e.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    e.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"),
                   help="attention kernels (default auto: triton on CUDA, torch otherwise)")
    e.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default auto")
    e.add_argument("--dtype", default="fp32", choices=LIVE_DTYPES, help="model and KV precision (default fp32)")
    e.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    e.add_argument("--check-every", type=_nonneg_int, default=4,
                   help="compare paged attention with a dense recompute every N steps, 0 = never (default 4)")
    e.add_argument("--no-contiguous", action="store_true", help="skip the contiguous baseline (no token comparison)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default="synthetic",
                   help="synthetic, sharegpt-like, alpaca-like, or a trace file (default synthetic)")
    w.add_argument("--requests", type=positive_int, default=16, help="number of requests (default 16)")
    w.add_argument("--prompt-len", default="uniform:16:64", help="synthetic prompt lengths (default uniform:16:64)")
    w.add_argument("--output-len", default="uniform:16:64", help="synthetic output lengths (default uniform:16:64)")
    w.add_argument("--arrivals", default="all-at-once", help="all-at-once, poisson:RATE or trace (default all-at-once)")
    w.add_argument("--shared-prefix", type=_nonneg_int, default=0,
                   help="tokens of a system prompt shared by every request (default 0)")
    w.add_argument("--samples", type=int, default=1, metavar="N",
                   help="parallel samples per request: the prompt is prefilled once and forked N-1 times, blocks "
                        "shared copy-on-write; sample 0 greedy, the others seeded sampling (default 1)")
    w.add_argument("--max-len", type=positive_int, default=256,
                   help="longest request; lengths are scaled to fit; the contiguous reservation (default 256)")
    w.add_argument("--steps-per-s", type=positive_float, default=10.0,
                   help="engine steps per second of workload time, for arrivals (default 10)")
    p.add_argument("--timeline", metavar="PATH.csv", help="write both engines' Timeline as CSV")
    p.add_argument("--record", metavar="PATH.json", help="write the run record (and the summary) as JSON")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace):
    """(workload, LiveSettings) the options describe."""
    from dataclasses import replace

    from kvsim.live import EngineConfig, LiveModelConfig, LiveSettings, default_num_blocks, scaled_config
    from kvsim.live.requests import make_workload, prepare_requests
    from kvsim.spec import get_preset

    hand = [args.layers, args.kv_heads, args.head_dim]
    if any(v is not None for v in hand + [args.heads, args.hidden, args.intermediate]):
        if not all(v is not None for v in hand):
            raise KvsimError("a hand-set model needs all of --layers, --kv-heads and --head-dim")
        heads = args.heads or args.kv_heads
        hidden = args.hidden or heads * args.head_dim
        model = LiveModelConfig(num_layers=args.layers, num_heads=heads, num_kv_heads=args.kv_heads,
                                head_dim=args.head_dim, hidden_size=hidden,
                                intermediate_size=args.intermediate or 3 * hidden, vocab_size=args.vocab,
                                seed=args.seed, name="custom")
    else:
        size = int(args.size) if str(args.size).isdigit() else args.size
        model = scaled_config(get_preset(args.model), size, vocab_size=args.vocab, seed=args.seed)
    workload = make_workload(args.workload, num_requests=args.requests, prompt=args.prompt_len,
                             output=args.output_len, arrivals=args.arrivals, shared_prefix=args.shared_prefix,
                             seed=args.seed, num_samples=args.samples)
    engine = EngineConfig(block_size=args.block_size, num_blocks=args.num_blocks or 1, max_num_seqs=args.max_num_seqs,
                          enable_prefix_caching=not args.no_prefix_caching, backend=args.backend,
                          check_every=args.check_every)
    settings = LiveSettings(model=model, engine=engine, dtype=args.dtype, device=args.device, max_len=args.max_len,
                            steps_per_s=args.steps_per_s, contiguous=not args.no_contiguous,
                            workload_seed=args.seed, threads=args.threads)
    if args.num_blocks is None:
        prepared = prepare_requests(workload, max_len=args.max_len, vocab_size=args.vocab, seed=args.seed,
                                    steps_per_s=args.steps_per_s)
        engine = replace(engine, num_blocks=default_num_blocks(prepared, args.block_size, args.max_num_seqs))
        settings = replace(settings, engine=engine)
    return workload, settings


def jsonable(obj):
    """NaN and infinities become None (strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def run(args: argparse.Namespace) -> int:
    from kvsim.live import run_live

    workload, settings = settings_from_args(args)
    result = run_live(workload, settings)
    summary = jsonable(result.summary)
    if args.timeline:
        _write(args.timeline, lambda f: result.timeline.to_csv(f, index=False))
    if args.record:
        _write(args.record, lambda f: json.dump(summary, f, indent=2))
    s = summary
    cont = s.get("contiguous") or {}
    err = s["max_abs_error"]
    lines = [
        f"{s['record']['model']['name']} ({settings.model.num_params:,} parameters, seed {settings.model.seed}), "
        f"{s['dtype']} on {s['device']}, backend {s['backend']}",
        f"pool             {settings.engine.num_blocks} blocks x {settings.engine.block_size} tokens "
        f"= {fmt_bytes(s['pool_bytes'])}",
        f"workload         {s['requests']} requests, {s['output_tokens']} output tokens, {s['steps']} steps",
        f"peak KV (paged)  measured {fmt_bytes(s['measured_peak_kv_bytes'])}, predicted "
        f"{fmt_bytes(s['predicted_peak_kv_bytes'])} (worst step differs by {s['max_step_error_bytes']:,} B)",
        f"peak live K/V    measured {fmt_bytes(s['measured_peak_live_kv_bytes'])}, predicted "
        f"{fmt_bytes(s['predicted_peak_live_kv_bytes'])}",
    ]
    if cont:
        lines.append(f"peak KV (contig) measured {fmt_bytes(cont['measured_peak_kv_bytes'])} "
                     f"(max-length reservations of {settings.max_len} tokens)")
    lines += [
        f"correctness      max |paged - dense| = {err if err is None else f'{err:.2e}'} over {s['checked_steps']} "
        f"checked steps; tokens match contiguous: {s['tokens_match']}",
        f"preemptions      {s['preemptions']}; prefix-cache hits {s['prefix_hit_blocks']} blocks"
        + (f"; {s['samples_per_request']} samples per request, {s['cow_copies']} copy-on-write block copies"
           if s["samples_per_request"] > 1 else ""),
        f"throughput       {s['tokens_per_s']:.1f} tokens/s; TTFT p50 {s['ttft_p50_ms']:.1f} ms, "
        f"p99 {s['ttft_p99_ms']:.1f} ms; TPOT p50 {s['tpot_p50_ms']:.2f} ms, p99 {s['tpot_p99_ms']:.2f} ms",
    ]
    emit(summary, args.json, "\n".join(lines))
    return 0


def _write(path: str, writer) -> None:
    try:
        with Path(path).open("w", encoding="utf-8", newline="") as f:
            writer(f)
    except OSError as exc:
        raise KvsimError(f"cannot write {path}: {exc.strerror or exc}") from None
