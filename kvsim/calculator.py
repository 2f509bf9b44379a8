"""Closed-form KV-cache numbers for a set of sequences, vectorised with numpy.

For ``n`` stored tokens and block size ``B`` (the counting conventions, ``docs/conventions.md``):

- blocks ``ceil(n / B)``; live bytes ``n * bytes_per_token``;
- allocated bytes ``blocks * B * bytes_per_token``; slack = allocated - live, all of it in the
  last block of each sequence (at most ``B - 1`` tokens);
- a sliding-window layer keeps only the blocks that overlap the last ``W`` tokens:
  ``floor((n-1)/B) - floor(max(0, n-W)/B) + 1`` of them, holding ``min(n, W)`` live tokens;
- the max-length reservation baseline reserves ``max_len`` tokens per sequence up front
  (``min(max_len, W)`` on a sliding layer), contiguously, with no block rounding;
- a prefix of ``P`` tokens shared by ``N`` sequences stores its ``P // B`` full blocks once;
  the partial block after them is copied per sequence (copy-on-write), so it is not shared.
  Sharing is counted on full-attention and MLA layers; sliding layers are counted unshared.

Totals are Python integers, exact at any size (10^12-token contexts included): counts are
summed in int64 only when that cannot overflow, and multiplied by byte sizes as Python ints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from kvsim.errors import KvsimError
from kvsim.spec import SLIDING, ModelSpec, canonical_dtype

_INT64_SAFE = 1 << 62


def check_block_size(block_size: object) -> int:
    """Validate a block size (tokens per block): a positive integer."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size <= 0:
        raise KvsimError(f"block size must be a positive integer, got {block_size!r}")
    return int(block_size)


def as_lengths(values: Iterable[int] | np.ndarray | int, what: str = "sequence length") -> np.ndarray:
    """Token counts as an int64 array (or object array of Python ints when huge).

    Zero is allowed (a sequence that stores nothing); negatives, fractions and non-numbers
    are a caller's mistake.
    """
    arr = np.asarray(values if not np.isscalar(values) else [values])
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        out = []
        for v in arr.tolist():
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise KvsimError(f"{what} must be a whole number, got {v!r}")
            if isinstance(v, (float, np.floating)) and not float(v).is_integer():
                raise KvsimError(f"{what} must be a whole number, got {v!r}")
            out.append(int(v))
        arr = np.array(out, dtype=object) if out and max(abs(x) for x in out) >= _INT64_SAFE else np.array(out, dtype=np.int64)
    if arr.size and (arr < 0).any():
        raise KvsimError(f"{what} must not be negative, got {int(arr.min())}")
    return arr


def parse_lengths(text: str, what: str = "context") -> list[int]:
    """Token counts typed by a person: ``"33, 100 2k 1e3"`` -> ``[33, 100, 2000, 1000]``.

    Separators are commas, semicolons or spaces; ``k``/``m`` suffixes multiply by 10^3/10^6.
    Every value must be a positive whole number.
    """
    parts = [p for p in str(text).replace(",", " ").replace(";", " ").split() if p]
    if not parts:
        raise KvsimError(f"give at least one {what} length")
    out = []
    for part in parts:
        raw = part.strip().lower().replace("_", "")
        scale = 1
        if raw.endswith(("k", "m")):
            scale = 1000 if raw[-1] == "k" else 1_000_000
            raw = raw[:-1]
        try:
            value = float(raw) * scale if any(c in raw for c in ".e") else int(raw) * scale
        except ValueError:
            raise KvsimError(f"{what} {part!r} is not a number") from None
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")) or not value.is_integer():
                raise KvsimError(f"{what} {part!r} is not a whole number of tokens")
            value = int(value)
        if value <= 0:
            raise KvsimError(f"{what} must be positive, got {part!r}")
        out.append(value)
    return out


def blocks_for_tokens(num_tokens: np.ndarray | int, block_size: int) -> np.ndarray | int:
    """``ceil(n / block_size)``, elementwise."""
    return (num_tokens + block_size - 1) // block_size


def window_blocks(num_tokens: np.ndarray, block_size: int, window: int) -> np.ndarray:
    """Blocks a sliding-window layer still holds after ``n`` tokens: those overlapping
    positions ``[max(0, n - W), n)``. Zero for an empty sequence."""
    n = num_tokens
    first = np.maximum(n - window, 0) // block_size
    last = (np.maximum(n, 1) - 1) // block_size
    return np.where(n > 0, last - first + 1, 0)


def _safe_sum(arr: np.ndarray) -> int:
    """Exact sum as a Python int, whatever the magnitude."""
    if arr.size == 0:
        return 0
    if arr.dtype != object and int(np.abs(arr).max()) * arr.size < _INT64_SAFE:
        return int(arr.sum())
    return int(sum(int(x) for x in arr.tolist()))


