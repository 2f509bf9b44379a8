"""The live decoder: sizing, the calculator's view of it, and the dense attention reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvsim.errors import KvsimError
from kvsim.live.model import LiveModel, LiveModelConfig, apply_rope, dense_attention, rope_cos_sin, scaled_config
from kvsim.spec import PRESETS, get_preset

TINY = LiveModelConfig(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                       intermediate_size=128, vocab_size=256, seed=1)


def test_scaled_llama_by_hand():
    # Llama-3.1-8B: 32 layers, 32 q / 8 KV heads x 128, hidden 4096, MLP 14336. Divided by 8:
    c = scaled_config(get_preset("llama-3.1-8b"), "tiny")
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (4, 4, 1, 16)
    assert c.hidden_size == 64 and c.intermediate_size == 224  # 14336 / 4096 = 3.5; 3.5 x 64
    c = scaled_config(get_preset("llama-3.1-8b"), "small")
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size) == (8, 8, 2, 32, 256)


@pytest.mark.parametrize("preset", [k for k, s in PRESETS.items() if not s.is_mla])
def test_scaling_keeps_the_gqa_group(preset):
    spec = get_preset(preset)
    c = scaled_config(spec, 4)
    assert c.group_size == spec.num_attention_heads // spec.num_kv_heads
    assert c.num_layers == max(1, spec.num_layers // 4)


def test_bad_sizes_are_caller_errors():
    with pytest.raises(KvsimError):
        LiveModelConfig(num_layers=2, num_heads=3, num_kv_heads=2, head_dim=16, hidden_size=64, intermediate_size=64)
    with pytest.raises(KvsimError):
        LiveModelConfig(num_layers=0, num_heads=2, num_kv_heads=2, head_dim=16, hidden_size=64, intermediate_size=64)
    with pytest.raises(KvsimError):
        scaled_config(get_preset("llama-3.1-8b"), "huge")


def test_spec_bytes_per_token_by_hand():
    # K and V, 2 layers, 2 KV heads x 16, fp32: 2 * 2 * 2 * 16 * 4 = 512 bytes
    assert TINY.to_spec().bytes_per_token("fp32") == 512
    assert TINY.to_spec().bytes_per_token("fp16") == 256


def _brute_attention(q, k, v, first):
    """Per query, per head: explicit float64 softmax over the causal window."""
    tq, h, d = q.shape
    group = h // k.shape[1]
    out = torch.zeros(tq, h, d, dtype=torch.float64)
    for i in range(tq):
        for head in range(h):
            kv = head // group
            n = first + i + 1
            s = [float(q[i, head].double() @ k[j, kv].double()) / math.sqrt(d) for j in range(n)]
            m = max(s)
            w = [math.exp(x - m) for x in s]
            z = sum(w)
            out[i, head] = sum(w[j] / z * v[j, kv].double() for j in range(n))
    return out


@settings(max_examples=15, deadline=None)
@given(tq=st.integers(1, 5), first=st.integers(0, 6), seed=st.integers(0, 1000))
def test_dense_attention_matches_brute_force(tq, first, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tq, 4, 8, generator=g)
    k = torch.randn(first + tq + 2, 2, 8, generator=g)  # extra keys past the end must be ignored
    v = torch.randn(first + tq + 2, 2, 8, generator=g)
    got = dense_attention(q, k, v, first)
    torch.testing.assert_close(got.double(), _brute_attention(q, k, v, first), atol=1e-5, rtol=0)


def test_rope_is_a_rotation():
    x = torch.randn(5, 2, 16)
    cos, sin = rope_cos_sin(torch.arange(5), 16, 10000.0, torch.float32)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[0], x[0])  # position 0: no rotation


def test_weights_are_seeded():
    a, b = LiveModel(TINY), LiveModel(TINY)
    assert torch.equal(a.lm_head, b.lm_head) and torch.equal(a.layers[1]["wq"], b.layers[1]["wq"])
    c = LiveModel(LiveModelConfig(**{**TINY.__dict__, "seed": 2}))
    assert not torch.equal(a.lm_head, c.lm_head)


def test_dense_outputs_are_causal():
    """A token's attention output depends only on tokens up to it."""
    model = LiveModel(TINY)
    a = model.dense_layer_outputs([1, 2, 3, 4, 5])
    b = model.dense_layer_outputs([1, 2, 3, 9, 9, 9])
    for la, lb in zip(a, b):
        torch.testing.assert_close(la[:3], lb[:3])
        assert not torch.allclose(la[3], lb[3])
