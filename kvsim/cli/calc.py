"""`kvsim calc`: bytes per token and per block, blocks, live vs allocated, slack, reservation."""

from __future__ import annotations

import argparse

from kvsim.calculator import kv_usage, sequence_lengths
from kvsim.cli._common import add_model_args, emit, positive_int, resolve_model
from kvsim.units import fmt_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calc", help="KV bytes, blocks and slack for some sequences")
    add_model_args(p)
    p.add_argument("--block-size", type=positive_int, default=16, help="tokens per block (default 16)")
    p.add_argument("--context", type=positive_int, action="append", metavar="TOKENS",
                   help="tokens in a sequence; repeat for several sequences (default 33)")
    p.add_argument("--concurrency", type=positive_int, default=1, help="copies of each context (default 1)")
    p.add_argument("--max-len", type=positive_int, help="reserve this many tokens per sequence (baseline)")
    p.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS",
                   help="tokens of prefix shared by all sequences (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = resolve_model(args)
    lens = sequence_lengths(args.context or [33], args.concurrency)
    u = kv_usage(spec, lens, kv_dtype=args.kv_dtype, tp=args.tp, block_size=args.block_size,
                 max_len=args.max_len, shared_prefix_len=args.shared_prefix)
    lines = [
        f"model            {spec.name} ({spec.summary()}), KV {u.kv_dtype}, tp {u.tp}",
        f"bytes per token  {u.bytes_per_token:,} ({fmt_bytes(u.bytes_per_token)})",
        f"bytes per block  {u.block_bytes:,} ({fmt_bytes(u.block_bytes)}, {u.block_size} tokens)",
        f"sequences        {u.num_sequences:,} holding {u.tokens:,} tokens",
        f"blocks           {u.blocks:,}" + (f" ({u.physical_blocks:,} held after sharing)" if u.shared_blocks else ""),
        f"live bytes       {u.live_bytes:,} ({fmt_bytes(u.live_bytes)})",
        f"allocated bytes  {u.allocated_bytes:,} ({fmt_bytes(u.allocated_bytes)})",
        f"slack            {u.slack_bytes:,} bytes, {u.slack_tokens:,} tokens ({100 * u.slack_fraction:.1f} % of allocated)",
    ]
    if u.reserved_bytes is not None:
        lines.append(f"reserved (max {u.max_len:,}) {u.reserved_bytes:,} ({fmt_bytes(u.reserved_bytes)}), "
                     f"waste {fmt_bytes(u.reservation_waste_bytes)}")
    if u.shared_blocks:
        lines.append(f"sharing saves    {u.sharing_saved_bytes:,} bytes ({u.shared_blocks} prefix blocks stored once)")
    emit(u.to_dict(), args.json, "\n".join(lines))
    return 0
