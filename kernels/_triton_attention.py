"""Triton kernels for attention over a paged KV cache (the ``triton`` backend).

Imported lazily by `kernels` on first use: this module imports triton.

Performance design (decode)
---------------------------
Decode attention reads every cached K and V element once and does two tiny matmuls
with them, so it is bound by memory bandwidth: the goal is to stream the cache at
copy speed and never read a byte twice.

- **One program per (sequence, KV head[, split])**. The program loads the query rows of
  the *whole group* of query heads sharing that KV head (``GROUP = num_heads //
  num_kv_heads``; 4 for Llama-3-8B, ``num_heads`` for MQA) as one
  ``[GROUP_PAD, HEAD_PAD]`` tile, so each K/V element is read once per group instead
  of once per query head. ``GROUP_PAD = max(16, next_pow2(GROUP))`` because ``tl.dot``
  needs every dimension >= 16; the padded rows are masked (zero queries, never stored).
  ``HEAD_PAD = max(16, next_pow2(head_dim))`` with masked loads covers 80, 96 and 112.
- **Tiles of BLOCK_N tokens, addressed token by token through the block table**. Each
  iteration gathers ``BLOCK_N`` (64, or 32 for head_dim 256) logical positions: logical
  block ``pos // BLOCK_SIZE``, physical block from the table, slot ``pos %
  BLOCK_SIZE``. One tile may span several small blocks (block 8 or 16) or half of a
  big one (block 128); the same code serves every block size, and each row of a tile
  is a contiguous ``head_dim`` run, so loads stay coalesced whatever the block ids.
- **Online softmax in fp32** (running max ``m``, running sum ``l``, unnormalised
  accumulator ``acc``), in base 2: scores are pre-multiplied by ``scale * log2(e)``
  and exponentiated with ``exp2``. ``m`` starts at -1e30 rather than -inf, so a tile
  (or a whole split) with no visible token yields zeros instead of NaN.
- **Split-KV for long contexts with few programs.** With ``num_seqs * num_kv_heads``
  programs the GPU is only full when that product reaches the number of SMs; batch 1
  of Llama-3-8B has 8 programs for 132 SMs. `plan_decode` then cuts each sequence's
  token range into ``num_splits`` partitions (multiples of BLOCK_N) run by separate
  programs, each writing its partial ``(max, sum-exp, unnormalised output)`` in fp32;
  `_paged_decode_reduce_kernel` merges them: ``M = max_s m_s``, ``out = sum_s
  2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s``. Rule (`plan_decode`): split only when
  programs < SMs and the context spans more than two partitions of 512 tokens; aim for
  about two waves of programs, at most 64 splits. The plan uses the block table's width
  as the length bound, so it needs no device sync.

Prefill (`_paged_prefill_kernel`) uses the same gather and online softmax with a query
tile of ``BLOCK_M`` rows = ``BLOCK_Q`` consecutive new tokens x ``GROUP`` heads, so the
K/V tile loaded for one token also serves its neighbours. One program per (query tile,
KV head); a program finds its sequence by binary search over ``query_start_loc``
(tile ``i`` of sequence ``s`` has global index ``query_start_loc[s] // BLOCK_Q + s +
i``; a grid of ``total_tokens // BLOCK_Q + num_seqs`` covers every sequence with no
host sync). It loops over key tiles up to the tile's last query position only (causal).

Interpreter note: under ``TRITON_INTERPRET=1`` (Triton 3.9) ``tl.dot`` multiplies the
raw bit patterns of bfloat16 operands (triton-lang/triton#11584, "not supported yet"),
so there, and only there, bf16 tiles are upcast to fp32 before each dot
(``UPCAST_DOT``). fp32 inputs use ``input_precision="ieee"`` so the GPU does not
silently round them to TF32 (fp32 is the CPU/test dtype; on GPU use fp16/bf16).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels import _backend
from kernels._validate import MAX_NUM_SPLITS, AttentionShape

NEG_INIT = -1.0e30  # running-max start value: finite, so empty tiles give 0 not NaN
PARTITION_MIN = 512  # tokens; shorter contexts are never split


@triton.jit
def _paged_decode_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]                    (not IS_SPLIT)
    part_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_PAD] fp32 (IS_SPLIT)
    part_max_ptr,  # [num_seqs, num_heads, num_splits] fp32, log2 units
    part_sum_ptr,  # [num_seqs, num_heads, num_splits] fp32
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    qk_scale,  # scale * log2(e)
    num_heads,
    num_splits,
    partition_size,  # tokens per split, a multiple of BLOCK_N
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt,
    stride_os, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,  # 0: attend to the whole sequence
    IS_SPLIT: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    if SLIDING_WINDOW > 0:
        first_pos = tl.maximum(seq_len - SLIDING_WINDOW, 0)
    else:
        first_pos = 0
    # Splits tile the span from the BLOCK_N-aligned first visible position.
    span_start = (first_pos // BLOCK_N) * BLOCK_N
    start = span_start + split * partition_size
    end = tl.minimum(start + partition_size, seq_len)

    offs_g = tl.arange(0, GROUP_PAD)  # [GROUP_PAD]
    offs_d = tl.arange(0, HEAD_PAD)  # [HEAD_PAD]
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    head = kv_head * GROUP + offs_g  # [GROUP_PAD] query heads of this KV head

    # q: [GROUP_PAD, HEAD_PAD]
    q = tl.load(
        q_ptr + seq * stride_qs + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([GROUP_PAD], NEG_INIT, dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], dtype=tl.float32)

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + offs_n  # [BLOCK_N] logical positions
        tok_mask = (pos < end) & (pos >= first_pos)
        phys = tl.load(bt_row + pos // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        kv_mask = tok_mask[:, None] & d_mask[None, :]
        # k, v: [BLOCK_N, HEAD_PAD]
        k = tl.load(
            k_cache_ptr + phys[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh
            + offs_d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        )
        v = tl.load(
            v_cache_ptr + phys[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
            + offs_d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        )
        if UPCAST_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # s: [GROUP_PAD, BLOCK_N] in log2 units
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if IS_SPLIT:
        part = (seq * num_heads + head) * num_splits + split  # [GROUP_PAD]
        tl.store(part_max_ptr + part, m_i, mask=g_mask)
        tl.store(part_sum_ptr + part, l_i, mask=g_mask)
        tl.store(part_out_ptr + part[:, None] * HEAD_PAD + offs_d[None, :], acc, mask=g_mask[:, None])
    else:
        o = acc / l_i[:, None]  # l_i >= 1: the running max itself contributes 2^0
        tl.store(
            out_ptr + seq * stride_os + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
            o.to(out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )


@triton.jit
def _paged_decode_reduce_kernel(
    out_ptr,  # [num_seqs, num_heads, head_dim]
    part_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_PAD] fp32
    part_max_ptr,  # [num_seqs, num_heads, num_splits] fp32
    part_sum_ptr,  # [num_seqs, num_heads, num_splits] fp32
    num_heads,
    num_splits,
    stride_os, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLIT_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLIT_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    s_mask = offs_s < num_splits
    base = (seq * num_heads + head) * num_splits
    # Split 0 always holds the first visible token, so M is finite and empty splits
    # (m = -1e30, l = 0, acc = 0) weigh exactly 0.
    m = tl.load(part_max_ptr + base + offs_s, mask=s_mask, other=float("-inf"))  # [SPLIT_PAD]
    l = tl.load(part_sum_ptr + base + offs_s, mask=s_mask, other=0.0)
    m_all = tl.max(m, 0)
    w = tl.exp2(m - m_all)  # [SPLIT_PAD]
    denom = tl.sum(w * l, 0)
    acc = tl.load(part_out_ptr + (base + offs_s[:, None]) * HEAD_PAD + offs_d[None, :], mask=s_mask[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], 0) / denom  # [HEAD_PAD]
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d * stride_od, o.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


@triton.jit
def _paged_prefill_kernel(
    out_ptr,  # [total_query_tokens, num_heads, head_dim]
    q_ptr,  # [total_query_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    context_lens_ptr,  # [num_seqs] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    qk_scale,
    num_seqs,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt,
    stride_ot, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows per query tile (>= 16, power of two)
    BLOCK_Q: tl.constexpr,  # new tokens per query tile: BLOCK_M // GROUP
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)

    # Binary search: the last sequence s with query_start_loc[s] // BLOCK_Q + s <= tile.
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        mid_first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if mid_first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_tile = tile - (q_start // BLOCK_Q + seq)
    first_q = local_tile * BLOCK_Q
    if first_q < q_len:
        ctx_len = tl.load(context_lens_ptr + seq)

        offs_m = tl.arange(0, BLOCK_M)  # [BLOCK_M] rows = (token, head-in-group)
        offs_d = tl.arange(0, HEAD_PAD)
        offs_n = tl.arange(0, BLOCK_N)
        d_mask = offs_d < HEAD_DIM
        tok = offs_m // GROUP
        q_idx = first_q + tok  # new-token index within the sequence
        row_mask = (tok < BLOCK_Q) & (q_idx < q_len)
        head = kv_head * GROUP + offs_m % GROUP
        q_pos = ctx_len + q_idx  # [BLOCK_M] absolute position of each row's token

        # q: [BLOCK_M, HEAD_PAD]
        q = tl.load(
            q_ptr + (q_start + q_idx).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
            + offs_d[None, :] * stride_qd,
            mask=row_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        if UPCAST_DOT:
            q = q.to(tl.float32)

        last_pos = ctx_len + tl.minimum(first_q + BLOCK_Q, q_len) - 1  # last key any row may see
        if SLIDING_WINDOW > 0:
            first_pos = tl.maximum(ctx_len + first_q - SLIDING_WINDOW + 1, 0)
        else:
            first_pos = 0

        m_i = tl.full([BLOCK_M], NEG_INIT, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for tile_start in range((first_pos // BLOCK_N) * BLOCK_N, last_pos + 1, BLOCK_N):
            pos = tile_start + offs_n  # [BLOCK_N]
            tok_mask = (pos <= last_pos) & (pos >= first_pos)
            phys = tl.load(bt_row + pos // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
            slot = pos % BLOCK_SIZE
            kv_mask = tok_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_cache_ptr + phys[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh
                + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0,
            )
            v = tl.load(
                v_cache_ptr + phys[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
                + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0,
            )
            if UPCAST_DOT:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
            visible = tok_mask[None, :] & (pos[None, :] <= q_pos[:, None])
            if SLIDING_WINDOW > 0:
                visible = visible & (pos[None, :] > q_pos[:, None] - SLIDING_WINDOW)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        # Rows past the tile's last token saw nothing (l = 0); they are not stored.
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + (q_start + q_idx).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
            + offs_d[None, :] * stride_od,
            o.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & d_mask[None, :],
        )


# ----------------------------------------------------------------------------- launchers


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _tile_n(head_pad: int) -> int:
    """Tokens per K/V tile: 64 rows of up to 128 elements, 32 rows for head_dim 256."""
    return 64 if head_pad <= 128 else 32


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # interpreter: programs run one after another, splitting only adds work


def _dot_flags(dtype: torch.dtype) -> dict:
    return {
        "UPCAST_DOT": dtype == torch.bfloat16 and _backend.interpreting(),
        # fp32: exact products, not TF32; 16-bit inputs: the backend default (precision is moot).
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else None,
    }


def plan_decode(shape: AttentionShape, sliding_window: int | None, num_splits: int | None,
                num_sms: int) -> tuple[int, int, int]:
    """Choose ``(num_splits, partition_size, BLOCK_N)`` for a decode call.

    The rule (when `num_splits` is None): split only when ``num_seqs * num_kv_heads``
    programs cannot fill ``num_sms`` SMs *and* a sequence may span more than
    ``2 * PARTITION_MIN`` tokens; then aim for about ``2 * num_sms`` programs in all,
    with partitions of at least PARTITION_MIN tokens and at most MAX_NUM_SPLITS splits.
    A requested `num_splits` is honoured up to what the context length allows (each
    partition holds at least one BLOCK_N tile), so the result may be smaller.
    """
    block_n = _tile_n(max(16, _next_pow2(shape.cache.head_dim)))
    span = shape.table_capacity  # longest token range a row of the table can address
    if sliding_window:
        span = min(span, sliding_window + block_n - 1)  # the aligned-down start adds < BLOCK_N
    span = max(span, 1)
    if num_splits is None:
        programs = shape.num_seqs * shape.cache.num_kv_heads
        if programs >= num_sms or span <= 2 * PARTITION_MIN:
            num_splits = 1
        else:
            num_splits = min(-(-2 * num_sms // programs), span // PARTITION_MIN, MAX_NUM_SPLITS)
    num_splits = max(1, num_splits)
    partition = -(-span // num_splits)
    partition = -(-partition // block_n) * block_n
    return -(-span // partition), partition, block_n


def paged_attention(query, key_cache, value_cache, block_tables, seq_lens, *, shape: AttentionShape, scale: float,
                    sliding_window: int | None, num_splits: int | None, out: torch.Tensor) -> torch.Tensor:
    cache = shape.cache
    block_tables, seq_lens = block_tables.contiguous(), seq_lens.contiguous()  # kernels index rows directly
    head_pad = max(16, _next_pow2(cache.head_dim))  # tl.dot needs K >= 16
    group_pad = max(16, _next_pow2(shape.group_size))
    splits, partition, block_n = plan_decode(shape, sliding_window, num_splits, _num_sms(query.device))
    is_split = splits > 1
    if is_split:
        part_out = torch.empty(shape.num_seqs, shape.num_heads, splits, head_pad, dtype=torch.float32,
                               device=query.device)
        part_max = torch.empty(shape.num_seqs, shape.num_heads, splits, dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_out = part_max = part_sum = out  # unused placeholders
    grid = (shape.num_seqs, cache.num_kv_heads, splits)
    _paged_decode_kernel[grid](
        out, part_out, part_max, part_sum,
        query, key_cache, value_cache, block_tables, seq_lens,
        scale * math.log2(math.e), shape.num_heads, splits, partition,
        *query.stride(), *key_cache.stride(), *value_cache.stride(), block_tables.stride(0), *out.stride(),
        HEAD_DIM=cache.head_dim, HEAD_PAD=head_pad, GROUP=shape.group_size, GROUP_PAD=group_pad,
        BLOCK_SIZE=cache.block_size, BLOCK_N=block_n, SLIDING_WINDOW=sliding_window or 0, IS_SPLIT=is_split,
        num_warps=4, **_dot_flags(query.dtype),
    )
    if is_split:
        _paged_decode_reduce_kernel[(shape.num_seqs, shape.num_heads)](
            out, part_out, part_max, part_sum, shape.num_heads, splits, *out.stride(),
            HEAD_DIM=cache.head_dim, HEAD_PAD=head_pad, SPLIT_PAD=_next_pow2(splits), num_warps=4,
        )
    return out


def paged_prefill(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, *,
                  shape: AttentionShape, scale: float, sliding_window: int | None, out: torch.Tensor) -> torch.Tensor:
    cache = shape.cache
    block_tables, context_lens = block_tables.contiguous(), context_lens.contiguous()
    query_start_loc = query_start_loc.contiguous()
    head_pad = max(16, _next_pow2(cache.head_dim))  # tl.dot needs K >= 16
    block_m = max(64, _next_pow2(shape.group_size))
    block_q = block_m // shape.group_size
    total_tokens = query.shape[0]
    if total_tokens == 0:
        return out
    grid = (total_tokens // block_q + shape.num_seqs, cache.num_kv_heads)
    _paged_prefill_kernel[grid](
        out, query, key_cache, value_cache, block_tables, context_lens, query_start_loc,
        scale * math.log2(math.e), shape.num_seqs,
        *query.stride(), *key_cache.stride(), *value_cache.stride(), block_tables.stride(0), *out.stride(),
        HEAD_DIM=cache.head_dim, HEAD_PAD=head_pad, GROUP=shape.group_size, BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_SIZE=cache.block_size, BLOCK_N=_tile_n(head_pad), SLIDING_WINDOW=sliding_window or 0,
        num_warps=8 if head_pad > 128 else 4, **_dot_flags(query.dtype),
    )
    return out
