"""Argument checks shared by every backend, run before anything is launched.

A paged-attention kernel that is handed a block id past the end of the cache does not
fail: it reads (or, for `write_kv`, writes) someone else's memory and returns plausible
numbers. So the launchers check here, with one-line messages, that shapes, dtypes and
devices agree (`_check_*`: host-only, cheap, always run) and that every block id the
kernel will actually read lies inside the cache (`_check_*_indices`: reads the block
tables, so a device sync on CUDA; callers in a hot loop that built the tables
themselves may pass ``validate=False`` to skip only these).

Caller mistakes raise TypeError (wrong dtype) or ValueError (everything else).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256
MAX_NUM_SPLITS = 64


@dataclass(frozen=True)
class CacheShape:
    """The paged KV cache, as read off ``key_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``."""

    num_blocks: int  # physical blocks in the cache
    block_size: int  # tokens per block (a power of two)
    num_kv_heads: int  # key/value heads stored per token
    head_dim: int  # elements per head


@dataclass(frozen=True)
class AttentionShape:
    """Sizes of one attention call; derived fields save every backend recomputing them."""

    cache: CacheShape
    num_heads: int  # query heads
    num_seqs: int  # sequences in the batch
    max_blocks_per_seq: int  # width of block_tables
    group_size: int = 0  # query heads per KV head (derived)

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_size", self.num_heads // self.cache.num_kv_heads)

    @property
    def table_capacity(self) -> int:
        """Most tokens a row of the block table can address."""
        return self.max_blocks_per_seq * self.cache.block_size


def _check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def _check_index(name: str, t: torch.Tensor, dtypes=(torch.int32,)) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {t.dtype}")


def _check_device(device: torch.device, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but query is on {device}; put all tensors on one device")


def check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> CacheShape:
    _check_float("key_cache", key_cache)
    _check_float("value_cache", value_cache)
    if key_cache.dim() != 4:
        raise ValueError(
            f"key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} differs from key_cache shape {tuple(key_cache.shape)}"
        )
    if value_cache.dtype != key_cache.dtype:
        raise TypeError(f"value_cache dtype {value_cache.dtype} differs from key_cache dtype {key_cache.dtype}")
    if value_cache.device != key_cache.device:
        raise ValueError(f"value_cache is on {value_cache.device} but key_cache is on {key_cache.device}")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if num_blocks < 1 or num_kv_heads < 1:
        raise ValueError(f"the cache needs at least one block and one KV head, got shape {tuple(key_cache.shape)}")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size (key_cache.shape[1]) must be a power of two, got {block_size}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    return CacheShape(num_blocks, block_size, num_kv_heads, head_dim)


def _check_query_and_tables(query, key_cache, value_cache, block_tables, name_q="query") -> AttentionShape:
    _check_float(name_q, query)
    cache = check_cache(key_cache, value_cache)
    if query.dim() != 3:
        raise ValueError(f"{name_q} must be 3-D [tokens, num_heads, head_dim], got shape {tuple(query.shape)}")
    if query.dtype != key_cache.dtype:
        raise TypeError(f"{name_q} dtype {query.dtype} differs from the cache dtype {key_cache.dtype}")
    _check_device(query.device, key_cache=key_cache, value_cache=value_cache)
    if query.shape[2] != cache.head_dim:
        raise ValueError(f"{name_q} head_dim {query.shape[2]} differs from the cache head_dim {cache.head_dim}")
    num_heads = query.shape[1]
    if num_heads < 1 or num_heads % cache.num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({cache.num_kv_heads})"
        )
    _check_index("block_tables", block_tables)
    _check_device(query.device, block_tables=block_tables)
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be 2-D [num_seqs, max_blocks_per_seq], got shape {tuple(block_tables.shape)}")
    return AttentionShape(cache, num_heads, block_tables.shape[0], block_tables.shape[1])


def _check_options(scale, sliding_window, out, query) -> None:
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number or None, got {scale!r}")
    if sliding_window is not None and not (isinstance(sliding_window, int) and sliding_window >= 1):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != query.shape:
            raise ValueError(f"out shape {tuple(out.shape)} differs from query shape {tuple(query.shape)}")
        if out.dtype != query.dtype:
            raise TypeError(f"out dtype {out.dtype} differs from query dtype {query.dtype}")
        _check_device(query.device, out=out)


def check_decode(query, key_cache, value_cache, block_tables, seq_lens, *, scale, sliding_window, num_splits, out):
    """Host-only checks for `paged_attention`; returns the call's shape."""
    shape = _check_query_and_tables(query, key_cache, value_cache, block_tables)
    if query.shape[0] != shape.num_seqs:
        raise ValueError(f"query has {query.shape[0]} sequences but block_tables has {shape.num_seqs} rows")
    _check_index("seq_lens", seq_lens)
    _check_device(query.device, seq_lens=seq_lens)
    if seq_lens.shape != (shape.num_seqs,):
        raise ValueError(f"seq_lens must have shape ({shape.num_seqs},), got {tuple(seq_lens.shape)}")
    _check_options(scale, sliding_window, out, query)
    if num_splits is not None and not (isinstance(num_splits, int) and 1 <= num_splits <= MAX_NUM_SPLITS):
        raise ValueError(f"num_splits must be an int in [1, {MAX_NUM_SPLITS}] or None, got {num_splits!r}")
    return shape


