"""Triton kernels that write the paged KV cache: `write_kv` and `copy_blocks`.

Imported lazily by `kernels` on first use: this module imports triton.

Both move whole ``[num_kv_heads, head_dim]`` token rows (one program per token for
`write_kv`, one per (pair, slot in block) for `copy_blocks`), padded to powers of two
and masked, with every cache stride passed explicitly so views of a bigger buffer work.
Block ids are widened to int64 before they are multiplied by the block stride: a cache
of tens of GB has more than 2**31 elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._validate import CacheShape


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    slot_mapping_ptr,  # [num_tokens] int32/int64, -1 = skip
    num_kv_heads,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_h = tl.arange(0, HEADS_PAD)
        offs_d = tl.arange(0, HEAD_PAD)
        mask = (offs_h < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
        # k, v: [HEADS_PAD, HEAD_PAD]
        k = tl.load(key_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=mask)
        v = tl.load(value_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd,
                    mask=mask)
        tl.store(k_cache_ptr + block * stride_kcb + offset * stride_kcs + offs_h[:, None] * stride_kch
                 + offs_d[None, :] * stride_kcd, k, mask=mask)
        tl.store(v_cache_ptr + block * stride_vcb + offset * stride_vcs + offs_h[:, None] * stride_vch
                 + offs_d[None, :] * stride_vcd, v, mask=mask)


@triton.jit
def _copy_blocks_kernel(
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    mapping_ptr,  # [num_pairs, 2] (src, dst), contiguous
    num_kv_heads,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    HEADS_PAD: tl.constexpr,
):
    pair = tl.program_id(0)
    offset = tl.program_id(1)  # slot within the block
    src = tl.load(mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(mapping_ptr + 2 * pair + 1).to(tl.int64)
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    mask = (offs_h < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k_row = offset * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :] * stride_kcd
    v_row = offset * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :] * stride_vcd
    k = tl.load(k_cache_ptr + src * stride_kcb + k_row, mask=mask)
    v = tl.load(v_cache_ptr + src * stride_vcb + v_row, mask=mask)
    tl.store(k_cache_ptr + dst * stride_kcb + k_row, k, mask=mask)
    tl.store(v_cache_ptr + dst * stride_vcb + v_row, v, mask=mask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def write_kv(key, value, key_cache, value_cache, slot_mapping, *, cache: CacheShape) -> None:
    if key.shape[0] == 0:
        return
    slot_mapping = slot_mapping.contiguous()
    _write_kv_kernel[(key.shape[0],)](
        key, value, key_cache, value_cache, slot_mapping, cache.num_kv_heads,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        HEAD_DIM=cache.head_dim, HEAD_PAD=_next_pow2(cache.head_dim), HEADS_PAD=_next_pow2(cache.num_kv_heads),
        BLOCK_SIZE=cache.block_size, num_warps=4,
    )


def copy_blocks(key_cache, value_cache, block_mapping, *, cache: CacheShape) -> None:
    if block_mapping.shape[0] == 0:
        return
    block_mapping = block_mapping.contiguous()
    _copy_blocks_kernel[(block_mapping.shape[0], cache.block_size)](
        key_cache, value_cache, block_mapping, cache.num_kv_heads,
        *key_cache.stride(), *value_cache.stride(),
        HEAD_DIM=cache.head_dim, HEAD_PAD=_next_pow2(cache.head_dim), HEADS_PAD=_next_pow2(cache.num_kv_heads),
        num_warps=4,
    )
