"""Decode attention over a paged cache, every backend against a float64 reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paged_cases import assert_close, make_paged, nan_like, ref_decode

import kernels
from kernels._validate import AttentionShape, CacheShape

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (head_dim, block_size, num_heads, num_kv_heads, seq_lens, layout): every head dim,
# block sizes 8..128, GQA ratios 1/4/8 and MQA, lengths 1, a block, a block + 1, long.
CASES = {
    "d64-b16-mha": (64, 16, 4, 4, [1, 16, 17, 200], "scattered"),
    "d80-b8-gqa4": (80, 8, 8, 2, [1, 8, 9, 150], "repeated"),
    "d96-b32-gqa8": (96, 32, 16, 2, [32, 33, 1], "scattered"),
    "d112-b64-mqa": (112, 64, 8, 1, [64, 65, 129], "repeated"),
    "d128-b128-gqa4": (128, 128, 8, 2, [1, 128, 129, 300], "scattered"),
    "d256-b16-mqa4": (256, 16, 4, 1, [16, 17, 90], "scattered"),
}


def _run(backend, q, paged, **kw):
    out = nan_like(q)
    result = kernels.paged_attention(q, paged.key_cache, paged.value_cache, paged.block_tables, paged.seq_lens,
                                     backend=backend, out=out, **kw)
    assert result is out
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decode_matches_float64(backend, device, case, dtype):
    head_dim, block_size, heads, kv_heads, seq_lens, layout = case
    paged = make_paged(seq_lens, num_kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, dtype=dtype,
                       device=device, layout=layout, seed=head_dim)
    q = torch.randn(len(seq_lens), heads, head_dim).to(dtype).to(device)
    assert_close(_run(backend, q, paged, num_splits=1), ref_decode(q, paged), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["d64-b16-mha", "d80-b8-gqa4", "d128-b128-gqa4"])
def test_split_kv_path_matches_float64(device, case, dtype):
    """Forced partitions + the reduction kernel give the single-pass answer."""
    if "triton" not in kernels.available_backends():
        pytest.skip("triton unavailable")
    from kernels._triton_attention import plan_decode

    head_dim, block_size, heads, kv_heads, seq_lens, layout = CASES[case]
    paged = make_paged(seq_lens, num_kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, dtype=dtype,
                       device=device, layout=layout, seed=1)
    shape = AttentionShape(CacheShape(*paged.key_cache.shape), heads, *paged.block_tables.shape)
    splits, _, _ = plan_decode(shape, None, 4, num_sms=1)
    assert splits > 1, "the case must be long enough to exercise the split path"
    q = torch.randn(len(seq_lens), heads, head_dim).to(dtype).to(device)
    assert_close(_run("triton", q, paged, num_splits=4), ref_decode(q, paged), dtype)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [1, 16, 50])
def test_sliding_window(backend, device, window, num_splits):
    # Blocks wholly before the window are -1 in the table: a kernel must not read them.
    paged = make_paged([1, 40, 130], num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32,
                       device=device, seed=window)
    for s, n in enumerate([1, 40, 130]):
        paged.block_tables[s, : max(0, n - window) // 16] = -1
    q = torch.randn(3, 8, 64, device=device)
    out = _run(backend, q, paged, sliding_window=window, num_splits=num_splits)
    assert_close(out, ref_decode(q, paged, sliding_window=window), torch.float32)


def test_strided_cache_and_custom_scale(backend, device):
    """A cache that is a view of a wider buffer (non-contiguous) and an explicit scale."""
    paged = make_paged([5, 33], num_kv_heads=2, head_dim=80, block_size=16, dtype=torch.float32, device=device,
                       strided_cache=True)
    assert not paged.key_cache.is_contiguous()
    q = torch.randn(2, 4, 80, device=device)
    out = _run(backend, q, paged, scale=0.3)
    assert_close(out, ref_decode(q, paged, scale=0.3), torch.float32)


def test_paged_equals_contiguous_sdpa(backend, device):
    """The block table changes addressing, never the answer: compare with SDPA on contiguous K/V."""
    seq_lens = [37, 100]
    paged = make_paged(seq_lens, num_kv_heads=2, head_dim=64, block_size=8, dtype=torch.float32, device=device,
                       layout="scattered", seed=7)
    q = torch.randn(2, 8, 64, device=device)
    out = _run(backend, q, paged)
    for s, n in enumerate(seq_lens):
        pos = torch.arange(n, device=device)
        blocks = paged.block_tables[s, pos // 8].long()
        k = paged.key_cache[blocks, pos % 8].transpose(0, 1)  # [kv_heads, n, d], contiguous order
        v = paged.value_cache[blocks, pos % 8].transpose(0, 1)
        expected = F.scaled_dot_product_attention(
            q[s][:, None, :], k.repeat_interleave(4, 0), v.repeat_interleave(4, 0)
        )[:, 0, :]
        torch.testing.assert_close(out[s], expected, rtol=1e-5, atol=1e-5)


def test_backends_agree_on_auto(device):
    paged = make_paged([3, 20], num_kv_heads=1, head_dim=64, block_size=8, dtype=torch.float32, device=device)
    q = torch.randn(2, 2, 64, device=device)
    auto = kernels.paged_attention(q, paged.key_cache, paged.value_cache, paged.block_tables, paged.seq_lens)
    torch_out = kernels.paged_attention(q, paged.key_cache, paged.value_cache, paged.block_tables, paged.seq_lens,
                                        backend="torch")
    torch.testing.assert_close(auto, torch_out, rtol=1e-5, atol=1e-5)


def test_empty_batch(backend, device):
    paged = make_paged([4], num_kv_heads=1, head_dim=64, block_size=8, dtype=torch.float32, device=device)
    q = torch.randn(0, 1, 64, device=device)
    out = kernels.paged_attention(q, paged.key_cache, paged.value_cache, paged.block_tables[:0], paged.seq_lens[:0],
                                  backend=backend)
    assert out.shape == (0, 1, 64)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seq_lens=st.lists(st.integers(1, 70), min_size=1, max_size=3),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([64, 80]),
    block_size=st.sampled_from([8, 16, 32]),
    num_splits=st.sampled_from([None, 1, 2]),
    layout=st.sampled_from(["scattered", "repeated"]),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_property(backend, device, seq_lens, kv_heads, group, head_dim, block_size, num_splits,
                                layout, seed):
    paged = make_paged(seq_lens, num_kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                       dtype=torch.float32, device=device, layout=layout, spare_cols=seed % 3, seed=seed)
    q = torch.randn(len(seq_lens), kv_heads * group, head_dim, device=device)
    out = _run(backend, q, paged, num_splits=num_splits)
    assert_close(out, ref_decode(q, paged), torch.float32)


def test_plan_decode_rule():
    """Split only when (seqs x kv heads) cannot fill the SMs and the context is long."""
    from kernels import _backend

    if "triton" not in kernels.available_backends():
        pytest.skip("triton unavailable")
    plan = _backend.triton_module("_triton_attention").plan_decode

    def llama(batch, ctx):  # Llama-3.1-8B: 32 query heads, 8 KV heads, head_dim 128, block 16
        return AttentionShape(CacheShape(batch * ctx // 16, 16, 8, 128), 32, batch, ctx // 16)

    assert plan(llama(1, 32768), None, None, num_sms=132)[0] > 1
    assert plan(llama(8, 8192), None, None, num_sms=132)[0] > 1
    assert plan(llama(32, 8192), None, None, num_sms=132)[0] == 1  # 256 programs >= 132 SMs
    assert plan(llama(1, 512), None, None, num_sms=132)[0] == 1  # short context
    for batch, ctx in [(1, 32768), (8, 8192), (1, 2048)]:
        splits, partition, block_n = plan(llama(batch, ctx), None, None, num_sms=132)
        assert partition % block_n == 0 and splits * partition >= ctx
        assert splits == 1 or partition >= 512
    # A sliding window bounds the span, so a 32k table with a 256-token window never splits.
    assert plan(llama(1, 32768), 256, None, num_sms=132)[0] == 1
    assert math.isfinite(plan(llama(1, 32768), None, 64, num_sms=132)[1])


def test_head_dim_below_16(backend, device):
    """head_dim 8 is padded to 16 for tl.dot; the padding never reaches the output."""
    paged = make_paged([9, 16], num_kv_heads=1, head_dim=8, block_size=8, dtype=torch.float32, device=device)
    q = torch.randn(2, 2, 8, device=device)
    assert_close(_run(backend, q, paged), ref_decode(q, paged), torch.float32)
