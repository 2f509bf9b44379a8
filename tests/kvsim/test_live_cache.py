"""The poisoned KV stores: what is counted from the tensor is exactly what was written."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

import kernels
from kvsim.live.cache import ContiguousKVCache, PagedKVCache

L, NB, B, KVH, D = 2, 8, 4, 2, 8
SLOT_BYTES = 2 * KVH * D * 4  # K and V of one token in one layer, fp32


def _write(cache: PagedKVCache, slots: list[int], layers=range(L)) -> None:
    n = len(slots)
    for layer in layers:
        kc, vc = cache.layer(layer)
        kernels.write_kv(torch.randn(n, KVH, D), torch.randn(n, KVH, D), kc, vc,
                         torch.tensor(slots, dtype=torch.int64), backend="torch")


def test_fresh_pool_holds_nothing():
    m = PagedKVCache(L, NB, B, KVH, D).measure()
    assert (m.written_slots, m.written_blocks, m.live_bytes, m.allocated_bytes) == (0, 0, 0, 0)


@settings(max_examples=25, deadline=None)
@given(slots=st.sets(st.integers(0, NB * B - 1), max_size=NB * B), poison=st.sets(st.integers(0, NB - 1), max_size=3))
def test_measure_counts_written_slots_and_blocks(slots, poison):
    cache = PagedKVCache(L, NB, B, KVH, D)
    _write(cache, sorted(slots))
    cache.poison(poison)
    kept = {s for s in slots if s // B not in poison}
    blocks = {s // B for s in kept}
    m = cache.measure()
    assert m.written_slots == L * len(kept)
    assert m.live_bytes == L * len(kept) * SLOT_BYTES
    assert m.allocated_bytes == L * len(blocks) * B * SLOT_BYTES
    assert m.layers_agree
    excluded = cache.measure(exclude_blocks=blocks)
    assert excluded.live_bytes == 0


def test_keys_and_values_are_poisoned_nan():
    cache = PagedKVCache(L, NB, B, KVH, D)
    assert torch.isnan(cache.key).all() and torch.isnan(cache.value).all()
    _write(cache, [0, 1, B])  # block 0's first two slots and block 1's first
    assert torch.isfinite(cache.value[:, 0, :2]).all() and torch.isnan(cache.value[:, 0, 2:]).all()
    cache.poison([0])
    assert torch.isnan(cache.key[:, 0]).all() and torch.isnan(cache.value[:, 0]).all()
    assert torch.isfinite(cache.value[:, 1, 0]).all()  # other blocks keep their tokens


def test_one_layer_written_is_reported():
    cache = PagedKVCache(L, NB, B, KVH, D)
    _write(cache, [3, 4], layers=[0])
    m = cache.measure()
    assert m.written_slots == 2 and not m.layers_agree


def test_contiguous_reservations_measured_from_tensors():
    cache = ContiguousKVCache(L, 10, KVH, D)
    cache.reserve(0)
    cache.reserve(1)
    cache.key[0][:, :5] = 1.0  # request 0 has written 5 tokens in every layer
    m = cache.measure()
    assert m.live_bytes == 5 * L * SLOT_BYTES
    assert m.allocated_bytes == 2 * 10 * L * SLOT_BYTES  # two reservations of 10 tokens, K and V
    cache.release(0)
    assert cache.measure().allocated_bytes == 10 * L * SLOT_BYTES