def _check_block_ids(shape: AttentionShape, block_tables, first_pos, end_pos) -> None:
    """Every block id covering positions [first_pos, end_pos) of each row must be in [0, num_blocks)."""
    bs = shape.cache.block_size
    col = torch.arange(shape.max_blocks_per_seq, device=block_tables.device)
    first_block = torch.div(first_pos, bs, rounding_mode="floor")
    end_block = torch.div(end_pos + bs - 1, bs, rounding_mode="floor")
    read = (col[None, :] >= first_block[:, None]) & (col[None, :] < end_block[:, None])
    bad = read & ((block_tables < 0) | (block_tables >= shape.cache.num_blocks))
    if bool(bad.any()):
        seq, idx = (int(i) for i in bad.nonzero()[0])
        value = int(block_tables[seq, idx])
        raise ValueError(
            f"block_tables[{seq}, {idx}] = {value} is not a block of the cache "
            f"(valid ids are 0..{shape.cache.num_blocks - 1})"
        )


def check_decode_indices(shape: AttentionShape, block_tables, seq_lens, sliding_window) -> None:
    """Data checks for `paged_attention` (reads seq_lens and block_tables)."""
    lens = seq_lens.long()
    if bool((lens < 1).any()):
        i = int((lens < 1).nonzero()[0])
        raise ValueError(f"seq_lens[{i}] = {int(lens[i])}; every sequence needs at least one token")
    too_long = lens > shape.table_capacity
    if bool(too_long.any()):
        i = int(too_long.nonzero()[0])
        raise ValueError(
            f"seq_lens[{i}] = {int(lens[i])} exceeds what block_tables covers "
            f"({shape.max_blocks_per_seq} blocks x {shape.cache.block_size} = {shape.table_capacity} tokens)"
        )
    first = (lens - sliding_window).clamp_min(0) if sliding_window else torch.zeros_like(lens)
    _check_block_ids(shape, block_tables, first, lens)


def check_prefill(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, *, scale, sliding_window, out):
    """Host-only checks for `paged_prefill`; returns the call's shape."""
    shape = _check_query_and_tables(query, key_cache, value_cache, block_tables)
    _check_index("context_lens", context_lens)
    _check_index("query_start_loc", query_start_loc)
    _check_device(query.device, context_lens=context_lens, query_start_loc=query_start_loc)
    if context_lens.shape != (shape.num_seqs,):
        raise ValueError(f"context_lens must have shape ({shape.num_seqs},), got {tuple(context_lens.shape)}")
    if query_start_loc.shape != (shape.num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must have shape ({shape.num_seqs + 1},) (num_seqs + 1), got {tuple(query_start_loc.shape)}"
        )
    _check_options(scale, sliding_window, out, query)
    return shape


