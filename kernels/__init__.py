"""Paged-attention kernels: attention that reads K/V through a block table.

The cache layout (public; the live engine and users script against it)
----------------------------------------------------------------------
``key_cache`` and ``value_cache`` are two tensors of shape
``[num_blocks, block_size, num_kv_heads, head_dim]`` (float32, float16 or bfloat16;
block_size a power of two, 8 to 128 tested; head_dim up to 256). A sequence's tokens
live in physical blocks listed, in logical order, by its row of ``block_tables``
(int32 ``[num_seqs, max_blocks_per_seq]``): token ``t`` is at
``cache[block_tables[s, t // block_size], t % block_size]``. A *slot* is the flat
index ``block * block_size + offset``. Rows of the table may contain anything past
the blocks a call reads (e.g. -1); the ids it does read are checked against the cache.

Public functions
----------------
- `paged_attention` (decode): one new query token per sequence, already written into
  the cache, attends to the sequence's ``seq_lens[s]`` cached tokens.
- `paged_prefill`: a variable number of new query tokens per sequence, packed.
  **Convention** (the one vLLM uses for prefix-cache hits and chunked prefill): sequence
  ``s`` has ``context_lens[s]`` tokens already cached from earlier steps, and
  ``q_len = query_start_loc[s+1] - query_start_loc[s]`` new tokens whose K/V have
  *already* been written into the cache with `write_kv` at positions
  ``context_len .. context_len + q_len - 1``; the sequence's total length is
  ``context_len + q_len``. New token ``i`` sits at position ``context_len + i`` and
  attends causally to every position ``<= context_len + i`` (cached context and the
  new tokens before it and itself). ``context_lens = 0`` is an ordinary prefill;
  ``q_len = 1`` is decode.
- `write_kv`: scatter new tokens' K/V into their slots (slot -1 = skip, e.g. padding).
- `copy_blocks`: copy whole blocks, rows of (src, dst) - the data half of copy-on-write.

``sliding_window=w`` means a query at position ``p`` attends to positions
``p - w + 1 .. p`` (the last ``w`` tokens, itself included). Scores are scaled by
``scale`` (default ``1/sqrt(head_dim)``) and the softmax runs in float32 on every
backend; outputs have the query's dtype.

Backends
--------
``backend="triton"`` runs the kernels in `kernels._triton_attention` /
`kernels._triton_cache` (compiled for CUDA, or under Triton's CPU interpreter when
``TRITON_INTERPRET=1`` was set before triton was imported); ``"torch"`` runs the
readable reference in `kernels.reference`; ``"auto"`` picks compiled Triton for CUDA
tensors and torch otherwise. Triton is imported only when the triton backend is first
used, so ``import kernels`` works without it. `available_backends()` and
`triton_mode()` say what can run here.

Every function validates its arguments before launching anything: wrong dtypes raise
TypeError, wrong shapes/devices/indices ValueError, each with a one-line message.
``validate=False`` skips only the checks that read index tensors (block ids in range,
lengths covered by the table), which cost a device sync on CUDA.
"""

from __future__ import annotations

import math

import torch

from kernels import _backend, _validate
from kernels import reference as _reference
from kernels._backend import available_backends, triton_mode

__all__ = [
    "available_backends",
    "copy_blocks",
    "paged_attention",
    "paged_prefill",
    "triton_mode",
    "write_kv",
]


