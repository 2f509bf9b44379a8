"""The ``torch`` backend: paged attention written as plainly as PyTorch allows.

It is the readable statement of what the Triton kernels compute, and the backend the
live engine uses on CPU, so it is vectorised (one gather through the block table for
the whole batch in decode; one loop iteration per *sequence*, never per token, in
prefill). Scores and softmax are computed in float32 whatever the cache dtype.

Callers go through `kernels.paged_attention` & co., which validate arguments first;
these functions assume valid input.
"""

from __future__ import annotations

import torch

from kernels._validate import AttentionShape, CacheShape


def _gather(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Whole blocks in logical order: table [..., nb] -> [..., nb * block_size, num_kv_heads, head_dim] float32.

    index_select on rows of whole blocks moves memory at close to copy speed; advanced
    indexing per token would not.
    """
    num_blocks, block_size, kvh, hd = cache.shape
    rows = cache.reshape(num_blocks, block_size * kvh * hd).index_select(0, table.reshape(-1))
    return rows.view(*table.shape[:-1], table.shape[-1] * block_size, kvh, hd).float()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """Masked softmax attention in float32, one batched matmul per KV head.

    q: [B, num_kv_heads, M, head_dim] (M = group x query tokens); k, v: [B, T, num_kv_heads,
    head_dim] as gathered; visible: bool, broadcastable to [B, M, T]. Returns q's shape.
    Slicing one KV head out of k is a strided view that bmm reads in place, so the loop
    (over heads, never tokens) avoids re-laying-out the gathered cache.
    """
    out = torch.empty_like(q)
    # Slots no query may see (past seq_len, before the window) can hold anything, NaN
    # included (the live engine poisons unwritten slots): zero their V so that the
    # zero softmax weight times V stays 0 instead of 0 * NaN = NaN. k and v are fresh
    # float32 gathers, so editing them in place touches no cache.
    hidden = ~(visible if visible.dim() == 3 else visible[:, None, :]).any(dim=-2)  # [B, T]
    if bool(hidden.any()):
        v.masked_fill_(hidden[:, :, None, None], 0.0)
    for h in range(q.shape[1]):
        scores = torch.bmm(q[:, h], k[:, :, h, :].transpose(1, 2)) * scale  # [B, M, T]
        scores.masked_fill_(~visible, float("-inf"))
        out[:, h] = torch.bmm(torch.softmax(scores, dim=-1), v[:, :, h, :])  # [B, M, head_dim]
    return out


def paged_attention(query, key_cache, value_cache, block_tables, seq_lens, *, shape: AttentionShape, scale: float,
                    sliding_window: int | None, out: torch.Tensor) -> torch.Tensor:
    """Decode: each sequence's one query token attends to its seq_len cached tokens."""
    bs = shape.cache.block_size
    lens = seq_lens.long()  # [num_seqs]
    num_blocks_read = -(-int(lens.max()) // bs)
    num_tokens = num_blocks_read * bs
    pos = torch.arange(num_tokens, device=query.device)  # [T]
    first = (lens - sliding_window).clamp_min(0) if sliding_window else torch.zeros_like(lens)
    visible = (pos[None, :] < lens[:, None]) & (pos[None, :] >= first[:, None])  # [num_seqs, T]

    # Entries past a sequence's end (or before its window) may be anything, e.g. -1:
    # point them at block 0 so the gather stays in bounds; the mask hides them.
    block_start = torch.arange(num_blocks_read, device=query.device) * bs  # [nb]
    block_read = (block_start[None, :] < lens[:, None]) & (block_start[None, :] + bs > first[:, None])
    table = torch.where(block_read, block_tables[:, :num_blocks_read].long(), 0)  # [num_seqs, nb]

    k = _gather(key_cache, table)  # [num_seqs, T, num_kv_heads, head_dim]
    v = _gather(value_cache, table)
    q = query.float().reshape(shape.num_seqs, shape.cache.num_kv_heads, shape.group_size, shape.cache.head_dim)
    o = _attend(q, k, v, visible[:, None, :], scale)  # [num_seqs, num_kv_heads, group, head_dim]
    out.copy_(o.reshape(out.shape))
    return out


def paged_prefill(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, *,
                  shape: AttentionShape, scale: float, sliding_window: int | None, out: torch.Tensor) -> torch.Tensor:
    """Prefill: new token i of a sequence sits at position context_len + i and attends causally."""
    bs = shape.cache.block_size
    kvh, group, hd = shape.cache.num_kv_heads, shape.group_size, shape.cache.head_dim
    starts = query_start_loc.tolist()
    ctx_lens = context_lens.tolist()
    for s in range(shape.num_seqs):
        q0, q1, ctx = starts[s], starts[s + 1], ctx_lens[s]
        q_len = q1 - q0
        if q_len == 0:
            continue
        total = ctx + q_len
        nb = -(-total // bs)
        first = max(0, ctx - sliding_window + 1) if sliding_window else 0
        row = block_tables[s, :nb].long()
        row = torch.where(torch.arange(nb, device=row.device) >= first // bs, row, 0)  # unread entries -> block 0
        k = _gather(key_cache, row[None])  # [1, nb * bs, num_kv_heads, head_dim]
        v = _gather(value_cache, row[None])
        # rows (token i, head-in-group g) -> [1, num_kv_heads, q_len * group, head_dim]
        q = query[q0:q1].float().reshape(q_len, kvh, group, hd).permute(1, 0, 2, 3).reshape(1, kvh, q_len * group, hd)
        q_pos = ctx + torch.arange(q_len, device=query.device).repeat_interleave(group)[:, None]  # [q_len*group, 1]
        k_pos = torch.arange(nb * bs, device=query.device)[None, :]  # [1, T]
        visible = (k_pos <= q_pos) & (k_pos >= first)
        if sliding_window:
            visible &= k_pos > q_pos - sliding_window
        o = _attend(q, k, v, visible[None], scale)  # [1, num_kv_heads, q_len * group, head_dim]
        o = o.reshape(kvh, q_len, group, hd).permute(1, 0, 2, 3)  # [q_len, num_kv_heads, group, head_dim]
        out[q0:q1] = o.reshape(q_len, shape.num_heads, hd).to(out.dtype)
    return out


def write_kv(key, value, key_cache, value_cache, slot_mapping, *, cache: CacheShape) -> None:
    """Scatter tokens into their slots (slot = block * block_size + offset); slot -1 is skipped."""
    slots = slot_mapping.long()
    keep = slots >= 0
    slots = slots[keep]
    block = torch.div(slots, cache.block_size, rounding_mode="floor")
    offset = slots % cache.block_size
    key_cache[block, offset] = key[keep]
    value_cache[block, offset] = value[keep]


def copy_blocks(key_cache, value_cache, block_mapping, *, cache: CacheShape) -> None:
    """Copy whole physical blocks, rows of (src, dst): the data half of copy-on-write."""
    src = block_mapping[:, 0].long()
    dst = block_mapping[:, 1].long()
    key_cache[dst] = key_cache[src]
    value_cache[dst] = value_cache[src]
