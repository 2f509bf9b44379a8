"""Model descriptions: what a model stores in its KV cache, layer by layer.

A :class:`ModelSpec` records the handful of numbers from a model's published
``config.json`` that decide its KV-cache footprint, plus the sizes the capacity planner and
the cost model need (hidden size, MLP width, vocabulary, parameter count). Every layer has
a *kind*:

- ``full``: ordinary attention, keeps K and V for every token;
- ``sliding``: attention over the last ``sliding_window`` tokens only, so it keeps at most
  the window's blocks;
- ``mla``: multi-head latent attention (DeepSeek-V2/V3), which caches one compressed
  latent of ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by all heads.

Counting conventions (tested; see ``docs/conventions.md``):

- bytes per token per layer, full or sliding: ``2 * kv_heads * head_dim * dtype_bytes``
  (K and V); MLA: ``(kv_lora_rank + qk_rope_head_dim) * dtype_bytes`` (no factor 2);
- tensor-parallel degree ``t``: KV heads per rank ``max(1, kv_heads // t)``; MLA's latent is
  replicated on every rank.

``head_dim`` is read from the config when it states it (Qwen3, Gemma): deriving it from
``hidden_size / num_attention_heads`` is wrong for those models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kvsim.errors import ConfigError

FULL = "full"
SLIDING = "sliding"
MLA = "mla"
LAYER_KINDS = (FULL, SLIDING, MLA)

#: Bytes per stored element for each KV-cache dtype the calculator accepts.
KV_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
    "int8": "fp8",  # one byte per element, counted the same way
}


def dtype_bytes(kv_dtype: str) -> int:
    """Bytes per element of a KV dtype name (``fp16``, ``bf16``, ``fp32``, ``fp8`` or aliases)."""
    name = str(kv_dtype).strip().lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name not in KV_DTYPE_BYTES:
        raise ConfigError(
            f"unknown KV dtype {kv_dtype!r}; choose one of {', '.join(KV_DTYPE_BYTES)}"
        )
    return KV_DTYPE_BYTES[name]


def canonical_dtype(kv_dtype: str) -> str:
    """The canonical short name (``fp16`` ...) of a dtype name or alias."""
    dtype_bytes(kv_dtype)  # validates
    name = str(kv_dtype).strip().lower()
    return _DTYPE_ALIASES.get(name, name)


@dataclass(frozen=True)
class ModelSpec:
    """The KV-relevant shape of a decoder-only transformer.

    Field values for presets come from each model's published ``config.json``; the
    ``source`` field names it.
    """

    name: str  # display name, e.g. "Llama-3.1-8B"
    num_layers: int  # decoder layers holding a KV cache
    num_attention_heads: int  # query heads
    num_kv_heads: int  # K/V heads (GQA/MQA); for MLA the query head count, unused for bytes
    head_dim: int  # per-head K/V width, as stated by the config
    layer_kinds: tuple[str, ...]  # one of LAYER_KINDS per layer
    sliding_window: int | None = None  # tokens a sliding layer attends to
    kv_lora_rank: int = 0  # MLA latent width (DeepSeek: 512)
    qk_rope_head_dim: int = 0  # MLA decoupled rotary key width (DeepSeek: 64)
    hidden_size: int = 0  # residual width, for weights and FLOPs
    intermediate_size: int = 0  # MLP width (dense layers)
    vocab_size: int = 0
    num_params: int = 0  # total parameters, for the weight footprint
    num_active_params: int = 0  # parameters touched per token (MoE); 0 means num_params
    max_position_embeddings: int = 0  # longest context the model was configured for
    source: str = ""  # where the numbers come from

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if len(self.layer_kinds) != self.num_layers:
            raise ConfigError(
                f"layer_kinds has {len(self.layer_kinds)} entries for {self.num_layers} layers"
            )
        bad = sorted(set(self.layer_kinds) - set(LAYER_KINDS))
        if bad:
            raise ConfigError(f"unknown layer kind(s) {bad}; expected {LAYER_KINDS}")
        if SLIDING in self.layer_kinds and not (
            isinstance(self.sliding_window, int) and self.sliding_window > 0
        ):
            raise ConfigError("sliding layers need a positive integer sliding_window")
        if MLA in self.layer_kinds and (self.kv_lora_rank <= 0 or self.qk_rope_head_dim < 0):
            raise ConfigError("MLA layers need kv_lora_rank > 0 and qk_rope_head_dim >= 0")
        if self.num_attention_heads % self.num_kv_heads != 0 and MLA not in self.layer_kinds:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    # ----- per-layer bytes -------------------------------------------------------------

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """K/V heads each tensor-parallel rank stores: ``max(1, kv_heads // tp)``."""
        _check_tp(tp)
        return max(1, self.num_kv_heads // tp)

    def layer_bytes_per_token(self, kind: str, kv_dtype: str = "fp16", tp: int = 1) -> int:
        """Bytes one token occupies in one layer of ``kind`` on one rank."""
        nbytes = dtype_bytes(kv_dtype)
        if kind == MLA:
            _check_tp(tp)
            return (self.kv_lora_rank + self.qk_rope_head_dim) * nbytes
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * nbytes

    def layer_counts(self) -> dict[str, int]:
        """How many layers of each kind the model has (kinds absent are omitted)."""
        counts: dict[str, int] = {}
        for kind in self.layer_kinds:
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def bytes_per_token(self, kv_dtype: str = "fp16", tp: int = 1) -> int:
        """KV bytes one token occupies on one rank, summed over all layers."""
        return sum(
            count * self.layer_bytes_per_token(kind, kv_dtype, tp)
            for kind, count in self.layer_counts().items()
        )

    @property
    def is_mla(self) -> bool:
        return MLA in self.layer_kinds

    @property
    def has_sliding(self) -> bool:
        return SLIDING in self.layer_kinds

    def summary(self) -> str:
        """One line describing the attention layout, for tables and captions."""
        counts = self.layer_counts()
        if self.is_mla:
            return f"{self.num_layers} layers, MLA latent {self.kv_lora_rank}+{self.qk_rope_head_dim}"
        text = (
            f"{self.num_layers} layers, {self.num_attention_heads} q heads / "
            f"{self.num_kv_heads} KV heads x {self.head_dim}"
        )
        if SLIDING in counts:
            text += f", {counts[SLIDING]} sliding (window {self.sliding_window})"
        return text

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["layer_kinds"] = list(self.layer_kinds)
        return data


def _check_tp(tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp <= 0:
        raise ConfigError(f"tensor-parallel degree must be a positive integer, got {tp!r}")


# ----- presets ---------------------------------------------------------------------------


def _uniform(n: int, kind: str = FULL) -> tuple[str, ...]:
    return (kind,) * n


def _alternating(n: int) -> tuple[str, ...]:
    # Gemma-2: even layers are local (sliding), odd layers global.
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n))


def _pattern(n: int, period: int) -> tuple[str, ...]:
    # Gemma-3: every `period`-th layer is global, the others local.
    return tuple(FULL if (i + 1) % period == 0 else SLIDING for i in range(n))


_HF = "https://huggingface.co/{}/blob/main/config.json"

PRESETS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec(
        name="Llama-3.1-8B", num_layers=32, num_attention_heads=32, num_kv_heads=8,
        head_dim=128, layer_kinds=_uniform(32), hidden_size=4096, intermediate_size=14336,
        vocab_size=128256, num_params=8_030_261_248, max_position_embeddings=131072,
        source=_HF.format("meta-llama/Llama-3.1-8B"),
    ),
    "llama-3.1-70b": ModelSpec(
        name="Llama-3.1-70B", num_layers=80, num_attention_heads=64, num_kv_heads=8,
        head_dim=128, layer_kinds=_uniform(80), hidden_size=8192, intermediate_size=28672,
        vocab_size=128256, num_params=70_553_706_496, max_position_embeddings=131072,
        source=_HF.format("meta-llama/Llama-3.1-70B"),
    ),
    "mistral-7b-v0.1": ModelSpec(
        name="Mistral-7B-v0.1", num_layers=32, num_attention_heads=32, num_kv_heads=8,
        head_dim=128, layer_kinds=_uniform(32, SLIDING), sliding_window=4096,
        hidden_size=4096, intermediate_size=14336, vocab_size=32000,
        num_params=7_241_732_096, max_position_embeddings=32768,
        source=_HF.format("mistralai/Mistral-7B-v0.1"),
    ),
    "qwen2.5-7b": ModelSpec(
        name="Qwen2.5-7B", num_layers=28, num_attention_heads=28, num_kv_heads=4,
        head_dim=128, layer_kinds=_uniform(28), hidden_size=3584, intermediate_size=18944,
        vocab_size=152064, num_params=7_615_616_512, max_position_embeddings=131072,
        source=_HF.format("Qwen/Qwen2.5-7B"),
    ),
    "qwen3-8b": ModelSpec(
        name="Qwen3-8B", num_layers=36, num_attention_heads=32, num_kv_heads=8,
        head_dim=128, layer_kinds=_uniform(36), hidden_size=4096, intermediate_size=12288,
        vocab_size=151936, num_params=8_190_735_360, max_position_embeddings=40960,
        source=_HF.format("Qwen/Qwen3-8B"),
    ),
    "gemma-2-9b": ModelSpec(
        name="Gemma-2-9B", num_layers=42, num_attention_heads=16, num_kv_heads=8,
        head_dim=256, layer_kinds=_alternating(42), sliding_window=4096, hidden_size=3584,
        intermediate_size=14336, vocab_size=256000, num_params=9_241_705_984,
        max_position_embeddings=8192, source=_HF.format("google/gemma-2-9b"),
    ),
    "gemma-3-27b": ModelSpec(
        name="Gemma-3-27B", num_layers=62, num_attention_heads=32, num_kv_heads=16,
        head_dim=128, layer_kinds=_pattern(62, 6), sliding_window=1024, hidden_size=5376,
        intermediate_size=21504, vocab_size=262208, num_params=27_432_406_640,
        max_position_embeddings=131072, source=_HF.format("google/gemma-3-27b-it"),
    ),
    "deepseek-v3": ModelSpec(
        name="DeepSeek-V3", num_layers=61, num_attention_heads=128, num_kv_heads=128,
        head_dim=128, layer_kinds=_uniform(61, MLA), kv_lora_rank=512, qk_rope_head_dim=64,
        hidden_size=7168, intermediate_size=18432, vocab_size=129280,
        num_params=671_026_419_200, num_active_params=37_000_000_000,
        max_position_embeddings=163840, source=_HF.format("deepseek-ai/DeepSeek-V3"),
    ),
    "opt-13b": ModelSpec(
        name="OPT-13B", num_layers=40, num_attention_heads=40, num_kv_heads=40,
        head_dim=128, layer_kinds=_uniform(40), hidden_size=5120, intermediate_size=20480,
        vocab_size=50272, num_params=12_853_473_280, max_position_embeddings=2048,
        source=_HF.format("facebook/opt-13b"),
    ),
}