@dataclass(frozen=True)
class KVUsage:
    """KV-cache footprint of a set of sequences on one tensor-parallel rank."""

    model: str  # ModelSpec.name
    kv_dtype: str  # canonical dtype name
    tp: int  # tensor-parallel degree (numbers are per rank)
    block_size: int  # tokens per block
    bytes_per_token: int  # KV bytes of one token, all layers, one rank
    block_bytes: int  # block_size * bytes_per_token
    num_sequences: int
    tokens: int  # tokens stored, summed over sequences (shared prefix counted per sequence)
    blocks: int  # block-table entries (full-attention view): sum of ceil(n / B)
    physical_blocks: int  # blocks actually held, per full layer, after prefix sharing
    live_bytes: int  # bytes holding written tokens, sharing and windows applied
    allocated_bytes: int  # bytes of the blocks held
    slack_bytes: int  # allocated - live: empty slots of partly filled blocks
    slack_tokens: int  # empty token slots in the sequences' last blocks: sum(blocks*B - n)
    reserved_bytes: int | None  # max-length reservation baseline (None without max_len)
    max_len: int | None
    shared_prefix_tokens: int  # prefix length shared by all sequences
    shared_blocks: int  # full prefix blocks stored once instead of per sequence
    sharing_saved_bytes: int  # bytes the shared prefix blocks save

    @property
    def slack_fraction(self) -> float:
        return self.slack_bytes / self.allocated_bytes if self.allocated_bytes else 0.0

    @property
    def reservation_waste_bytes(self) -> int | None:
        """Reserved but not holding a token: what max-length reservation wastes."""
        return None if self.reserved_bytes is None else self.reserved_bytes - self.live_bytes

    def to_dict(self) -> dict:
        data = asdict(self)
        data["slack_fraction"] = self.slack_fraction
        if self.reserved_bytes is None:
            del data["reserved_bytes"]
        else:
            data["reservation_waste_bytes"] = self.reservation_waste_bytes
        return data


