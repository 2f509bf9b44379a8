"""Prefill over a paged context: new tokens attend causally to cached context + themselves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from paged_cases import assert_close, cdiv, make_paged, nan_like, ref_decode, ref_prefill

import kernels


def _prefill_inputs(context_lens, q_lens, *, heads, kv_heads, head_dim, block_size, dtype, device, layout="scattered",
                    seed=0):
    """Cache holding context + new tokens (as if write_kv already ran), packed queries, offsets."""
    totals = [c + n for c, n in zip(context_lens, q_lens)]
    paged = make_paged(totals, num_kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, dtype=dtype,
                       device=device, layout=layout, seed=seed)
    loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    loc[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    q = torch.randn(int(loc[-1]), heads, head_dim).to(dtype).to(device)
    ctx = torch.tensor(context_lens, dtype=torch.int32, device=device)
    return q, paged, ctx, loc.to(device)


def _run(backend, q, paged, ctx, loc, **kw):
    out = nan_like(q)
    result = kernels.paged_prefill(q, paged.key_cache, paged.value_cache, paged.block_tables, ctx, loc,
                                   backend=backend, out=out, **kw)
    assert result is out
    return out


# (context_lens, q_lens, heads, kv_heads, head_dim, block_size): plain prefill (context 0),
# prefix-cache hits (context = whole blocks), chunked prefill (context mid-block), a
# sequence with no new tokens, single-token "decode" rows; GQA 1/4/8 and MQA.
CASES = {
    "mha-plain-b16": ([0, 0], [1, 19], 2, 2, 64, 16),
    "gqa4-prefix-hit-b8": ([16, 0, 8], [5, 9, 1], 8, 2, 80, 8),
    "gqa8-chunked-b32": ([37, 3], [12, 0], 8, 1, 96, 32),
    "mqa-b64-d128": ([70, 1], [3, 2], 4, 1, 128, 64),
    "gqa4-b128-d256": ([129], [6], 4, 1, 256, 128),
    "gqa3-d112": ([20, 5], [4, 30], 6, 2, 112, 16),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_prefill_matches_float64(backend, device, case, dtype):
    context_lens, q_lens, heads, kv_heads, head_dim, block_size = case
    q, paged, ctx, loc = _prefill_inputs(context_lens, q_lens, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                         block_size=block_size, dtype=dtype, device=device, seed=head_dim)
    out = _run(backend, q, paged, ctx, loc)
    assert_close(out, ref_prefill(q, paged, ctx, loc), dtype)


@pytest.mark.parametrize("window", [1, 6, 20])
def test_prefill_sliding_window(backend, device, window):
    q, paged, ctx, loc = _prefill_inputs([30, 0], [10, 25], heads=4, kv_heads=2, head_dim=64, block_size=8,
                                         dtype=torch.float32, device=device, layout="repeated", seed=window)
    out = _run(backend, q, paged, ctx, loc, sliding_window=window)
    assert_close(out, ref_prefill(q, paged, ctx, loc, sliding_window=window), torch.float32)


def test_prefill_of_one_token_is_decode(backend, device):
    """q_len = 1 with context_len = seq_len - 1 is exactly decode."""
    seq_lens = [1, 17, 40]
    paged = make_paged(seq_lens, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, device=device)
    q = torch.randn(3, 8, 64, device=device)
    ctx = paged.seq_lens - 1
    loc = torch.arange(4, dtype=torch.int32, device=device)
    pre = _run(backend, q, paged, ctx, loc)
    dec = kernels.paged_attention(q, paged.key_cache, paged.value_cache, paged.block_tables, paged.seq_lens,
                                  backend=backend)
    torch.testing.assert_close(pre, dec, rtol=1e-5, atol=1e-5)
    assert_close(pre, ref_decode(q, paged), torch.float32)


def test_write_then_prefill_equals_causal_sdpa(backend, device):
    """End to end: write a prompt's K/V with write_kv, prefill it, compare with causal SDPA."""
    n, heads, kv_heads, d, bs = 21, 4, 2, 64, 8
    k = torch.randn(n, kv_heads, d, device=device)
    v = torch.randn(n, kv_heads, d, device=device)
    q = torch.randn(n, heads, d, device=device)
    key_cache = torch.zeros(10, bs, kv_heads, d, device=device)
    value_cache = torch.zeros_like(key_cache)
    table = torch.tensor([[7, 2, 9, -1]], dtype=torch.int32, device=device)  # scattered, one spare entry
    pos = torch.arange(n, device=device)
    slots = table[0, pos // bs].long() * bs + pos % bs
    kernels.write_kv(k, v, key_cache, value_cache, slots, backend=backend)
    out = kernels.paged_prefill(q, key_cache, value_cache, table, torch.tensor([0], dtype=torch.int32, device=device),
                                torch.tensor([0, n], dtype=torch.int32, device=device), backend=backend)
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(2, 0), v.transpose(0, 1).repeat_interleave(2, 0),
        is_causal=True,
    ).transpose(0, 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)

    # Chunked: the same prompt as a 13-token context plus an 8-token chunk gives the same last rows.
    chunk = kernels.paged_prefill(q[13:], key_cache, value_cache, table,
                                  torch.tensor([13], dtype=torch.int32, device=device),
                                  torch.tensor([0, n - 13], dtype=torch.int32, device=device), backend=backend)
    torch.testing.assert_close(chunk, expected[13:], rtol=1e-5, atol=1e-5)
    assert cdiv(n, bs) == 3