def preset_names() -> list[str]:
    return list(PRESETS)


def get_preset(name: str) -> ModelSpec:
    """Look a preset up by id (case-insensitive, ``_`` accepted for ``-``)."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in PRESETS:
        raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[key]


def custom_spec(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    num_attention_heads: int | None = None,
    sliding_window: int | None = None,
    name: str = "custom",
) -> ModelSpec:
    """A full-attention (or all-sliding, if a window is given) model set by hand."""
    for label, value in (("layers", num_layers), ("kv-heads", num_kv_heads), ("head-dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{label} must be a positive integer, got {value!r}")
    kind = SLIDING if sliding_window else FULL
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        num_attention_heads=num_attention_heads or num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        layer_kinds=_uniform(num_layers, kind),
        sliding_window=sliding_window,
        hidden_size=(num_attention_heads or num_kv_heads) * head_dim,
    )


# ----- Hugging Face config.json ------------------------------------------------------------


def _get_int(cfg: Mapping[str, Any], key: str, *, required: bool = True, default: int = 0) -> int:
    if key not in cfg or cfg[key] is None:
        if required:
            raise ConfigError(f"config.json lacks {key!r}")
        return default
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"config.json field {key!r} must be an integer, got {value!r}")
    if value < 0 or (required and value == 0):
        raise ConfigError(f"config.json field {key!r} must be positive, got {value!r}")
    return value


def spec_from_hf_config(cfg: Any, name: str = "config.json") -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed Hugging Face ``config.json``.

    Reads ``head_dim``, ``num_key_value_heads``, ``kv_lora_rank``, ``qk_rope_head_dim``,
    ``sliding_window`` and ``layer_types`` explicitly; multimodal configs are read from
    their ``text_config``.
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError("config.json must hold a JSON object")
    if isinstance(cfg.get("text_config"), Mapping):
        outer = cfg
        cfg = {**cfg["text_config"]}
        for key in ("architectures", "model_type"):
            cfg.setdefault(key, outer.get(key))
    num_layers = _get_int(cfg, "num_hidden_layers")
    num_heads = _get_int(cfg, "num_attention_heads")
    hidden = _get_int(cfg, "hidden_size", required=False)
    kv_lora_rank = _get_int(cfg, "kv_lora_rank", required=False)
    rope_dim = _get_int(cfg, "qk_rope_head_dim", required=False)
    num_kv = _get_int(cfg, "num_key_value_heads", required=False, default=num_heads) or num_heads
    if "head_dim" in cfg and cfg["head_dim"] is not None:
        head_dim = _get_int(cfg, "head_dim")
    elif hidden and hidden % num_heads == 0:
        head_dim = hidden // num_heads
    else:
        raise ConfigError("config.json states no head_dim and hidden_size/num_attention_heads is not whole")

    window_raw = cfg.get("sliding_window")
    use_sliding = cfg.get("use_sliding_window", True)
    window = None
    if window_raw is not None and use_sliding is not False:
        window = _get_int(cfg, "sliding_window")

    layer_types = cfg.get("layer_types")
    if kv_lora_rank:
        kinds = _uniform(num_layers, MLA)
    elif layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ConfigError(f"config.json 'layer_types' must list {num_layers} entries")
        kinds_list = []
        for entry in layer_types:
            if entry == "full_attention":
                kinds_list.append(FULL)
            elif entry in ("sliding_attention", "sliding_window_attention", "chunked_attention"):
                kinds_list.append(SLIDING)
            else:
                raise ConfigError(f"config.json 'layer_types' has an unknown entry {entry!r}")
        kinds = tuple(kinds_list)
        if SLIDING in kinds and window is None:
            raise ConfigError("config.json has sliding layers but no 'sliding_window'")
    elif window is not None:
        pattern = cfg.get("sliding_window_pattern")
        model_type = str(cfg.get("model_type") or "")
        if isinstance(pattern, int) and pattern > 1:
            kinds = _pattern(num_layers, pattern)
        elif model_type.startswith("gemma2"):
            kinds = _alternating(num_layers)
        elif window >= _get_int(cfg, "max_position_embeddings", required=False, default=0) > 0:
            kinds = _uniform(num_layers)  # the window never binds
            window = None
        else:
            kinds = _uniform(num_layers, SLIDING)
    else:
        kinds = _uniform(num_layers)
    if SLIDING not in kinds:
        window = None

    return ModelSpec(
        name=str(cfg.get("_name_or_path") or name),
        num_layers=num_layers,
        num_attention_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=head_dim,
        layer_kinds=kinds,
        sliding_window=window,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim,
        hidden_size=hidden,
        intermediate_size=_get_int(cfg, "intermediate_size", required=False),
        vocab_size=_get_int(cfg, "vocab_size", required=False),
        max_position_embeddings=_get_int(cfg, "max_position_embeddings", required=False),
        source=name,
    )


def load_hf_config(text: str | bytes, name: str = "config.json") -> ModelSpec:
    """Parse the text of a ``config.json`` (an upload or a file's contents)."""
    try:
        cfg = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name} is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    return spec_from_hf_config(cfg, name=name)


def load_hf_config_file(path: str | Path) -> ModelSpec:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    return load_hf_config(data, name=path.name)


__all__ = [
    "FULL", "SLIDING", "MLA", "LAYER_KINDS", "KV_DTYPE_BYTES", "ModelSpec", "PRESETS",
    "dtype_bytes", "canonical_dtype", "get_preset", "preset_names", "custom_spec",
    "spec_from_hf_config", "load_hf_config", "load_hf_config_file",
]
