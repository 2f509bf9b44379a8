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


def _gather(cache: torch.Tensor, table_row_or_rows: torch.Tensor, num_tokens_padded: int) -> torch.Tensor:
    # cache: [num_blocks, block_size, num_kv_heads, head_dim]; table: [..., nb] int64
    # -> [..., nb * block_size, num_kv_heads, head_dim] in float32 (logical token order)
    gathered = cache[table_row_or_rows]
    lead = gathered.shape[:-4]
    return gathered.reshape(*lead, num_tokens_padded, cache.shape[2], cache.shape[3]).float()


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

    k = _gather(key_cache, table, num_tokens)  # [num_seqs, T, num_kv_heads, head_dim]
    v = _gather(value_cache, table, num_tokens)
    q = query.float().reshape(shape.num_seqs, shape.cache.num_kv_heads, shape.group_size, shape.cache.head_dim)
    scores = torch.einsum("skgd,stkd->skgt", q, k) * scale  # [num_seqs, num_kv_heads, group, T]
    scores.masked_fill_(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    o = torch.einsum("skgt,stkd->skgd", probs, v)  # [num_seqs, num_kv_heads, group, head_dim]
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
        k = _gather(key_cache, row, nb * bs)[:total]  # [total, num_kv_heads, head_dim]
        v = _gather(value_cache, row, nb * bs)[:total]
        q = query[q0:q1].float().reshape(q_len, kvh, group, hd)
        scores = torch.einsum("lkgd,tkd->kglt", q, k) * scale  # [num_kv_heads, group, q_len, total]
        q_pos = ctx + torch.arange(q_len, device=query.device)[:, None]  # [q_len, 1]
        k_pos = torch.arange(total, device=query.device)[None, :]  # [1, total]
        visible = k_pos <= q_pos
        if sliding_window:
            visible &= k_pos > q_pos - sliding_window
        scores.masked_fill_(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("kglt,tkd->lkgd", probs, v)  # [q_len, num_kv_heads, group, head_dim]
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
