"""write_kv and copy_blocks: in-place cache updates, every backend against plain indexing."""

from __future__ import annotations

import pytest
import torch

import kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim,kv_heads,block_size", [(64, 1, 8), (80, 3, 16), (128, 2, 128)])
def test_write_kv_scatters_and_skips(backend, device, dtype, head_dim, kv_heads, block_size):
    num_blocks, n = 6, 11
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype).to(device)
    value_cache = torch.randn_like(key_cache)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    key = torch.randn(n, kv_heads, head_dim).to(dtype).to(device)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * block_size)[:n]
    slots[[2, 7]] = -1  # padding tokens: skipped
    slots = slots.to(device)
    kernels.write_kv(key, value, key_cache, value_cache, slots, backend=backend)

    expected_k, expected_v = before_k.clone(), before_v.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = key[t]
            expected_v[slot // block_size, slot % block_size] = value[t]
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_write_kv_int32_slots_and_strided_cache(backend, device):
    """vLLM-style slot_mapping may be int32 or int64; caches may be views of one buffer."""
    kv = torch.zeros(2, 4, 8, 2, 64, device=device)  # [K/V, num_blocks, block_size, kv_heads, d]
    key_cache, value_cache = kv[0], kv[1]
    key = torch.randn(3, 2, 64, device=device)
    value = torch.randn(3, 2, 64, device=device)
    slots = torch.tensor([31, 0, 9], dtype=torch.int32, device=device)
    kernels.write_kv(key, value, key_cache, value_cache, slots, backend=backend)
    assert torch.equal(key_cache[3, 7], key[0]) and torch.equal(value_cache[1, 1], value[2])
    assert int((kv != 0).any(-1).sum()) == 12  # 3 tokens x 2 heads x K/V, nothing else


def test_copy_blocks(backend, device):
    key_cache = torch.randn(8, 16, 2, 80, device=device)
    value_cache = torch.randn_like(key_cache)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    mapping = torch.tensor([[1, 5], [1, 6], [3, 0]], device=device)  # one source may fan out (copy-on-write)
    kernels.copy_blocks(key_cache, value_cache, mapping, backend=backend)
    for src, dst in mapping.tolist():
        assert torch.equal(key_cache[dst], before_k[src]) and torch.equal(value_cache[dst], before_v[src])
    untouched = [1, 2, 3, 4, 7]
    assert torch.equal(key_cache[untouched], before_k[untouched])
    assert torch.equal(value_cache[untouched], before_v[untouched])


def test_copy_blocks_accepts_pairs_and_empty(backend, device):
    key_cache = torch.randn(4, 8, 1, 64, device=device).to(torch.bfloat16)
    value_cache = torch.randn_like(key_cache)
    src = key_cache[2].clone()
    kernels.copy_blocks(key_cache, value_cache, [(2, 3)], backend=backend)
    assert torch.equal(key_cache[3], src)
    kernels.copy_blocks(key_cache, value_cache, [], backend=backend)


@pytest.mark.parametrize(
    "slots,match",
    [([0, 0], "same slot twice"), ([0, 64], "outside the cache"), ([-2, 1], "outside the cache")],
)
def test_write_kv_rejects_bad_slots(backend, device, slots, match):
    key_cache = torch.zeros(4, 16, 1, 64, device=device)
    key = torch.ones(2, 1, 64, device=device)
    with pytest.raises(ValueError, match=match):
        kernels.write_kv(key, key, key_cache, key_cache.clone(), torch.tensor(slots, device=device), backend=backend)
    assert not key_cache.any(), "nothing may be written when the call is rejected"


@pytest.mark.parametrize(
    "mapping,match",
    [([[0, 9]], "not a block"), ([[0, 2], [1, 2]], "same destination"), ([[0, 1], [1, 2]], "both a source")],
)
def test_copy_blocks_rejects_bad_mapping(backend, device, mapping, match):
    key_cache = torch.randn(4, 8, 1, 64, device=device)
    with pytest.raises(ValueError, match=match):
        kernels.copy_blocks(key_cache, key_cache.clone(), torch.tensor(mapping, device=device), backend=backend)
