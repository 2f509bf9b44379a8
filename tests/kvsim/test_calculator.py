"""Calculator: the seed example, brute-force references and properties for all inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.calculator import (
    block_size_sweep, concurrency_sweep, kv_usage, parse_lengths, per_sequence_table, sequence_lengths,
)
from kvsim.errors import KvsimError
from kvsim.spec import FULL, SLIDING, ModelSpec, custom_spec, get_preset

OPT = custom_spec(40, 40, 128)  # OPT-13B's KV shape: 819,200 bytes per fp16 token


def test_seed_example_33_tokens():
    u = kv_usage(OPT, [33], block_size=16)
    assert (u.bytes_per_token, u.blocks, u.slack_tokens) == (819_200, 3, 15)
    assert u.live_bytes == 33 * 819_200
    assert u.allocated_bytes == 3 * 16 * 819_200
    assert u.slack_bytes == 15 * 819_200


def test_seed_example_32_tokens():
    u = kv_usage(OPT, [32], block_size=16)
    assert (u.blocks, u.slack_tokens, u.slack_bytes) == (2, 0, 0)


def _brute_blocks(n: int, B: int, window: int | None) -> tuple[int, int]:
    """(blocks held, live tokens) by walking every position a layer keeps."""
    kept = range(max(0, n - window), n) if window else range(n)
    return len({pos // B for pos in kept}), len(kept)


def _brute_usage(spec: ModelSpec, lens, B, dtype="fp16", tp=1):
    live = alloc = 0
    for n in lens:
        for kind in spec.layer_kinds:
            per_token = spec.layer_bytes_per_token(kind, dtype, tp)
            held, live_tokens = _brute_blocks(n, B, spec.sliding_window if kind == SLIDING else None)
            live += live_tokens * per_token
            alloc += held * B * per_token
    return live, alloc


mixed = ModelSpec(name="mixed", num_layers=3, num_attention_heads=4, num_kv_heads=2, head_dim=8,
                  layer_kinds=(SLIDING, FULL, SLIDING), sliding_window=20)


@settings(max_examples=150, deadline=None)
@given(lens=st.lists(st.integers(0, 300), min_size=1, max_size=12), B=st.integers(1, 64),
       spec=st.sampled_from([OPT, mixed, get_preset("deepseek-v3")]))
def test_matches_brute_force_walk(lens, B, spec):
    u = kv_usage(spec, lens, block_size=B)
    live, alloc = _brute_usage(spec, lens, B)
    assert (u.live_bytes, u.allocated_bytes) == (live, alloc)
    assert u.blocks == sum(math.ceil(n / B) for n in lens)
    assert u.slack_tokens == sum(math.ceil(n / B) * B - n for n in lens)
    assert 0 <= u.slack_bytes == alloc - live


@settings(max_examples=150, deadline=None)
@given(lens=st.lists(st.integers(1, 10_000), min_size=1, max_size=20), B=st.integers(1, 512))
def test_slack_is_only_in_the_last_block(lens, B):
    u = kv_usage(OPT, lens, block_size=B)
    assert 0 <= u.slack_tokens <= (B - 1) * len(lens)
    assert u.allocated_bytes >= u.live_bytes
    table = per_sequence_table(OPT, lens, block_size=B)
    assert (table["slack_tokens"] < B).all()
    assert int(table["allocated_bytes"].sum()) == u.allocated_bytes


@settings(max_examples=100, deadline=None)
@given(prefix=st.integers(0, 200), extra=st.lists(st.integers(0, 100), min_size=1, max_size=8), B=st.integers(1, 32))
def test_shared_prefix_stores_full_blocks_once(prefix, extra, B):
    lens = [prefix + e for e in extra]
    shared = kv_usage(OPT, lens, block_size=B, shared_prefix_len=prefix)
    alone = kv_usage(OPT, lens, block_size=B)
    # Brute force: a block is identified by (owner or "shared", logical index); the prefix's full
    # blocks are the same physical block for every sequence, everything else is per sequence.
    physical = set()
    for seq, n in enumerate(lens):
        for logical in range(math.ceil(n / B)):
            is_shared = len(lens) > 1 and (logical + 1) * B <= prefix
            physical.add(("shared", logical) if is_shared else (seq, logical))
    assert shared.physical_blocks == len(physical)
    assert alone.allocated_bytes - shared.allocated_bytes == shared.sharing_saved_bytes
    assert shared.sharing_saved_bytes == (len(lens) - 1) * (prefix // B) * B * OPT.bytes_per_token()
    assert shared.slack_bytes == alone.slack_bytes  # shared blocks are full: slack unchanged


def test_reservation_baseline():
    u = kv_usage(OPT, [100, 200], block_size=16, max_len=2048)
    assert u.reserved_bytes == 2 * 2048 * 819_200
    assert u.reservation_waste_bytes == (2 * 2048 - 300) * 819_200
    mistral = get_preset("mistral-7b-v0.1")  # a sliding layer never reserves past its window
    assert kv_usage(mistral, [10], max_len=32768).reserved_bytes == 4096 * mistral.bytes_per_token()


def test_sliding_window_keeps_only_window_blocks():
    mistral = get_preset("mistral-7b-v0.1")
    u = kv_usage(mistral, [100_000], block_size=16)
    # The window's 4096 tokens [95904, 100000) start mid-block 5994 (95904 / 16 = 5994 exactly): 256 blocks.
    assert u.allocated_bytes == 256 * 16 * mistral.bytes_per_token()
    assert u.live_bytes == 4096 * mistral.bytes_per_token()
    u = kv_usage(mistral, [5000], block_size=16)  # window [904, 5000): blocks 56..312 = 257 blocks
    assert u.allocated_bytes == 257 * 16 * mistral.bytes_per_token()


def test_absurd_sizes_are_exact():
    n = 10**12
    u = kv_usage(OPT, [n] * 3, block_size=16, max_len=n)
    assert u.allocated_bytes == 3 * n * 819_200  # 10^12 is a multiple of 16
    u = kv_usage(OPT, [n + 1] * 1000, block_size=7)
    blocks = -(-(n + 1) // 7)
    assert u.allocated_bytes == 1000 * blocks * 7 * 819_200  # ~5.7e20: past int64, still exact
    assert u.slack_tokens == 1000 * (blocks * 7 - (n + 1))
    huge = kv_usage(OPT, [10**19], block_size=16)
    assert huge.live_bytes == 10**19 * 819_200


def test_sequence_lengths_and_parsing():
    assert sequence_lengths([33, 100], 2).tolist() == [33, 33, 100, 100]
    assert parse_lengths("33, 2k;1e3") == [33, 2000, 1000]
    for bad in ["", "abc", "0", "-5", "1.5", "nan"]:
        with pytest.raises(KvsimError):
            parse_lengths(bad)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"block_size": 0}, "block size"), ({"block_size": -16}, "block size"), ({"block_size": 2.5}, "block size"),
    ({"block_size": True}, "block size"), ({"max_len": 10}, "exceeds max_len"), ({"max_len": 0}, "max_len"),
    ({"shared_prefix_len": 1000}, "shared prefix"), ({"kv_dtype": "fp7"}, "dtype"), ({"tp": 0}, "tensor-parallel"),
])
def test_bad_arguments_raise(kwargs, fragment):
    with pytest.raises(KvsimError, match=fragment):
        kv_usage(OPT, [33, 50], **kwargs)


def test_bad_lengths_raise():
    for lens in ([-1], [1.5], ["x"], []):
        with pytest.raises(KvsimError):
            kv_usage(OPT, lens)


def test_concurrency_sweep_is_linear():
    df = concurrency_sweep(OPT, 33, [1, 2, 10], block_size=16, max_len=2048)
    assert df["allocated_bytes"].tolist() == [c * 3 * 16 * 819_200 for c in (1, 2, 10)]
    assert df["reserved_bytes"].tolist() == [c * 2048 * 819_200 for c in (1, 2, 10)]


def test_block_size_sweep_trades_slack_for_entries():
    lens = np.array([33, 100, 1000, 4097])
    df = block_size_sweep(OPT, lens, [1, 16, 256])
    assert df["slack_bytes"].iloc[0] == 0  # block of one token never has slack
    assert df["blocks"].tolist() == [sum(math.ceil(n / b) for n in lens) for b in (1, 16, 256)]
    assert df["block_table_bytes"].tolist() == [4 * b for b in df["blocks"]]
