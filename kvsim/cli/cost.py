"""`kvsim cost`: the roofline time of one engine step, and where decode turns compute-bound."""

from __future__ import annotations

import argparse

from kvsim.capacity import WEIGHT_DTYPE_BYTES
from kvsim.cli._common import add_model_args, emit, nonnegative_float, positive_float, positive_int, resolve_model
from kvsim.costmodel import CostModel, roofline_boundary
from kvsim.errors import KvsimError
from kvsim.gpus import get_gpu, gpu_names
from kvsim.units import fmt_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost", help="step time, bytes and FLOPs of one engine step on a GPU (roofline)",
        description="Bytes moved and FLOPs of one engine step (a decode batch at a context, plus an optional "
                    "prefill chunk) against a GPU's bandwidth and 16-bit throughput: a lower bound on the step's "
                    "time, which side binds, and where decode turns compute-bound.",
    )
    add_model_args(p)
    p.add_argument("--gpu", default="a100-40gb", choices=gpu_names(), help="GPU preset (default a100-40gb)")
    p.add_argument("--weight-dtype", default="bf16", choices=sorted(WEIGHT_DTYPE_BYTES), help="weights (default bf16)")
    p.add_argument("--batch", type=int, default=1, metavar="N", help="decode sequences in the step (default 1; 0 for none)")
    p.add_argument("--context", type=positive_int, default=1024, help="tokens each decode sequence attends to (default 1024)")
    p.add_argument("--prefill", type=positive_int, metavar="TOKENS", help="add a prefill chunk of this many new tokens")
    p.add_argument("--prefill-cached", type=int, default=0, metavar="TOKENS",
                   help="tokens already cached before that chunk (default 0)")
    p.add_argument("--bandwidth-efficiency", type=positive_float, default=1.0, help="fraction of peak bandwidth (default 1)")
    p.add_argument("--compute-efficiency", type=positive_float, default=1.0, help="fraction of peak FLOP/s (default 1)")
    p.add_argument("--overhead-ms", type=nonnegative_float, default=0.0, help="fixed time added per step (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = resolve_model(args)
    if args.batch < 0:
        raise KvsimError(f"--batch must not be negative, got {args.batch}")
    if args.prefill_cached < 0:
        raise KvsimError(f"--prefill-cached must not be negative, got {args.prefill_cached}")
    if args.batch == 0 and args.prefill is None:
        raise KvsimError("an empty step: give --batch N >= 1 or --prefill TOKENS")
    model = CostModel(spec, get_gpu(args.gpu), kv_dtype=args.kv_dtype, weight_dtype=args.weight_dtype, tp=args.tp,
                      bandwidth_efficiency=args.bandwidth_efficiency, compute_efficiency=args.compute_efficiency,
                      step_overhead_s=args.overhead_ms / 1e3)
    step = model.step_cost(
        prefill_tokens=[args.prefill] if args.prefill else [],
        prefill_cached=[args.prefill_cached] if args.prefill else [],
        decode_context=[args.context] * args.batch,
    )
    boundary = roofline_boundary(model, args.context)
    data = {
        "model": spec.name, "gpu": model.gpu.name, "kv_dtype": model.kv_dtype, "weight_dtype": model.weight_dtype,
        "tp": model.tp, "batch": args.batch, "context": args.context, "prefill_tokens": args.prefill or 0,
        "prefill_cached_tokens": args.prefill_cached if args.prefill else 0,
        "bandwidth_bytes_per_s": model.bandwidth_bytes_per_s, "flops_per_s": model.flops_per_s,
        **step.to_dict(),
        "step_time_s": step.time_s,
        "decode_throughput_tokens_per_s": args.batch / step.time_s if step.time_s > 0 else 0.0,
        **{f"boundary_{k}": v for k, v in boundary.to_dict().items()},
    }
    work = []
    if args.batch:
        work.append(f"{args.batch:,} decode sequence(s) at {args.context:,} tokens")
    if args.prefill:
        work.append(f"a prefill of {args.prefill:,} tokens after {args.prefill_cached:,} cached")
    lines = [
        f"{model.describe()}",
        f"step             {' + '.join(work)}",
        f"bytes            weights {fmt_bytes(step.weight_bytes)}, KV read {fmt_bytes(step.kv_read_bytes)}, "
        f"KV written {fmt_bytes(step.kv_write_bytes)}",
        f"FLOPs            linear {step.linear_flops:.3e}, attention {step.attention_flops:.3e} "
        f"({step.arithmetic_intensity:,.1f} FLOP/B)",
        f"time             {step.time_s * 1e3:,.3f} ms = linear {step.linear_time_s * 1e3:,.3f} ms ({step.linear_bound}-bound)"
        f" + attention {step.attention_time_s * 1e3:,.3f} ms ({step.attention_bound}-bound)"
        + (f" + overhead {step.overhead_s * 1e3:g} ms" if step.overhead_s else ""),
        f"attention share  {step.attention_share:.1%}; the step is {step.bound}-bound",
    ]
    if args.batch:
        lines.append(f"decode           {data['decode_throughput_tokens_per_s']:,.0f} tokens/s, "
                     f"{step.time_s * 1e3:,.2f} ms per output token")
    ridge = boundary.step_ridge_batch
    lines.append(
        f"boundary         GPU ridge {boundary.ridge_point:,.0f} FLOP/B; linear layers compute-bound from "
        + ("never" if boundary.linear_ridge_tokens is None else f"{boundary.linear_ridge_tokens:,} tokens/step")
        + f"; decode attention {boundary.attention_intensity:,.1f} FLOP/B; whole decode step at {args.context:,} tokens "
        + ("never reaches the ridge" if ridge is None else f"reaches it at batch ~{ridge:,.0f}")
    )
    emit(data, args.json, "\n".join(lines))
    return 0
