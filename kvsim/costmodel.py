"""Step-time cost model: what paging does not remove.

Paging fixes *allocation*; every decode step still reads each sequence's whole KV cache, and
the weights once. This module turns one engine step (a batch of prefill chunks and decode
sequences with their context lengths) into bytes moved and floating-point operations, and
puts them against a GPU's memory bandwidth and matrix throughput: a roofline lower bound on
the step's time, and which side binds.

Formulas (per tensor-parallel rank ``t``; ``N`` parameters, ``N_act`` active parameters per
token (MoE; ``N`` for a dense model), ``b_w`` bytes per weight, ``T`` tokens in the step,
``H`` query heads, ``d`` head_dim, ``L_kind`` layers of each kind)::

    linear phase (all projections and MLPs, every token of the step)
        weight_bytes    = min(N, N_act * T) * b_w / t        (read once per step)
        linear_flops    = 2 * N_act * T / t                   (a multiply-add per weight and token)
        activation_bytes= T * L * 2 * (4*hidden + 2*intermediate) / t   (bf16; off by default)
    attention phase (per sequence; a chunk of q new tokens after p cached tokens)
        kv_read_bytes   = sum over layers of attended(p, q) * layer_bytes_per_token
        kv_write_bytes  = q * bytes_per_token                 (the new tokens' K/V)
        attention_flops = sum over layers of 4 * H/t * d * causal_pairs(p, q)
    time_s = max(weight+activation bytes / BW, linear_flops / F)
           + max(kv bytes / BW, attention_flops / F)
           + step_overhead_s

with ``BW = bandwidth * bandwidth_efficiency`` and ``F = flops_16bit * compute_efficiency``.
The two phases run as separate kernels one after the other, so the step is the *sum* of
each phase's roofline maximum (a single max over the whole step would let the MLP's compute
hide the attention's memory traffic, which real engines do not achieve).

Counting per layer kind (reusing :mod:`kvsim.spec` bytes per token):

- full attention: a chunk attends ``attended = p + q`` distinct keys (each read once) and
  ``causal_pairs = q*p + q*(q+1)/2`` query-key pairs;
- sliding window ``W`` (a query sees the last ``W`` positions, itself included): distinct keys
  ``min(p + q, W + q - 1)``; pairs ``sum_{k=p+1}^{p+q} min(k, W)``;
- MLA (absorbed, as vLLM decodes it): the latent of ``kv_lora_rank + qk_rope_head_dim``
  values is read once per key, replicated on every rank; FLOPs per pair
  ``2*H/t*(r + rope) + 2*H/t*r`` (scores against the latent, then the latent-weighted sum).

A decode sequence of context ``c`` (tokens in its cache after this step's token is written,
the token attending to itself included) is a chunk with ``p = c - 1, q = 1``.

Assumptions and omissions (why the result is a *lower bound*): peak figures unless the
efficiencies say otherwise; no interconnect time for tensor parallelism; no sampling,
embedding-gather or kernel-launch cost unless ``step_overhead_s`` adds one; the LM head is
counted for every token (2N per token) though engines compute logits only for sampled
positions (about 2% of OPT-13B's parameters); an MoE step reads ``min(N, N_act * T)``
weight bytes, the distinct weights ``T`` tokens can touch at most.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from kvsim.capacity import WEIGHT_DTYPE_BYTES
from kvsim.errors import KvsimError
from kvsim.gpus import GPUSpec
from kvsim.spec import MLA, SLIDING, ModelSpec, canonical_dtype

MEMORY = "memory"
COMPUTE = "compute"

#: Bytes per activation element (bf16/fp16 activations, whatever the weight dtype).
ACTIVATION_BYTES = 2


def _int_array(values: Iterable[int] | np.ndarray | int, what: str, *, minimum: int = 0) -> np.ndarray:
    """Whole numbers >= ``minimum`` as int64 (a caller's mistake raises KvsimError)."""
    arr = np.asarray(values if not np.isscalar(values) else [values])
    arr = arr.reshape(-1)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        try:
            as_float = arr.astype(np.float64)
        except (TypeError, ValueError):
            raise KvsimError(f"{what} must be whole numbers") from None
        if not np.all(np.isfinite(as_float)) or not np.all(as_float == np.round(as_float)):
            raise KvsimError(f"{what} must be whole numbers")
        arr = as_float.astype(np.int64)
    arr = arr.astype(np.int64, copy=False)
    if (arr < minimum).any():
        raise KvsimError(f"{what} must be at least {minimum}, got {int(arr.min())}")
    return arr


def _sum_min(lo: np.ndarray, hi: np.ndarray, window: int) -> np.ndarray:
    """``sum_{k=lo}^{hi} min(k, window)`` elementwise (0 where ``hi < lo``), exact in int64."""
    lo = lo.astype(np.int64)
    hi = hi.astype(np.int64)
    # Part below the window: k in [lo, min(hi, W)]; part at or above: (hi - max(lo, W+1) + 1) * W.
    a_hi = np.minimum(hi, window)
    below = np.where(a_hi >= lo, (lo + a_hi) * (a_hi - lo + 1) // 2, 0)
    b_lo = np.maximum(lo, window + 1)
    above = np.where(hi >= b_lo, (hi - b_lo + 1) * window, 0)
    return below + above


@dataclass(frozen=True)
class StepCost:
    """Bytes, FLOPs and modelled time of one engine step on one tensor-parallel rank."""

    num_prefill_tokens: int  # new prompt tokens processed this step (all chunks)
    num_decode_seqs: int  # sequences producing one token this step
    weight_bytes: int  # weights read once for the step
    activation_bytes: int  # activation traffic of the linear layers (0 unless enabled)
    kv_read_bytes: int  # K/V (or MLA latent) bytes attention reads, each key once per sequence
    kv_write_bytes: int  # K/V bytes of the new tokens written to the cache
    linear_flops: int  # projections and MLPs: 2 * active params per token
    attention_flops: int  # QK^T and PV over each query's attended keys
    linear_time_s: float  # max(linear bytes / BW, linear FLOPs / F)
    attention_time_s: float  # max(KV bytes / BW, attention FLOPs / F)
    overhead_s: float  # fixed per-step cost added (0 by default)
    time_s: float  # linear_time_s + attention_time_s + overhead_s
    linear_bound: str  # "memory" or "compute": the side that binds the linear phase
    attention_bound: str  # the side that binds the attention phase
    bound: str  # the side binding the larger share of the step's time

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def total_flops(self) -> int:
        return self.linear_flops + self.attention_flops

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved over the whole step."""
        return self.total_flops / self.total_bytes if self.total_bytes else math.inf

    @property
    def attention_share(self) -> float:
        """Fraction of the modelled step time spent in attention (0-1)."""
        return self.attention_time_s / self.time_s if self.time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(num_tokens=self.num_tokens, total_bytes=self.total_bytes, total_flops=self.total_flops,
                    arithmetic_intensity=self.arithmetic_intensity, attention_share=self.attention_share)
        return data


def _check_efficiency(label: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or not 0 < value <= 1:
        raise KvsimError(f"{label} must be a number in (0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CostModel:
    """A model on a GPU, turned into per-step time. Frozen and hashable (cache-friendly).

    ``bandwidth_efficiency`` and ``compute_efficiency`` scale the GPU's published peaks
    (1.0, the default, gives the roofline lower bound; measured kernels typically reach
    0.6-0.9 of peak bandwidth). ``step_overhead_s`` adds a fixed cost per step (scheduling,
    launches, sampling); 0 by default.
    """

    spec: ModelSpec
    gpu: GPUSpec
    kv_dtype: str = "fp16"  # KV cache dtype
    weight_dtype: str = "bf16"  # weight dtype (one of capacity.WEIGHT_DTYPE_BYTES)
    tp: int = 1  # tensor-parallel degree; all figures are per rank
    bandwidth_efficiency: float = 1.0  # fraction of peak bandwidth reached
    compute_efficiency: float = 1.0  # fraction of peak 16-bit throughput reached
    step_overhead_s: float = 0.0  # fixed time added to every step
    include_activations: bool = False  # count the linear layers' activation traffic
    weight_params: int | None = None  # parameter count override (a model without num_params)
    _layer: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        dtype = canonical_dtype(self.kv_dtype)
        object.__setattr__(self, "kv_dtype", dtype)
        wkey = str(self.weight_dtype).lower()
        if wkey not in WEIGHT_DTYPE_BYTES:
            raise KvsimError(f"unknown weight dtype {self.weight_dtype!r}; choose one of {', '.join(WEIGHT_DTYPE_BYTES)}")
        object.__setattr__(self, "weight_dtype", wkey)
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp <= 0:
            raise KvsimError(f"tensor-parallel degree must be a positive integer, got {self.tp!r}")
        _check_efficiency("bandwidth efficiency", self.bandwidth_efficiency)
        _check_efficiency("compute efficiency", self.compute_efficiency)
        ov = self.step_overhead_s
        if isinstance(ov, bool) or not isinstance(ov, (int, float)) or ov != ov or ov < 0 or ov == math.inf:
            raise KvsimError(f"step overhead must be a non-negative number of seconds, got {ov!r}")
        params = self.weight_params if self.weight_params is not None else self.spec.num_params
        if isinstance(params, bool) or not isinstance(params, int) or params <= 0:
            if self.weight_params is not None:
                raise KvsimError(f"parameter count must be a positive integer, got {self.weight_params!r}")
            params = _estimate_params(self.spec)
        # Derived constants, computed once: the simulator calls step_cost every step.
        if self.weight_params is None and self.spec.num_active_params:
            active = self.spec.num_active_params  # MoE: parameters one token touches
        else:
            active = params
        h_per_rank = max(1, self.spec.num_attention_heads // self.tp)
        kinds = []
        for kind, count in self.spec.layer_counts().items():
            per_token = count * self.spec.layer_bytes_per_token(kind, dtype, self.tp)
            if kind == MLA:
                r, rope = self.spec.kv_lora_rank, self.spec.qk_rope_head_dim
                flops_per_pair = count * (2 * h_per_rank * (r + rope) + 2 * h_per_rank * r)
            else:
                flops_per_pair = count * 4 * h_per_rank * self.spec.head_dim
            kinds.append((kind, per_token, flops_per_pair))
        self._layer.update(
            params=int(params), active=int(active), kinds=tuple(kinds),
            bytes_per_token=self.spec.bytes_per_token(dtype, self.tp),
            weight_bytes_per_param=WEIGHT_DTYPE_BYTES[wkey],
            # bf16 activations: each linear block reads its input and writes its output once.
            act_bytes_per_token=(self.spec.num_layers * ACTIVATION_BYTES
                                 * (4 * self.spec.hidden_size + 2 * self.spec.intermediate_size))
            if self.include_activations else 0,
            bw=self.gpu.bandwidth_bytes_per_s * self.bandwidth_efficiency,
            flops=self.gpu.flops_16bit * self.compute_efficiency,
        )

    # ----- derived figures ------------------------------------------------------------

    @property
    def num_params(self) -> int:
        """Parameters whose weights the model holds (preset, override or estimate)."""
        return self._layer["params"]

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Effective bandwidth: peak x efficiency."""
        return self._layer["bw"]

    @property
    def flops_per_s(self) -> float:
        """Effective 16-bit throughput: peak x efficiency."""
        return self._layer["flops"]

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte at which the GPU turns from memory- to compute-bound."""
        return self.flops_per_s / self.bandwidth_bytes_per_s

    def describe(self) -> str:
        """One line naming every input, for chart captions."""
        eff = ""
        if self.bandwidth_efficiency != 1 or self.compute_efficiency != 1:
            eff = f", efficiency {self.bandwidth_efficiency:g} BW / {self.compute_efficiency:g} compute"
        ov = f", +{self.step_overhead_s * 1e3:g} ms/step" if self.step_overhead_s else ""
        return (f"{self.spec.name} on {self.gpu.name} (tp {self.tp}), weights {self.weight_dtype}, "
                f"KV {self.kv_dtype}{eff}{ov}")

    # ----- one step ---------------------------------------------------------------------

    def step_cost(
        self,
        *,
        prefill_tokens: Iterable[int] | np.ndarray = (),
        prefill_cached: Iterable[int] | np.ndarray | None = None,
        decode_context: Iterable[int] | np.ndarray = (),
    ) -> StepCost:
        """Cost of one step.

        ``prefill_tokens[i]`` new prompt tokens of chunk ``i`` follow ``prefill_cached[i]``
        tokens already in its cache (0 when not given: a fresh prompt, or prefix-cache hits
        that are skipped count here); ``decode_context[j]`` is decode sequence ``j``'s context
        after this step's token is written (>= 1).
        """
        q = _int_array(prefill_tokens, "prefill token counts", minimum=1)
        p = np.zeros_like(q) if prefill_cached is None else _int_array(prefill_cached, "cached prefix lengths")
        if p.shape != q.shape:
            raise KvsimError(f"{q.size} prefill chunks but {p.size} cached prefix lengths")
        c = _int_array(decode_context, "decode context lengths", minimum=1)
        return self._cost(q, p, c)

    def step_time(self, **kwargs: Any) -> float:
        """Modelled seconds of one step (see :meth:`step_cost`)."""
        return self.step_cost(**kwargs).time_s

    def __call__(self, batch: Any) -> float:
        """``step_time_fn`` for the scheduler: seconds for a :class:`kvsim.scheduler.StepBatch`
        (``prefill_tokens``, ``prefill_cached_tokens``, ``decode_context_lens``); the
        shorter names ``prefill_cached`` / ``decode_context`` are read too. Chunks that
        compute no token (a prompt wholly served from the prefix cache) cost nothing here.
        """
        q = np.asarray(_attr(batch, "prefill_tokens", "prefill_tokens"), dtype=np.int64).reshape(-1)
        p = _attr(batch, "prefill_cached_tokens", "prefill_cached")
        p = np.zeros_like(q) if p is None else np.asarray(p, dtype=np.int64).reshape(-1)
        c = np.asarray(_attr(batch, "decode_context_lens", "decode_context"), dtype=np.int64).reshape(-1)
        if p.shape != q.shape:
            raise KvsimError(f"{q.size} prefill chunks but {p.size} cached prefix lengths")
        if q.size:
            keep = q > 0
            if not keep.all():
                q, p = q[keep], p[keep]
            if q.size and (int(q.min()) < 0 or int(p.min()) < 0):
                raise KvsimError("a step batch has negative prefill token counts")
        if c.size and int(c.min()) < 1:
            raise KvsimError("a step batch has a decode context below 1")
        return self._time_fast(q, p, c)

    def _time_fast(self, q: np.ndarray, p: np.ndarray, c: np.ndarray) -> float:
        """``_cost(q, p, c).time_s`` with as few numpy reductions as possible: the simulator
        calls this once per step (tests check it against :meth:`step_cost`)."""
        L = self._layer
        num_decode = int(c.size)
        tokens = num_decode + (int(q.sum()) if q.size else 0)
        if tokens == 0:
            return 0.0
        kv_read = 0
        attn_flops = 0
        sum_c = int(c.sum()) if num_decode else 0
        for kind, per_token, flops_per_pair in L["kinds"]:
            if kind == SLIDING:
                W = int(self.spec.sliding_window)
                keys = int(np.minimum(c, W).sum()) if num_decode else 0
                pairs = keys
                if q.size:
                    end = p + q
                    keys += int(np.minimum(end, W + q - 1).sum())
                    pairs += int(_sum_min(p + 1, end, W).sum())
            else:
                keys = pairs = sum_c
                if q.size:
                    keys += int((p + q).sum())
                    pairs += int((q * p + q * (q + 1) // 2).sum())
            kv_read += keys * per_token
            attn_flops += pairs * flops_per_pair
        kv_write = tokens * L["bytes_per_token"]
        tp = self.tp
        touched = min(L["params"], L["active"] * tokens)
        weight_bytes = math.ceil(touched * L["weight_bytes_per_param"] / tp)
        act_bytes = math.ceil(tokens * L["act_bytes_per_token"] / tp)
        linear_flops = 2 * L["active"] * tokens // tp
        bw, fl = L["bw"], L["flops"]
        return (max((weight_bytes + act_bytes) / bw, linear_flops / fl)
                + max((kv_read + kv_write) / bw, attn_flops / fl) + float(self.step_overhead_s))

    def _cost(self, q: np.ndarray, p: np.ndarray, c: np.ndarray) -> StepCost:
        L = self._layer
        num_prefill = int(q.sum())
        num_decode = int(c.size)
        tokens = num_prefill + num_decode
        # A decode sequence is a chunk of one new token after c - 1 cached ones.
        all_q = np.concatenate([q, np.ones_like(c)]) if c.size else q
        all_p = np.concatenate([p, c - 1]) if c.size else p
        end = all_p + all_q  # context after the step, per sequence
        kv_read = 0
        attn_flops = 0
        for kind, per_token, flops_per_pair in L["kinds"]:
            if kind == SLIDING:
                W = int(self.spec.sliding_window)
                keys = int(np.minimum(end, W + all_q - 1).sum())
                pairs = int(_sum_min(all_p + 1, end, W).sum())
            else:
                keys = int(end.sum())
                pairs = int((all_q * all_p + all_q * (all_q + 1) // 2).sum())
            kv_read += keys * per_token
            attn_flops += pairs * flops_per_pair
        kv_write = tokens * L["bytes_per_token"]

        tp = self.tp
        touched = min(L["params"], L["active"] * tokens)
        weight_bytes = math.ceil(touched * L["weight_bytes_per_param"] / tp) if tokens else 0
        act_bytes = math.ceil(tokens * L["act_bytes_per_token"] / tp)
        linear_flops = 2 * L["active"] * tokens // tp

        bw, fl = L["bw"], L["flops"]
        lin_mem, lin_cmp = (weight_bytes + act_bytes) / bw, linear_flops / fl
        att_mem, att_cmp = (kv_read + kv_write) / bw, attn_flops / fl
        lin_t, att_t = max(lin_mem, lin_cmp), max(att_mem, att_cmp)
        lin_bound = MEMORY if lin_mem >= lin_cmp else COMPUTE
        att_bound = MEMORY if att_mem >= att_cmp else COMPUTE
        mem_t = (lin_t if lin_bound == MEMORY else 0.0) + (att_t if att_bound == MEMORY else 0.0)
        cmp_t = (lin_t + att_t) - mem_t
        overhead = float(self.step_overhead_s) if tokens else 0.0
        return StepCost(
            num_prefill_tokens=num_prefill, num_decode_seqs=num_decode,
            weight_bytes=weight_bytes, activation_bytes=act_bytes,
            kv_read_bytes=kv_read, kv_write_bytes=kv_write,
            linear_flops=linear_flops, attention_flops=attn_flops,
            linear_time_s=lin_t, attention_time_s=att_t, overhead_s=overhead,
            time_s=lin_t + att_t + overhead,
            linear_bound=lin_bound, attention_bound=att_bound,
            bound=MEMORY if mem_t >= cmp_t else COMPUTE,
        )


def _attr(batch: Any, name: str, alias: str) -> Any:
    value = getattr(batch, name, None)
    if value is None:
        value = getattr(batch, alias, None)
    return () if value is None and name != "prefill_cached_tokens" else value


def _estimate_params(spec: ModelSpec) -> int:
    """Parameters of a dense decoder from its shapes, for models without a count:
    attention (Q, O: h*H*d each; K, V: h*Hkv*d each) + a gated MLP (3*h*I, or 8*h*h
    when the MLP width is unknown) per layer, plus embeddings (vocab*h)."""
    h = spec.hidden_size or spec.num_attention_heads * spec.head_dim
    attn = h * spec.head_dim * (2 * spec.num_attention_heads + 2 * spec.num_kv_heads)
    mlp = 3 * h * spec.intermediate_size if spec.intermediate_size else 8 * h * h
    return spec.num_layers * (attn + mlp) + spec.vocab_size * h


# ----- sweeps for the Cost page --------------------------------------------------------


def context_sweep(model: CostModel, contexts: Sequence[int], batch_size: int = 1) -> pd.DataFrame:
    """A decode step of ``batch_size`` sequences, each at context ``c``, for each ``c``:
    KV bytes read, weight bytes, modelled time and attention's share of it."""
    _check_positive_int("batch size", batch_size)
    rows = []
    for ctx in _int_array(contexts, "context lengths", minimum=1).tolist():
        s = model.step_cost(decode_context=np.full(batch_size, ctx, dtype=np.int64))
        rows.append({
            "context": ctx, "batch_size": batch_size, "kv_read_bytes": s.kv_read_bytes,
            "weight_bytes": s.weight_bytes, "step_time_s": s.time_s,
            "linear_time_s": s.linear_time_s, "attention_time_s": s.attention_time_s,
            "attention_share": s.attention_share, "bound": s.bound,
            "arithmetic_intensity": s.arithmetic_intensity,
        })
    return pd.DataFrame(rows)


def batch_sweep(model: CostModel, batch_sizes: Sequence[int], context: int,
                max_batch_in_memory: int | None = None) -> pd.DataFrame:
    """Decode steps of growing batches at a fixed ``context``: throughput (tokens/s, one
    token per sequence per step) and per-token latency (the step time). ``fits_in_memory``
    says whether the batch's KV fits when ``max_batch_in_memory`` is given."""
    _check_positive_int("context", context)
    rows = []
    for b in _int_array(batch_sizes, "batch sizes", minimum=1).tolist():
        s = model.step_cost(decode_context=np.full(b, context, dtype=np.int64))
        rows.append({
            "batch_size": b, "context": context, "step_time_s": s.time_s,
            "throughput_tokens_per_s": b / s.time_s, "per_token_latency_s": s.time_s,
            "kv_read_bytes": s.kv_read_bytes, "attention_share": s.attention_share,
            "bound": s.bound, "arithmetic_intensity": s.arithmetic_intensity,
            "fits_in_memory": None if max_batch_in_memory is None else b <= max_batch_in_memory,
        })
    return pd.DataFrame(rows)


def ridge_batch_size(model: CostModel, context: int) -> float | None:
    """Smallest decode batch (real-valued) at which a step of sequences at ``context``
    reaches the GPU's ridge point (step FLOPs/bytes >= F/BW); None if no batch does.

    Per sequence the step adds ``f`` FLOPs and ``k`` KV bytes; the weights ``w`` are read
    once. ``B*f / (w + B*k) >= R``  <=>  ``B >= R*w / (f - R*k)`` when ``f > R*k``.
    ``w`` is all the weights: exact for a dense model, and for an MoE model once the batch
    touches every expert (``B * N_act >= N``).
    """
    _check_positive_int("context", context)
    one = model.step_cost(decode_context=[context])
    w = math.ceil(model.num_params * WEIGHT_DTYPE_BYTES[model.weight_dtype] / model.tp)
    f = one.total_flops
    k = one.total_bytes - one.weight_bytes
    R = model.ridge_point
    if f - R * k <= 0:
        return None
    return R * w / (f - R * k)


@dataclass(frozen=True)
class RooflineBoundary:
    """Where decode steps turn from memory- to compute-bound, for one model on one GPU."""

    ridge_point: float  # GPU FLOPs per byte at the ridge: F / BW
    linear_ridge_tokens: int | None  # fewest tokens per step making the linear phase compute-bound
    context: int  # decode context the attention figures refer to
    attention_intensity: float  # attention FLOPs per KV byte of one decode token at `context`
    attention_compute_bound: bool  # whether decode attention ever binds on compute
    step_ridge_batch: float | None  # decode batch at which the whole step reaches the ridge

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def linear_ridge_tokens(model: CostModel, max_tokens: int = 1 << 24) -> int | None:
    """Fewest tokens in a step for which the linear phase is compute-bound (None beyond
    ``max_tokens``). For a dense model without activation traffic this is
    ``ceil(R * b_w / 2)``: intensity ``2*N*T / (N*b_w) = 2T/b_w``. Intensity never falls as
    tokens grow, so a binary search finds it for MoE and activation traffic too."""
    def compute_bound(tokens: int) -> bool:
        return model.step_cost(prefill_tokens=[tokens]).linear_bound == COMPUTE

    if not compute_bound(max_tokens):
        return None
    lo, hi = 1, max_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if compute_bound(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def roofline_boundary(model: CostModel, context: int) -> RooflineBoundary:
    """The memory/compute boundary: the linear phase's ridge (in tokens per step), decode
    attention's intensity (constant in context for full layers: about ``2*H / (Hkv*b_kv)``
    FLOPs per byte, so MHA in fp16 sits near 1 and never reaches a GPU's ridge), and the
    batch at which the whole decode step does."""
    _check_positive_int("context", context)
    s = model.step_cost(decode_context=[context])
    attn_bytes = s.kv_read_bytes + s.kv_write_bytes
    intensity = s.attention_flops / attn_bytes if attn_bytes else 0.0
    return RooflineBoundary(
        ridge_point=model.ridge_point,
        linear_ridge_tokens=linear_ridge_tokens(model),
        context=int(context),
        attention_intensity=intensity,
        attention_compute_bound=intensity >= model.ridge_point,
        step_ridge_batch=ridge_batch_size(model, context),
    )


def intensity_grid(model: CostModel, batch_sizes: Sequence[int], contexts: Sequence[int]) -> pd.DataFrame:
    """Arithmetic intensity, modelled achieved FLOP/s and binding side of decode steps over a
    batch x context grid (for the roofline chart)."""
    rows = []
    bs = _int_array(batch_sizes, "batch sizes", minimum=1).tolist()
    for ctx in _int_array(contexts, "context lengths", minimum=1).tolist():
        for b in bs:
            s = model.step_cost(decode_context=np.full(b, ctx, dtype=np.int64))
            rows.append({"batch_size": b, "context": ctx, "arithmetic_intensity": s.arithmetic_intensity,
                         "achieved_flops_per_s": s.total_flops / s.time_s, "bound": s.bound,
                         "step_time_s": s.time_s})
    return pd.DataFrame(rows)


def prefill_sweep(model: CostModel, prompt_lengths: Sequence[int]) -> pd.DataFrame:
    """One fresh prompt per step: prefill time (the time-to-first-token floor) and its bound."""
    rows = []
    for n in _int_array(prompt_lengths, "prompt lengths", minimum=1).tolist():
        s = model.step_cost(prefill_tokens=[n])
        rows.append({"prompt_tokens": n, "step_time_s": s.time_s, "bound": s.bound,
                     "attention_share": s.attention_share, "arithmetic_intensity": s.arithmetic_intensity})
    return pd.DataFrame(rows)


# ----- validation hook: measured step times against the model --------------------------


def _field(step: Any, name: str, default: Any = None) -> Any:
    if isinstance(step, dict):
        return step.get(name, default)
    return getattr(step, name, default)


def _step_kwargs(step: Any) -> dict[str, Any]:
    """step_cost arguments of a measured step; chunks that computed no token are dropped."""
    q = list(_field(step, "prefill_tokens", ()) or ())
    p = _field(step, "prefill_cached")
    p = [0] * len(q) if p is None or not len(p) else list(p)
    if len(p) != len(q):
        raise KvsimError(f"{len(q)} prefill chunks but {len(p)} cached prefix lengths")
    keep = [i for i, n in enumerate(q) if n != 0]
    return {"prefill_tokens": [q[i] for i in keep], "prefill_cached": [p[i] for i in keep],
            "decode_context": list(_field(step, "decode_context", ()) or ())}


def compare_step_times(model: CostModel, steps: Iterable[Any]) -> pd.DataFrame:
    """Measured step times beside the model's prediction for the same batch and lengths.

    Each step is a mapping or an object with ``step_time_s`` (measured seconds),
    ``decode_context`` (context per decode sequence, this step's token included) and
    optionally ``prefill_tokens`` / ``prefill_cached`` and ``step`` (index; position when
    absent). Returns one row per step: ``step``, ``measured_step_time_s``,
    ``predicted_step_time_s``, ``ratio`` (measured / predicted: >= 1 for a true lower bound),
    ``num_tokens``, ``kv_read_bytes`` and ``bound``.
    """
    rows = []
    for i, step in enumerate(steps):
        measured = _field(step, "step_time_s")
        if isinstance(measured, bool) or not isinstance(measured, (int, float, np.floating, np.integer)) \
                or not measured >= 0 or measured == math.inf:
            raise KvsimError(f"step {i}: measured step_time_s must be a non-negative number, got {measured!r}")
        cost = model.step_cost(**_step_kwargs(step))
        rows.append({
            "step": int(_field(step, "step", i)), "measured_step_time_s": float(measured),
            "predicted_step_time_s": cost.time_s,
            "ratio": float(measured) / cost.time_s if cost.time_s > 0 else math.nan,
            "num_tokens": cost.num_tokens, "kv_read_bytes": cost.kv_read_bytes, "bound": cost.bound,
        })
    columns = ["step", "measured_step_time_s", "predicted_step_time_s", "ratio", "num_tokens", "kv_read_bytes", "bound"]
    return pd.DataFrame(rows, columns=columns)


def predicted_timeline(model: CostModel, steps: Iterable[Any], source: str = "predicted") -> pd.DataFrame:
    """A Timeline (``step``, ``time_s``, ``step_time_s``, ``source``) of the model's step
    times for the same batches, to draw beside a measured Timeline."""
    from kvsim.timeline import make_timeline

    rows, clock = [], 0.0
    for i, step in enumerate(steps):
        t = model.step_cost(**_step_kwargs(step)).time_s
        clock += t
        rows.append({"step": int(_field(step, "step", i)), "time_s": clock, "step_time_s": t, "source": source})
    return make_timeline(rows)


def _check_positive_int(label: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise KvsimError(f"{label} must be a positive integer, got {value!r}")
    return int(value)


__all__ = [
    "CostModel", "StepCost", "MEMORY", "COMPUTE", "context_sweep", "batch_sweep",
    "ridge_batch_size", "intensity_grid", "prefill_sweep", "RooflineBoundary", "roofline_boundary",
    "linear_ridge_tokens", "ACTIVATION_BYTES", "compare_step_times", "predicted_timeline",
]