def _impl(backend: str, device: torch.device, triton_module: str):
    chosen = _backend.resolve(backend, device)
    return _reference if chosen == "torch" else _backend.triton_module(triton_module)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
    sliding_window: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Decode attention of one query token per sequence over its paged K/V.

    Args:
        query: ``[num_seqs, num_heads, head_dim]``; num_heads a multiple of num_kv_heads
            (GQA; MQA when num_kv_heads is 1).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``, physical block ids.
        seq_lens: int32 ``[num_seqs]``, tokens per sequence (>= 1), the query's own
            token included (the query sits at position ``seq_len - 1``).
        scale: score scale, default ``1/sqrt(head_dim)``.
        backend: "auto", "triton" or "torch".
        sliding_window: attend only to the last `sliding_window` tokens.
        num_splits: triton only: split each sequence's tokens into this many partitions
            merged by a reduction kernel (1 forces the single-pass kernel); None lets
            `kernels._triton_attention.plan_decode` choose. Ignored by torch.
        out: optional output buffer shaped like `query` (written in full).
        validate: check block ids and lengths against the cache (reads the tables).

    Returns:
        ``out``: ``[num_seqs, num_heads, head_dim]`` in the query's dtype.
    """
    shape = _validate.check_decode(query, key_cache, value_cache, block_tables, seq_lens, scale=scale,
                                   sliding_window=sliding_window, num_splits=num_splits, out=out)
    impl = _impl(backend, query.device, "_triton_attention")
    if validate:
        _validate.check_decode_indices(shape, block_tables, seq_lens, sliding_window)
    if out is None:
        out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(shape.cache.head_dim)
    kwargs = {"num_splits": num_splits} if impl is not _reference else {}
    return impl.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, shape=shape, scale=scale,
                                sliding_window=sliding_window, out=out, **kwargs)


def paged_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Causal attention of packed new tokens over their cached context and themselves.

    Args:
        query: ``[total_query_tokens, num_heads, head_dim]``, the new tokens of all
            sequences packed back to back.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``,
            already holding the new tokens' K/V (see the module docstring).
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``.
        context_lens: int32 ``[num_seqs]``, tokens cached *before* this step's new ones.
        query_start_loc: int32 ``[num_seqs + 1]``, cumulative offsets into `query`
            (``query_start_loc[0] = 0``, ``query_start_loc[-1] = total_query_tokens``).
        scale, backend, sliding_window, out, validate: as in `paged_attention`.

    Returns:
        ``out``: ``[total_query_tokens, num_heads, head_dim]`` in the query's dtype.
    """
    shape = _validate.check_prefill(query, key_cache, value_cache, block_tables, context_lens, query_start_loc,
                                    scale=scale, sliding_window=sliding_window, out=out)
    impl = _impl(backend, query.device, "_triton_attention")
    if validate:
        _validate.check_prefill_indices(shape, query, block_tables, context_lens, query_start_loc, sliding_window)
    if out is None:
        out = torch.empty_like(query)
    if query.shape[0] == 0:
        return out
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(shape.cache.head_dim)
    return impl.paged_prefill(query, key_cache, value_cache, block_tables, context_lens, query_start_loc,
                              shape=shape, scale=scale, sliding_window=sliding_window, out=out)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str = "auto",
    validate: bool = True,
) -> None:
    """Write new tokens' K/V into the cache in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, the cache's dtype.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        slot_mapping: int32/int64 ``[num_tokens]``, ``block * block_size + offset`` per
            token; -1 skips the token. Slots must be distinct (checked when validating).
    """
    cache = _validate.check_write_kv(key, value, key_cache, value_cache, slot_mapping)
    impl = _impl(backend, key_cache.device, "_triton_cache")
    if validate:
        _validate.check_write_kv_indices(cache, slot_mapping)
    impl.write_kv(key, value, key_cache, value_cache, slot_mapping, cache=cache)


def copy_blocks(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_mapping,
    *,
    backend: str = "auto",
    validate: bool = True,
) -> None:
    """Copy physical blocks in place, for copy-on-write of shared blocks.

    Args:
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_mapping: int ``[num_pairs, 2]`` rows of ``(src, dst)`` (a tensor, or a list
            of pairs). Destinations must be distinct and not also sources: the copies
            run in parallel.
    """
    if not isinstance(block_mapping, torch.Tensor):
        rows = [tuple(pair) for pair in block_mapping]
        block_mapping = torch.tensor(rows, dtype=torch.int64, device=key_cache.device).reshape(len(rows), 2)
    cache = _validate.check_copy_blocks(key_cache, value_cache, block_mapping)
    impl = _impl(backend, key_cache.device, "_triton_cache")
    if validate:
        _validate.check_copy_blocks_indices(cache, block_mapping)
    impl.copy_blocks(key_cache, value_cache, block_mapping, cache=cache)
