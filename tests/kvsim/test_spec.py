"""Model presets against their published config.json numbers, and config.json import."""

from __future__ import annotations

import json

import pytest

from kvsim.errors import ConfigError
from kvsim.spec import FULL, MLA, PRESETS, SLIDING, get_preset, load_hf_config, spec_from_hf_config

# (preset id, layers, kv heads, head_dim) as published in each model's config.json:
# num_hidden_layers, num_key_value_heads, head_dim (or hidden_size / num_attention_heads).
PUBLISHED = [
    ("llama-3.1-8b", 32, 8, 128),     # hidden 4096 / 32 heads
    ("llama-3.1-70b", 80, 8, 128),    # hidden 8192 / 64 heads
    ("mistral-7b-v0.1", 32, 8, 128),  # hidden 4096 / 32 heads, sliding_window 4096
    ("qwen2.5-7b", 28, 4, 128),       # hidden 3584 / 28 heads
    ("qwen3-8b", 36, 8, 128),         # head_dim 128 stated explicitly
    ("gemma-2-9b", 42, 8, 256),       # head_dim 256 stated (hidden 3584 / 16 heads = 224 would be wrong)
    ("gemma-3-27b", 62, 16, 128),     # head_dim 128 stated (hidden 5376 / 32 heads = 168 would be wrong)
    ("opt-13b", 40, 40, 128),         # hidden 5120 / 40 heads, no GQA
]


@pytest.mark.parametrize("preset,layers,kv_heads,head_dim", PUBLISHED)
@pytest.mark.parametrize("dtype,nbytes", [("fp16", 2), ("bf16", 2), ("fp32", 4), ("fp8", 1)])
def test_preset_bytes_per_token_matches_published_config(preset, layers, kv_heads, head_dim, dtype, nbytes):
    expected = 2 * kv_heads * head_dim * nbytes * layers  # K and V, every layer stores every token's entry
    assert get_preset(preset).bytes_per_token(dtype) == expected


def test_opt13b_is_800_kib_per_token():
    assert get_preset("opt-13b").bytes_per_token("fp16") == 819_200 == 800 * 1024


def test_deepseek_v3_mla_has_no_factor_two():
    # kv_lora_rank 512 + qk_rope_head_dim 64, one latent per token, 61 layers, replicated under TP.
    spec = get_preset("deepseek-v3")
    assert spec.layer_kinds == (MLA,) * 61
    assert spec.bytes_per_token("fp16") == (512 + 64) * 2 * 61 == 70_272
    assert spec.bytes_per_token("fp16", tp=8) == 70_272


def test_layer_patterns_of_sliding_models():
    g2 = get_preset("gemma-2-9b")
    assert g2.layer_kinds[:4] == (SLIDING, FULL, SLIDING, FULL) and g2.sliding_window == 4096
    g3 = get_preset("gemma-3-27b")
    assert g3.layer_kinds[:6] == (SLIDING,) * 5 + (FULL,) and g3.sliding_window == 1024
    assert g3.layer_counts() == {SLIDING: 52, FULL: 10}
    assert set(get_preset("mistral-7b-v0.1").layer_kinds) == {SLIDING}


@pytest.mark.parametrize("tp,per_rank", [(1, 8), (2, 4), (8, 1), (16, 1)])
def test_tensor_parallel_kv_heads_per_rank(tp, per_rank):
    spec = get_preset("llama-3.1-70b")
    assert spec.kv_heads_per_rank(tp) == per_rank
    assert spec.bytes_per_token("fp16", tp) == 2 * per_rank * 128 * 2 * 80


def test_every_preset_names_its_source():
    for spec in PRESETS.values():
        assert spec.source.startswith("https://huggingface.co/") and spec.num_params > 0


def test_import_qwen3_style_config_reads_head_dim_explicitly():
    cfg = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
           "head_dim": 128, "max_position_embeddings": 40960}
    assert spec_from_hf_config(cfg).bytes_per_token("bf16") == 2 * 8 * 128 * 2 * 36


def test_import_gemma2_alternating_and_layer_types():
    base = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
            "hidden_size": 512, "sliding_window": 128}
    spec = spec_from_hf_config({**base, "model_type": "gemma2"})
    assert spec.layer_kinds == (SLIDING, FULL, SLIDING, FULL)
    types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    spec = spec_from_hf_config({**base, "layer_types": types})
    assert spec.layer_kinds == (SLIDING, SLIDING, FULL, SLIDING)


def test_import_mla_config():
    cfg = {"num_hidden_layers": 3, "num_attention_heads": 16, "hidden_size": 2048, "kv_lora_rank": 512,
           "qk_rope_head_dim": 64, "num_key_value_heads": 16}
    assert spec_from_hf_config(cfg).bytes_per_token("fp8") == 576 * 3


def test_import_multimodal_text_config():
    cfg = {"model_type": "gemma3", "text_config": {"num_hidden_layers": 2, "num_attention_heads": 4,
                                                    "num_key_value_heads": 2, "head_dim": 32, "hidden_size": 64}}
    assert spec_from_hf_config(cfg).bytes_per_token("fp16") == 2 * 2 * 32 * 2 * 2


def test_qwen_window_disabled_is_full_attention():
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
           "sliding_window": 4096, "use_sliding_window": False}
    assert spec_from_hf_config(cfg).layer_kinds == (FULL, FULL)


@pytest.mark.parametrize("text,fragment", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"num_attention_heads": 4}', "num_hidden_layers"),
    ('{"num_hidden_layers": "32", "num_attention_heads": 4}', "must be an integer"),
    ('{"num_hidden_layers": -1, "num_attention_heads": 4}', "positive"),
    ('{"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 100}', "head_dim"),
    ('{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8, "layer_types": ["full_attention"]}',
     "layer_types"),
])
def test_bad_configs_raise_one_line_errors(text, fragment):
    with pytest.raises(ConfigError) as info:
        load_hf_config(text)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_unknown_preset_lists_choices():
    with pytest.raises(ConfigError, match="llama-3.1-8b"):
        get_preset("gpt-5")
    assert get_preset("LLAMA_3.1_8B") is PRESETS["llama-3.1-8b"]


def test_config_roundtrip_of_presets_through_json():
    for spec in PRESETS.values():
        json.dumps(spec.to_dict())
