"""`kvsim capacity`: KV blocks, token capacity and concurrency on a GPU."""

from __future__ import annotations

import argparse

from kvsim.capacity import DEFAULT_GPU_UTIL, WEIGHT_DTYPE_BYTES, plan_capacity
from kvsim.cli._common import (
    add_gpu_args, add_model_args, emit, nonnegative_float, positive_float, positive_int,
    resolve_gpu, resolve_model,
)
from kvsim.units import GiB, fmt_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capacity", help="KV cache capacity and max concurrency on a GPU")
    add_model_args(p)
    add_gpu_args(p)
    p.add_argument("--gpu-util", type=positive_float, default=DEFAULT_GPU_UTIL,
                   help="gpu_memory_utilization, 0-1 (default 0.9)")
    p.add_argument("--weights-gib", type=nonnegative_float, help="weights per rank in GiB (overrides the estimate)")
    p.add_argument("--weight-dtype", default="bf16", choices=sorted(WEIGHT_DTYPE_BYTES), help="for the weight estimate")
    p.add_argument("--reserve-gib", type=nonnegative_float, default=1.0,
                   help="activations and buffers per rank, GiB (default 1)")
    p.add_argument("--block-size", type=positive_int, default=16, help="tokens per block (default 16)")
    p.add_argument("--max-len", type=positive_int, help="tokens per request (default: the model's max positions)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = resolve_model(args)
    gpu = resolve_gpu(args, default="h100-80gb")
    plan = plan_capacity(
        spec, gpu, kv_dtype=args.kv_dtype, tp=args.tp, block_size=args.block_size,
        gpu_util=args.gpu_util, weight_dtype=args.weight_dtype,
        weights_override_bytes=None if args.weights_gib is None else int(args.weights_gib * GiB),
        reserve_bytes=int(args.reserve_gib * GiB), max_len=args.max_len,
    )
    lines = [
        f"{spec.name} on {gpu.name}, tp {plan.tp}, KV {plan.kv_dtype}, block {plan.block_size}",
        f"usable memory    {fmt_bytes(plan.usable_bytes)} ({plan.gpu_util:g} of {fmt_bytes(plan.gpu_memory_bytes)})",
        f"weights          {fmt_bytes(plan.weights_bytes)} per rank",
        f"reserve          {fmt_bytes(plan.reserve_bytes)} (activations, buffers: assumed)",
        f"KV budget        {fmt_bytes(plan.kv_budget_bytes)}",
        f"KV blocks        {plan.num_blocks:,} of {fmt_bytes(plan.block_bytes)}",
        *plan.vllm_log_lines(),
    ]
    emit(plan.to_dict(), args.json, "\n".join(lines))
    return 0
