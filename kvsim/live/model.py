"""A small Llama-style decoder with seeded random weights, for measuring a real KV cache.

RMSNorm, rotary positions (rotate-half), grouped-query attention and a SwiGLU MLP, as in
Llama 2/3, Mistral and Qwen; nothing is downloaded: weights are drawn from a seeded
generator, so a run is reproducible from ``(config, seed)``. The model never touches a
cache itself: :meth:`LiveModel.forward` hands each layer's new ``q, k, v`` to an
``attend`` callback, so the paged engine (kernels over a block pool), the contiguous
baseline and the correctness check run the *same* weights and differ only in where K/V
live and how attention reads them.

Greedy decoding compares tokens across engines exactly, so the logits are made
well-conditioned: the output head is drawn with a larger scale (``LOGIT_SCALE``), which
spreads the logits by several units and makes a near-tie between the top two tokens (one
that fp32 rounding in attention could flip) very unlikely.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from kvsim.errors import ConfigError
from kvsim.spec import FULL, MLA, ModelSpec

#: Standard deviation of the logits, roughly: the output head's weights are N(0, (LOGIT_SCALE^2) / hidden).
LOGIT_SCALE = 4.0

#: Preset scale-down names -> divisor applied to layers, heads and head_dim.
LIVE_SIZES: dict[str, int] = {"tiny": 8, "small": 4, "base": 2}

#: attend(layer, q, k, v) -> attention output. q: [T, num_heads, head_dim];
#: k, v: [T, num_kv_heads, head_dim] (rotary already applied to q and k). Returns [T, num_heads, head_dim].
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LiveModelConfig:
    """Sizes of the live decoder. ``hidden_size`` need not equal heads x head_dim (as in Gemma)."""

    num_layers: int  # decoder layers, each with a KV cache
    num_heads: int  # query heads
    num_kv_heads: int  # K/V heads (GQA: num_heads a multiple of it)
    head_dim: int  # per-head width of q, k, v
    hidden_size: int  # residual stream width
    intermediate_size: int  # SwiGLU inner width
    vocab_size: int = 512  # token ids are 0 .. vocab_size-1
    rope_theta: float = 10000.0  # rotary base
    norm_eps: float = 1e-5  # RMSNorm epsilon
    seed: int = 0  # weights are drawn from torch.Generator().manual_seed(seed)
    name: str = "live"  # label for records and captions
    source: str = "set by hand"  # how the sizes were chosen

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size",
                      "intermediate_size", "vocab_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{field} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary positions, got {self.head_dim}")
        if self.vocab_size < 2:
            raise ConfigError("vocab_size must be at least 2")

    @property
    def group_size(self) -> int:
        """Query heads per K/V head."""
        return self.num_heads // self.num_kv_heads

    @property
    def num_params(self) -> int:
        """Parameters: embedding, per layer (norms, q/k/v/o, gate/up/down), final norm, head."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d + 2 * h * self.num_kv_heads * d + self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return 2 * self.vocab_size * h + self.num_layers * (attn + mlp + 2 * h) + h

    def to_spec(self) -> ModelSpec:
        """The calculator's view of this model: full attention in every layer."""
        return ModelSpec(
            name=self.name, num_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, layer_kinds=(FULL,) * self.num_layers,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
            num_params=self.num_params, source=self.source,
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["num_params"] = self.num_params
        return data


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


def scaled_config(spec: ModelSpec, size: str | int = "tiny", *, vocab_size: int = 512, seed: int = 0) -> LiveModelConfig:
    """A preset scaled down: layers, KV heads and head_dim divided by the same divisor.

    Kept: the GQA group (query heads per KV head), hidden / (heads x head_dim) and
    intermediate / hidden. ``size`` is a name in :data:`LIVE_SIZES` or a divisor. Every layer
    runs full attention: a preset's sliding-window or MLA layers are not reproduced (the
    live model is Llama-style), which the config's ``source`` says.
    """
    if isinstance(size, str):
        key = size.strip().lower()
        if key not in LIVE_SIZES:
            raise ConfigError(f"unknown live model size {size!r}; choose one of {', '.join(LIVE_SIZES)} or a divisor")
        divisor = LIVE_SIZES[key]
    else:
        divisor = size
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor <= 0:
        raise ConfigError(f"scale divisor must be a positive integer, got {divisor!r}")
    group = max(1, spec.num_attention_heads // spec.num_kv_heads)
    kv_heads = max(1, spec.num_kv_heads // divisor)
    heads = kv_heads * group
    head_dim = max(8, _round_to(spec.head_dim / divisor, 2))
    layers = max(1, spec.num_layers // divisor)
    width = heads * head_dim
    ratio = spec.hidden_size / (spec.num_attention_heads * spec.head_dim) if spec.hidden_size else 1.0
    hidden = _round_to(width * ratio, 8)
    inter_ratio = spec.intermediate_size / spec.hidden_size if spec.hidden_size and spec.intermediate_size else 8 / 3
    intermediate = _round_to(hidden * inter_ratio, 8)
    note = f"scaled from {spec.name} by 1/{divisor} (layers, KV heads, head_dim)"
    if spec.has_sliding or MLA in spec.layer_kinds:
        note += "; every layer runs full attention (the preset's sliding/MLA layers are not reproduced)"
    return LiveModelConfig(
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, hidden_size=hidden,
        intermediate_size=intermediate, vocab_size=vocab_size, seed=seed,
        name=f"{spec.name} / {divisor}", source=note,
    )


# ----- building blocks -------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, hidden] -> [T, hidden], normalised by its root mean square (in float32)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [T] -> cos, sin: [T, 1, head_dim] (rotate-half layout, float32 angles)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim/2]
    emb = torch.cat([angles, angles], dim=-1)[:, None, :]  # [T, 1, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim] rotated by position (Llama's rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_query_pos: int) -> torch.Tensor:
    """Causal attention over K/V held contiguously: the reference the paged kernels must match.

    q: [Tq, num_heads, head_dim], the queries at positions ``first_query_pos ..``;
    k, v: [Tk, num_kv_heads, head_dim], positions ``0 .. Tk-1`` (Tk >= first_query_pos + Tq).
    Softmax in float32; returns [Tq, num_heads, head_dim] in q's dtype. Written without the
    kernels package, so agreement is evidence, not tautology.
    """
    tq, num_heads, head_dim = q.shape
    tk, kv_heads, _ = k.shape
    group = num_heads // kv_heads
    qf = q.float().reshape(tq, kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [kvh, g, Tq, d]
    kf = k.float().permute(1, 0, 2)[:, None]  # [kvh, 1, Tk, d]
    vf = v.float().permute(1, 0, 2)[:, None]
    scores = (qf @ kf.transpose(-1, -2)) / math.sqrt(head_dim)  # [kvh, g, Tq, Tk]
    q_pos = first_query_pos + torch.arange(tq, device=q.device)[:, None]
    k_pos = torch.arange(tk, device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vf  # [kvh, g, Tq, d]
    return out.permute(2, 0, 1, 3).reshape(tq, num_heads, head_dim).to(q.dtype)


class LiveModel:
    """The decoder's weights and its forward pass over packed tokens (no cache of its own)."""

    def __init__(self, config: LiveModelConfig, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        c = config
        gen = torch.Generator(device="cpu").manual_seed(int(c.seed))

        def normal(*shape: int, std: float) -> torch.Tensor:
            # Drawn on the CPU in float32 so the weights are the same on every device and dtype.
            return (torch.randn(*shape, generator=gen) * std).to(device=self.device, dtype=dtype)

        h, d = c.hidden_size, c.head_dim
        self.embed = normal(c.vocab_size, h, std=1.0)  # [vocab, hidden]
        self.layers = []
        for _ in range(c.num_layers):
            self.layers.append({
                "attn_norm": torch.ones(h, device=self.device, dtype=dtype),
                "wq": normal(h, c.num_heads * d, std=h ** -0.5),  # x @ wq: [T, heads*d]
                "wk": normal(h, c.num_kv_heads * d, std=h ** -0.5),
                "wv": normal(h, c.num_kv_heads * d, std=h ** -0.5),
                "wo": normal(c.num_heads * d, h, std=(c.num_heads * d) ** -0.5),
                "mlp_norm": torch.ones(h, device=self.device, dtype=dtype),
                "w_gate": normal(h, c.intermediate_size, std=h ** -0.5),
                "w_up": normal(h, c.intermediate_size, std=h ** -0.5),
                "w_down": normal(c.intermediate_size, h, std=c.intermediate_size ** -0.5),
            })
        self.final_norm = torch.ones(h, device=self.device, dtype=dtype)
        self.lm_head = normal(h, c.vocab_size, std=LOGIT_SCALE * h ** -0.5)  # [hidden, vocab]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """Hidden states after the final norm.

        tokens, positions: int64 [T] (the new tokens of every sequence in the step, packed);
        ``attend`` stores K/V wherever its engine keeps them and returns the attention output.
        Returns [T, hidden].
        """
        c = self.config
        x = self.embed[tokens]  # [T, hidden]
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, self.dtype)
        t = tokens.shape[0]
        for i, w in enumerate(self.layers):
            hn = rms_norm(x, w["attn_norm"], c.norm_eps)
            q = apply_rope((hn @ w["wq"]).view(t, c.num_heads, c.head_dim), cos, sin)  # [T, heads, d]
            k = apply_rope((hn @ w["wk"]).view(t, c.num_kv_heads, c.head_dim), cos, sin)  # [T, kv_heads, d]
            v = (hn @ w["wv"]).view(t, c.num_kv_heads, c.head_dim).contiguous()
            o = attend(i, q.contiguous(), k.contiguous(), v)  # [T, heads, d]
            x = x + o.reshape(t, c.num_heads * c.head_dim) @ w["wo"]
            hn = rms_norm(x, w["mlp_norm"], c.norm_eps)
            x = x + (torch.nn.functional.silu(hn @ w["w_gate"]) * (hn @ w["w_up"])) @ w["w_down"]
        return rms_norm(x, self.final_norm, c.norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] -> float32 logits [N, vocab]."""
        return (hidden @ self.lm_head).float()

    @torch.inference_mode()
    def dense_layer_outputs(self, tokens: list[int]) -> list[torch.Tensor]:
        """Attention output of every layer for every position of ``tokens``, recomputed with
        K/V held contiguously (no cache, no kernels): the correctness check's reference.
        Returns one [len(tokens), num_heads, head_dim] tensor per layer."""
        outs: list[torch.Tensor] = []

        def attend(_layer: int, q, k, v):
            o = dense_attention(q, k, v, 0)
            outs.append(o)
            return o

        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        self.forward(ids, torch.arange(len(tokens), device=self.device), attend)
        return outs


__all__ = [
    "LiveModelConfig", "LiveModel", "LIVE_SIZES", "LOGIT_SCALE", "AttendFn", "scaled_config",
    "dense_attention", "rms_norm", "apply_rope", "rope_cos_sin",
]