def check_prefill_indices(shape: AttentionShape, query, block_tables, context_lens, query_start_loc, sliding_window):
    """Data checks for `paged_prefill` (reads the offsets, lengths and block tables)."""
    loc = query_start_loc.long()
    if int(loc[0]) != 0 or int(loc[-1]) != query.shape[0]:
        raise ValueError(
            f"query_start_loc must start at 0 and end at total_query_tokens ({query.shape[0]}), "
            f"got {int(loc[0])} .. {int(loc[-1])}"
        )
    q_lens = loc[1:] - loc[:-1]
    if bool((q_lens < 0).any()):
        i = int((q_lens < 0).nonzero()[0])
        raise ValueError(f"query_start_loc must be non-decreasing; it drops after index {i}")
    ctx = context_lens.long()
    if bool((ctx < 0).any()):
        i = int((ctx < 0).nonzero()[0])
        raise ValueError(f"context_lens[{i}] = {int(ctx[i])} is negative")
    total = ctx + q_lens
    too_long = total > shape.table_capacity
    if bool(too_long.any()):
        i = int(too_long.nonzero()[0])
        raise ValueError(
            f"sequence {i} has context_len + q_len = {int(total[i])} tokens, more than block_tables covers "
            f"({shape.max_blocks_per_seq} blocks x {shape.cache.block_size} = {shape.table_capacity} tokens)"
        )
    # Only sequences with new tokens read anything; the first query sits at position ctx.
    first = (ctx - sliding_window + 1).clamp_min(0) if sliding_window else torch.zeros_like(ctx)
    end = torch.where(q_lens > 0, total, torch.zeros_like(total))
    first = torch.where(q_lens > 0, first, torch.zeros_like(first))
    _check_block_ids(shape, block_tables, first, end)


def check_write_kv(key, value, key_cache, value_cache, slot_mapping) -> CacheShape:
    cache = check_cache(key_cache, value_cache)
    for name, t in (("key", key), ("value", value)):
        _check_float(name, t)
        if t.dim() != 3 or tuple(t.shape[1:]) != (cache.num_kv_heads, cache.head_dim):
            raise ValueError(
                f"{name} must be [num_tokens, {cache.num_kv_heads}, {cache.head_dim}] to match the cache, "
                f"got {tuple(t.shape)}"
            )
        if t.dtype != key_cache.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from the cache dtype {key_cache.dtype}")
        if t.device != key_cache.device:
            raise ValueError(f"{name} is on {t.device} but the cache is on {key_cache.device}")
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} differs from key shape {tuple(key.shape)}")
    _check_index("slot_mapping", slot_mapping, INDEX_DTYPES)
    if slot_mapping.device != key_cache.device:
        raise ValueError(f"slot_mapping is on {slot_mapping.device} but the cache is on {key_cache.device}")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping must have shape ({key.shape[0]},) (one slot per token), got {tuple(slot_mapping.shape)}")
    return cache


def check_write_kv_indices(cache: CacheShape, slot_mapping) -> None:
    slots = slot_mapping.long()
    num_slots = cache.num_blocks * cache.block_size
    bad = (slots < -1) | (slots >= num_slots)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"slot_mapping[{i}] = {int(slots[i])} is outside the cache (valid: -1 to skip, 0..{num_slots - 1})")
    kept = slots[slots >= 0]
    if kept.numel() != torch.unique(kept).numel():
        raise ValueError("slot_mapping writes the same slot twice; the result would depend on thread order")


def check_copy_blocks(key_cache, value_cache, block_mapping) -> CacheShape:
    cache = check_cache(key_cache, value_cache)
    _check_index("block_mapping", block_mapping, INDEX_DTYPES)
    if block_mapping.device != key_cache.device:
        raise ValueError(f"block_mapping is on {block_mapping.device} but the cache is on {key_cache.device}")
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [num_pairs, 2] rows of (src, dst), got shape {tuple(block_mapping.shape)}")
    return cache


def check_copy_blocks_indices(cache: CacheShape, block_mapping) -> None:
    pairs = block_mapping.long()
    bad = (pairs < 0) | (pairs >= cache.num_blocks)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"block_mapping[{row}, {col}] = {int(pairs[row, col])} is not a block of the cache "
            f"(valid ids are 0..{cache.num_blocks - 1})"
        )
    src, dst = pairs[:, 0], pairs[:, 1]
    if dst.numel() != torch.unique(dst).numel():
        raise ValueError("block_mapping copies into the same destination block twice")
    if bool(torch.isin(dst, src).any()):
        raise ValueError("a block in block_mapping is both a source and a destination; copies run in parallel")