def sequence_lengths(contexts: Sequence[int] | int, concurrency: int = 1) -> np.ndarray:
    """Each context repeated ``concurrency`` times (one context x N, or several contexts)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, (int, np.integer)) or concurrency <= 0:
        raise KvsimError(f"concurrency must be a positive integer, got {concurrency!r}")
    lens = as_lengths(contexts, "context")
    if lens.size == 0:
        raise KvsimError("give at least one context length")
    return np.repeat(lens, int(concurrency)) if lens.dtype != object else np.array(
        [x for x in lens.tolist() for _ in range(int(concurrency))], dtype=object
    )


def kv_usage(
    spec: ModelSpec,
    seq_lens: Iterable[int] | np.ndarray,
    *,
    kv_dtype: str = "fp16",
    tp: int = 1,
    block_size: int = 16,
    max_len: int | None = None,
    shared_prefix_len: int = 0,
) -> KVUsage:
    """Blocks, live, allocated, slack and reserved bytes for sequences of ``seq_lens`` tokens."""
    block_size = check_block_size(block_size)
    dtype = canonical_dtype(kv_dtype)
    n = as_lengths(seq_lens)
    if n.size == 0:
        raise KvsimError("give at least one sequence")
    num_seqs = int(n.size)
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len <= 0:
            raise KvsimError(f"max_len must be a positive integer, got {max_len!r}")
        longest = int(max(n.tolist())) if n.dtype == object else int(n.max())
        if longest > max_len:
            raise KvsimError(f"a sequence of {longest} tokens exceeds max_len {max_len}")
    if isinstance(shared_prefix_len, bool) or not isinstance(shared_prefix_len, (int, np.integer)) or shared_prefix_len < 0:
        raise KvsimError(f"shared prefix must be a non-negative integer, got {shared_prefix_len!r}")
    shortest = int(min(n.tolist())) if n.dtype == object else int(n.min())
    if shared_prefix_len > shortest:
        raise KvsimError(
            f"shared prefix of {shared_prefix_len} tokens is longer than the shortest sequence ({shortest})"
        )

    B = block_size
    blocks = blocks_for_tokens(n, B)
    total_tokens = _safe_sum(n)
    total_blocks = _safe_sum(blocks)
    shared_blocks = int(shared_prefix_len) // B if num_seqs > 1 else 0
    saved_blocks = shared_blocks * (num_seqs - 1)

    live = allocated = reserved = saved = 0
    for kind, count in spec.layer_counts().items():
        per_token = count * spec.layer_bytes_per_token(kind, dtype, tp)
        if kind == SLIDING:
            W = int(spec.sliding_window)
            held = window_blocks(n, B, W) if n.dtype != object else np.array(
                [0 if x == 0 else (x - 1) // B - max(0, x - W) // B + 1 for x in n.tolist()], dtype=object
            )
            live_tokens = _safe_sum(np.minimum(n, W)) if n.dtype != object else sum(min(x, W) for x in n.tolist())
            held_blocks = _safe_sum(held)
            reserve_tokens = min(max_len, W) if max_len is not None else 0
        else:
            live_tokens = total_tokens - saved_blocks * B
            held_blocks = total_blocks - saved_blocks
            saved += saved_blocks * B * per_token
            reserve_tokens = max_len or 0
        live += live_tokens * per_token
        allocated += held_blocks * B * per_token
        reserved += num_seqs * reserve_tokens * per_token

    bytes_per_token = spec.bytes_per_token(dtype, tp)
    return KVUsage(
        model=spec.name,
        kv_dtype=dtype,
        tp=tp,
        block_size=B,
        bytes_per_token=bytes_per_token,
        block_bytes=B * bytes_per_token,
        num_sequences=num_seqs,
        tokens=total_tokens,
        blocks=total_blocks,
        physical_blocks=total_blocks - saved_blocks,
        live_bytes=live,
        allocated_bytes=allocated,
        slack_bytes=allocated - live,
        slack_tokens=total_blocks * B - total_tokens,
        reserved_bytes=reserved if max_len is not None else None,
        max_len=int(max_len) if max_len is not None else None,
        shared_prefix_tokens=int(shared_prefix_len),
        shared_blocks=shared_blocks,
        sharing_saved_bytes=saved,
    )


def per_sequence_table(
    spec: ModelSpec,
    seq_lens: Iterable[int] | np.ndarray,
    *,
    kv_dtype: str = "fp16",
    tp: int = 1,
    block_size: int = 16,
) -> pd.DataFrame:
    """One row per sequence: tokens, blocks, live / allocated / slack bytes (unshared)."""
    B = check_block_size(block_size)
    n = as_lengths(seq_lens)
    rows = {"sequence": np.arange(n.size), "tokens": n, "blocks": blocks_for_tokens(n, B)}
    live = np.zeros(n.size, dtype=object)
    alloc = np.zeros(n.size, dtype=object)
    for kind, count in spec.layer_counts().items():
        per_token = count * spec.layer_bytes_per_token(kind, kv_dtype, tp)
        if kind == SLIDING:
            W = int(spec.sliding_window)
            held = np.array([0 if x == 0 else (x - 1) // B - max(0, x - W) // B + 1 for x in n.tolist()], dtype=object)
            live_tokens = np.array([min(int(x), W) for x in n.tolist()], dtype=object)
        else:
            held = np.array(rows["blocks"].tolist(), dtype=object)
            live_tokens = np.array(n.tolist(), dtype=object)
        live = live + live_tokens * per_token
        alloc = alloc + held * (B * per_token)
    rows["live_bytes"] = live
    rows["allocated_bytes"] = alloc
    rows["slack_bytes"] = alloc - live
    rows["slack_tokens"] = rows["blocks"] * B - n
    return pd.DataFrame(rows)


def concurrency_sweep(
    spec: ModelSpec,
    context: int,
    concurrencies: Iterable[int],
    *,
    kv_dtype: str = "fp16",
    tp: int = 1,
    block_size: int = 16,
    max_len: int | None = None,
) -> pd.DataFrame:
    """Live, allocated (paged) and reserved bytes as the number of sequences grows.

    All sequences hold ``context`` tokens; the reservation baseline reserves ``max_len``
    each (``context`` when not given, which makes reservation waste zero).
    """
    single = kv_usage(spec, [context], kv_dtype=kv_dtype, tp=tp, block_size=block_size,
                      max_len=max_len if max_len is not None else context)
    conc = as_lengths(list(concurrencies), "concurrency")
    # Every quantity is linear in the number of identical, unshared sequences.
    return pd.DataFrame(
        {
            "concurrency": conc,
            "live_bytes": [int(c) * single.live_bytes for c in conc.tolist()],
            "allocated_bytes": [int(c) * single.allocated_bytes for c in conc.tolist()],
            "reserved_bytes": [int(c) * single.reserved_bytes for c in conc.tolist()],
        }
    )


DEFAULT_SWEEP_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: Bytes of one block-table entry (vLLM and the kernels here use int32 block ids).
BLOCK_TABLE_ENTRY_BYTES = 4


def block_size_sweep(
    spec: ModelSpec,
    seq_lens: Iterable[int] | np.ndarray,
    block_sizes: Iterable[int] = DEFAULT_SWEEP_BLOCK_SIZES,
    *,
    kv_dtype: str = "fp16",
    tp: int = 1,
) -> pd.DataFrame:
    """Slack versus bookkeeping: small blocks waste less memory but need longer block
    tables (more entries to store, gather and update)."""
    n = as_lengths(seq_lens)
    rows = []
    for B in block_sizes:
        u = kv_usage(spec, n, kv_dtype=kv_dtype, tp=tp, block_size=B)
        rows.append(
            {
                "block_size": u.block_size,
                "blocks": u.blocks,
                "block_table_bytes": u.blocks * BLOCK_TABLE_ENTRY_BYTES,
                "allocated_bytes": u.allocated_bytes,
                "slack_bytes": u.slack_bytes,
                "slack_tokens": u.slack_tokens,
                "slack_fraction": u.slack_fraction,
            }
        )
    return pd.DataFrame(rows)


__all__ = [
    "KVUsage", "kv_usage", "per_sequence_table", "concurrency_sweep", "block_size_sweep",
    "sequence_lengths", "parse_lengths", "blocks_for_tokens", "window_blocks", "as_lengths", "check_block_size",
    "DEFAULT_SWEEP_BLOCK_SIZES", "BLOCK_TABLE_ENTRY_BYTES",
]
