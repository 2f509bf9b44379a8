"""Unwritten cache slots may hold NaN (the live engine poisons them): no backend may read them.

Both K and V of every slot a query must not see are NaN here; an output that touched one
(even with a zero softmax weight: 0 * NaN = NaN) would be NaN.
"""

from __future__ import annotations

import math

import torch

import kernels

def _poisoned_case(device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    num_blocks, block_size, kvh, hd, heads = 8, 16, 2, 32, 4
    k_cache = torch.full((num_blocks, block_size, kvh, hd), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    seq_lens = torch.tensor([1, 17, 33], dtype=torch.int32)
    tables = torch.tensor([[5, -1, -1], [2, 7, -1], [0, 3, 6]], dtype=torch.int32)
    for s, n in enumerate(seq_lens.tolist()):
        for pos in range(n):
            b, off = tables[s, pos // block_size].item(), pos % block_size
            k_cache[b, off] = torch.randn(kvh, hd, generator=g)
            v_cache[b, off] = torch.randn(kvh, hd, generator=g)
    q = torch.randn(len(seq_lens), heads, hd, generator=g)
    return q.to(device), k_cache.to(device), v_cache.to(device), tables.to(device), seq_lens.to(device)


def _reference(q, k_cache, v_cache, tables, seq_lens):
    q, k_cache, v_cache, tables, seq_lens = (t.cpu() for t in (q, k_cache, v_cache, tables, seq_lens))
    out = torch.empty(q.shape, dtype=torch.float64)
    group = q.shape[1] // k_cache.shape[2]
    bs = k_cache.shape[1]
    for s, n in enumerate(seq_lens.tolist()):
        idx = [(tables[s, p // bs].item(), p % bs) for p in range(n)]
        k = torch.stack([k_cache[b, o] for b, o in idx]).double()  # [n, kvh, hd]
        v = torch.stack([v_cache[b, o] for b, o in idx]).double()
        for h in range(q.shape[1]):
            w = torch.softmax(k[:, h // group] @ q[s, h].double() / math.sqrt(q.shape[2]), dim=0)
            out[s, h] = w @ v[:, h // group]
    return out


def test_decode_never_reads_poisoned_slots(backend, device):
    q, kc, vc, tables, lens = _poisoned_case(device)
    out = kernels.paged_attention(q, kc, vc, tables, lens, backend=backend)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double().cpu(), _reference(q, kc, vc, tables, lens), rtol=1e-5, atol=1e-5)


def test_prefill_never_reads_poisoned_slots(backend, device):
    q, kc, vc, tables, lens = _poisoned_case(device, 1)
    # One new token per sequence at the last position: prefill of length 1 equals decode.
    context_lens = lens - 1
    starts = torch.arange(len(lens) + 1, dtype=torch.int32, device=device)
    out = kernels.paged_prefill(q, kc, vc, tables, context_lens, starts, backend=backend)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double().cpu(), _reference(q, kc, vc, tables, lens), rtol=1e-5, atol=1e-5)
