"""Options and helpers shared by the CLI commands."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from kvsim.errors import KvsimError
from kvsim.gpus import GPUSpec, custom_gpu, get_gpu
from kvsim.units import GiB, fmt_bytes
from kvsim.spec import KV_DTYPE_BYTES, ModelSpec, custom_spec, get_preset, load_hf_config_file


def positive_int(text: str) -> int:
    """argparse type: a positive whole number (``1e3`` and ``1_000`` accepted)."""
    try:
        value = float(text.replace("_", "")) if any(c in text for c in ".eE") else int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
        value = int(value)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def add_model_args(parser: argparse.ArgumentParser, *, dtype: bool = True) -> None:
    """--model / --config / --layers --kv-heads --head-dim, plus --kv-dtype and --tp."""
    group = parser.add_argument_group("model (one of --model, --config, or --layers/--kv-heads/--head-dim)")
    group.add_argument("--model", help="preset id, e.g. llama-3.1-8b (see `kvsim models`)")
    group.add_argument("--config", metavar="PATH", help="a Hugging Face config.json")
    group.add_argument("--layers", type=positive_int, help="decoder layers (hand-set model)")
    group.add_argument("--kv-heads", type=positive_int, help="K/V heads (hand-set model)")
    group.add_argument("--head-dim", type=positive_int, help="head dimension (hand-set model)")
    group.add_argument("--sliding-window", type=positive_int, help="window of every layer (hand-set model)")
    if dtype:
        parser.add_argument("--kv-dtype", default="fp16", choices=sorted(KV_DTYPE_BYTES), help="KV cache dtype (default fp16)")
        parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")


def resolve_model(args: argparse.Namespace, default: str | None = None) -> ModelSpec:
    """The ModelSpec the model options name; exactly one way of naming it."""
    hand = [args.layers, args.kv_heads, args.head_dim]
    ways = sum([args.model is not None, args.config is not None, any(v is not None for v in hand)])
    if ways > 1:
        raise KvsimError("give only one of --model, --config or --layers/--kv-heads/--head-dim")
    if args.model is not None:
        return get_preset(args.model)
    if args.config is not None:
        return load_hf_config_file(args.config)
    if any(v is not None for v in hand):
        if not all(v is not None for v in hand):
            raise KvsimError("a hand-set model needs all of --layers, --kv-heads and --head-dim")
        return custom_spec(args.layers, args.kv_heads, args.head_dim, sliding_window=args.sliding_window)
    if default is not None:
        return get_preset(default)
    raise KvsimError("name a model: --model NAME, --config PATH, or --layers/--kv-heads/--head-dim")


def add_gpu_args(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument("--gpu", help="GPU preset id, e.g. h100-80gb (see `kvsim models`)")
    parser.add_argument("--gpu-memory-gib", type=positive_float, help="custom GPU memory in GiB")


def resolve_gpu(args: argparse.Namespace, default: str | None = None) -> GPUSpec | None:
    if args.gpu is not None and args.gpu_memory_gib is not None:
        raise KvsimError("give only one of --gpu and --gpu-memory-gib")
    if args.gpu is not None:
        return get_gpu(args.gpu)
    if args.gpu_memory_gib is not None:
        return custom_gpu(args.gpu_memory_gib, name=f"custom {args.gpu_memory_gib:g} GiB")
    return get_gpu(default) if default else None


def emit(data: dict[str, Any], as_json: bool, text: str) -> None:
    """Print JSON (machine-readable, stable keys) or the human text."""
    if as_json:
        json.dump(data, sys.stdout, indent=2, default=_json_default)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.integer):
            return int(obj)
        if isinstance(obj, np.floating):
            return float(obj)
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


__all__ = [
    "positive_int", "positive_float", "nonnegative_float", "add_model_args", "resolve_model",
    "add_gpu_args", "resolve_gpu", "emit", "fmt_bytes", "GiB",
]
