"""Builders and float64 references shared by the kernel tests.

The references are deliberately written differently from `kernels.reference`: one
sequence at a time, gathering token by token with explicit (block, offset) indices,
expanding K/V to every query head, softmax in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TOL = {  # (rtol, atol) against the float64 reference
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 5e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Paged:
    """A paged cache holding `seq_lens[s]` tokens for each sequence s."""

    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, -1 past the end
    seq_lens: torch.Tensor  # [num_seqs] int32


def make_paged(seq_lens, *, num_kv_heads, head_dim, block_size, dtype, device="cpu", layout="scattered",
               spare_cols=1, strided_cache=False, seed=0) -> Paged:
    """Random cache + block tables.

    layout "scattered": every sequence owns distinct blocks, drawn from a random
    permutation (non-contiguous, out of order). "repeated": ids drawn with replacement,
    so blocks repeat within a row and across rows (as with a shared prefix).
    Unused table entries are -1, which no kernel may read.
    """
    g = torch.Generator().manual_seed(seed)
    need = [cdiv(n, block_size) for n in seq_lens]
    width = max(need) + spare_cols
    if layout == "scattered":
        num_blocks = sum(need) + 5
        ids = torch.randperm(num_blocks, generator=g)[: sum(need)].tolist()
    elif layout == "repeated":
        num_blocks = max(2, max(need) // 2 + 1)
        ids = torch.randint(0, num_blocks, (sum(need),), generator=g).tolist()
    else:
        raise AssertionError(layout)
    table = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    i = 0
    for s, n in enumerate(need):
        table[s, :n] = torch.tensor(ids[i : i + n], dtype=torch.int32)
        i += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim + (24 if strided_cache else 0))
    kc = torch.randn(shape, generator=g).to(dtype)[..., :head_dim]
    vc = torch.randn(shape, generator=g).to(dtype)[..., :head_dim]
    dev = torch.device(device)
    return Paged(kc.to(dev), vc.to(dev), table.to(dev), torch.tensor(seq_lens, dtype=torch.int32, device=dev))


def tokens_of(cache: torch.Tensor, table_row: torch.Tensor, positions) -> torch.Tensor:
    """Gather logical positions of one sequence: [n, num_kv_heads, head_dim] float64."""
    bs = cache.shape[1]
    rows = [cache[int(table_row[p // bs]), p % bs] for p in positions]
    return torch.stack(rows).double().cpu()


def attend64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, visible=None) -> torch.Tensor:
    """q: [m, H, d]; k, v: [n, KVH, d]; visible: [m, n] bool -> [m, H, d] float64."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.double().cpu(), k) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hmn,nhd->mhd", torch.softmax(scores, dim=-1), v)


def ref_decode(query, paged: Paged, *, scale=None, sliding_window=None) -> torch.Tensor:
    scale = scale or 1 / math.sqrt(query.shape[-1])
    out = torch.empty(query.shape, dtype=torch.float64)
    for s in range(query.shape[0]):
        n = int(paged.seq_lens[s])
        first = max(0, n - sliding_window) if sliding_window else 0
        k = tokens_of(paged.key_cache, paged.block_tables[s], range(first, n))
        v = tokens_of(paged.value_cache, paged.block_tables[s], range(first, n))
        out[s] = attend64(query[s : s + 1], k, v, scale)[0]
    return out


def ref_prefill(query, paged: Paged, context_lens, query_start_loc, *, scale=None, sliding_window=None):
    """paged.seq_lens must be context_len + q_len per sequence."""
    scale = scale or 1 / math.sqrt(query.shape[-1])
    out = torch.empty(query.shape, dtype=torch.float64)
    for s in range(len(context_lens)):
        q0, q1, ctx = int(query_start_loc[s]), int(query_start_loc[s + 1]), int(context_lens[s])
        if q1 == q0:
            continue
        total = ctx + q1 - q0
        k = tokens_of(paged.key_cache, paged.block_tables[s], range(total))
        v = tokens_of(paged.value_cache, paged.block_tables[s], range(total))
        q_pos = torch.arange(ctx, total)[:, None]
        k_pos = torch.arange(total)[None, :]
        visible = k_pos <= q_pos
        if sliding_window:
            visible &= k_pos > q_pos - sliding_window
        out[q0:q1] = attend64(query[q0:q1], k, v, scale, visible)
    return out


def assert_close(actual: torch.Tensor, expected64: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(actual).any(), "output has NaN: an element was never written"
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected64, rtol=rtol, atol=atol)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))
