"""`kvsim models`: the model and GPU presets with their KV bytes per token."""

from __future__ import annotations

import argparse

from kvsim.cli._common import emit
from kvsim.gpus import GPUS
from kvsim.spec import PRESETS
from kvsim.units import fmt_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list model and GPU presets")
    p.add_argument("--kv-dtype", default="fp16", help="dtype for the bytes-per-token column (default fp16)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    models = []
    for key, spec in PRESETS.items():
        entry = spec.to_dict()
        entry["id"] = key
        entry["bytes_per_token"] = spec.bytes_per_token(args.kv_dtype)
        models.append(entry)
    gpus = [
        {"id": key, "name": g.name, "memory_bytes": g.memory_bytes,
         "bandwidth_bytes_per_s": g.bandwidth_bytes_per_s, "flops_16bit": g.flops_16bit, "source": g.source}
        for key, g in GPUS.items()
    ]
    lines = [f"{'model':<18} {'KV/token (' + args.kv_dtype + ')':>18}  layout"]
    for m, spec in zip(models, PRESETS.values()):
        lines.append(f"{m['id']:<18} {fmt_bytes(m['bytes_per_token']):>18}  {spec.summary()}")
    lines.append("")
    lines.append(f"{'gpu':<18} {'memory':>12}")
    for g in gpus:
        lines.append(f"{g['id']:<18} {fmt_bytes(g['memory_bytes']):>12}  {g['name']}")
    emit({"models": models, "gpus": gpus}, args.json, "\n".join(lines))
    return 0
