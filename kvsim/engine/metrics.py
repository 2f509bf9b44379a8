"""Read a serving engine's Prometheus metrics into one engine-agnostic snapshot.

vLLM, SGLang and TensorRT-LLM all publish KV usage, queue depths and cache counters, each
under its own names; :func:`parse_metrics` turns one scrape of any of them into an
:class:`EngineSnapshot` whose fields mean the same thing whichever engine wrote it. A field
the engine does not publish stays ``None``: nothing is guessed.

The exposition text is parsed by ``prometheus_client``'s own parser; counters are read by
their sample names (``..._total``) so a scrape with or without ``# TYPE`` lines reads alike.

Several engines behind one endpoint (vLLM's data-parallel engines, told apart by the
``engine`` label; SGLang's ``dp_rank``; Triton's ``model``) are read one by one into
``per_engine`` and then combined: request counts, block counts and counters add up; KV usage
is the capacity-weighted mean (the plain mean where capacities are unknown).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable

from prometheus_client.parser import text_string_to_metric_families

from kvsim.engine.detect import SGLANG, TRITON_TRTLLM, TRTLLM, VLLM, detect_engine, engine_of
from kvsim.errors import KvsimError

#: (sample name, labels, value) as the parser yields it.
Sample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class EngineSnapshot:
    """One scrape of one engine (or the combination of several behind one endpoint)."""

    engine: str  # "vllm", "sglang", "trtllm" or "triton-trtllm" (kvsim.engine.detect)
    kv_usage_fraction: float | None = None  # used / total KV blocks (tokens for SGLang), 0-1
    num_running: int | None = None  # requests in the running batch
    num_waiting: int | None = None  # requests queued, not yet admitted
    num_preemptions: float | None = None  # cumulative preemptions since the engine started
    prefix_cache_queries: float | None = None  # cumulative prompt tokens looked up (vLLM)
    prefix_cache_hits: float | None = None  # cumulative prompt tokens found cached (vLLM)
    prefix_cache_hit_rate: float | None = None  # hits / queries since start, or the engine's own gauge
    block_size: int | None = None  # tokens per KV block
    num_gpu_blocks: int | None = None  # KV blocks in the pool (summed over engines)
    num_used_blocks: float | None = None  # blocks in use, where the engine counts them
    kv_capacity_tokens: int | None = None  # tokens the KV pool holds (blocks x block size, or reported)
    kv_used_tokens: float | None = None  # tokens' worth of KV in use: reported, used blocks x B, or usage x capacity
    cache_dtype: str | None = None  # KV dtype as the engine names it ("auto", "fp8" ...)
    gpu_memory_utilization: float | None = None  # vLLM's --gpu-memory-utilization
    enable_prefix_caching: bool | None = None
    model_names: tuple[str, ...] = ()  # model_name (or Triton model) labels seen
    engine_ids: tuple[str, ...] = ()  # the labels that told engines apart ("0", "1" ...)
    per_engine: tuple["EngineSnapshot", ...] = field(default=(), repr=False)  # one per engine id, when several

    @property
    def blocks_per_engine(self) -> int | None:
        """KV blocks of one engine (one GPU or one TP group): what a capacity plan predicts."""
        if self.per_engine:
            return self.per_engine[0].num_gpu_blocks
        return self.num_gpu_blocks

    def to_dict(self) -> dict:
        data = asdict(self)
        data["model_names"] = list(self.model_names)
        data["engine_ids"] = list(self.engine_ids)
        data["per_engine"] = [e.to_dict() for e in self.per_engine]
        return data


# ----- parsing ---------------------------------------------------------------------------


def parse_samples(text: str) -> list[Sample]:
    """All samples of a Prometheus text exposition; a text that is not one is a KvsimError."""
    if not isinstance(text, str):
        raise KvsimError(f"metrics must be text, got {type(text).__name__}")
    samples: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name = s.name.replace("trtllm:", "trtllm_", 1) if s.name.startswith("trtllm:") else s.name
                samples.append((name, dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        first = text.lstrip()[:60].splitlines()[0] if text.strip() else ""
        raise KvsimError(f"not Prometheus metrics text ({_one_line(exc)}); it starts {first!r}") from None
    return samples


def parse_metrics(text: str) -> EngineSnapshot:
    """The :class:`EngineSnapshot` of one scrape; the engine is detected from the names."""
    samples = parse_samples(text)
    if not samples:
        raise KvsimError("the response holds no metrics (empty exposition)")
    engine = detect_engine(name for name, _, _ in samples)
    return snapshot_from_samples(engine, samples)


def snapshot_from_samples(engine: str, samples: list[Sample]) -> EngineSnapshot:
    """Read ``samples`` as ``engine`` writes them, engine by engine, and combine."""
    reader, group_labels = _READERS[engine]
    samples = [s for s in samples if engine_of(s[0]) == engine]  # other exporters' series (process_*, nv_inference_*) aside
    groups: dict[str, list[Sample]] = {}
    shared: list[Sample] = []  # samples without a group label apply to every group
    for sample in samples:
        key = next((sample[1][g] for g in group_labels if g in sample[1]), None)
        if key is None:
            shared.append(sample)
        else:
            groups.setdefault(key, []).append(sample)
    if not groups:
        return reader(engine, shared)
    ids = sorted(groups, key=_natural)
    parts = [replace(reader(engine, groups[k] + _fill_missing(shared, groups[k])), engine_ids=(k,)) for k in ids]
    if len(parts) == 1:
        return parts[0]
    return combine(engine, parts, tuple(ids))


def _fill_missing(shared: list[Sample], own: list[Sample]) -> list[Sample]:
    """Shared samples whose names the group does not carry itself."""
    own_names = {name for name, _, _ in own}
    return [s for s in shared if s[0] not in own_names]


def _natural(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if key.isdigit() else (1, key)


# ----- helpers ---------------------------------------------------------------------------


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _values(samples: Iterable[Sample], name: str, **labels: str) -> list[float]:
    out = []
    for n, lab, value in samples:
        if n == name and all(lab.get(k) == v for k, v in labels.items()):
            v = _finite(value)
            if v is not None:
                out.append(v)
    return out


def _sum(samples: list[Sample], *names: str, **labels: str) -> float | None:
    """Sum of the first of ``names`` that has samples (counts, counters)."""
    for name in names:
        vals = _values(samples, name, **labels)
        if vals:
            return float(sum(vals))
    return None


def _mean(samples: list[Sample], *names: str, **labels: str) -> float | None:
    """Mean of the first of ``names`` that has samples (fractions)."""
    for name in names:
        vals = _values(samples, name, **labels)
        if vals:
            return float(sum(vals) / len(vals))
    return None


def _count(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _label_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _label_int(text: str | None) -> int | None:
    value = _label_float(text)
    return int(value) if value is not None and value.is_integer() and value >= 0 else None


def _label_bool(text: str | None) -> bool | None:
    if text is None:
        return None
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    return None


def _label_str(text: str | None) -> str | None:
    return None if text is None or text in ("", "None") else text


def _models(samples: list[Sample], *keys: str) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for _, labels, _ in samples:
        for key in keys:
            if labels.get(key):
                seen[labels[key]] = None
    return tuple(seen)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:120]


# ----- per-engine readers ----------------------------------------------------------------


def _read_vllm(engine: str, samples: list[Sample]) -> EngineSnapshot:
    info: dict[str, str] = {}
    for name, labels, value in samples:
        if name == "vllm:cache_config_info" and value:
            info = labels
    block_size = _label_int(info.get("block_size"))
    num_blocks = _label_int(info.get("num_gpu_blocks"))
    capacity = _label_int(info.get("kv_cache_size_tokens"))
    if capacity is None and block_size and num_blocks is not None:
        capacity = block_size * num_blocks
    usage = _mean(samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    queries = _sum(samples, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
                   "vllm:gpu_prefix_cache_queries_total")
    hits = _sum(samples, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
                "vllm:gpu_prefix_cache_hits_total")
    hit_rate = _ratio(hits, queries)
    if hit_rate is None and queries is None:
        hit_rate = _mean(samples, "vllm:gpu_prefix_cache_hit_rate")  # the v0 gauge
    return EngineSnapshot(
        engine=engine,
        kv_usage_fraction=usage,
        num_running=_count(_sum(samples, "vllm:num_requests_running")),
        num_waiting=_count(_sum(samples, "vllm:num_requests_waiting")),
        num_preemptions=_sum(samples, "vllm:num_preemptions_total", "vllm:num_preemptions"),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hit_rate,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        num_used_blocks=None if usage is None or num_blocks is None else usage * num_blocks,
        kv_capacity_tokens=capacity,
        kv_used_tokens=None if usage is None or capacity is None else usage * capacity,
        cache_dtype=_label_str(info.get("cache_dtype")),
        gpu_memory_utilization=_label_float(info.get("gpu_memory_utilization")),
        enable_prefix_caching=_label_bool(info.get("enable_prefix_caching")),
        model_names=_models(samples, "model_name"),
    )


def _read_sglang(engine: str, samples: list[Sample]) -> EngineSnapshot:
    used = _sum(samples, "sglang:num_used_tokens")
    capacity = _sum(samples, "sglang:max_total_num_tokens")
    usage = _mean(samples, "sglang:token_usage")
    if usage is None:
        usage = _ratio(used, capacity)
    info: dict[str, str] = {}
    for name, labels, value in samples:
        if name == "sglang:cache_config_info" and value:
            info = labels
    page = _label_int(info.get("page_size"))
    cap = _count(capacity)
    return EngineSnapshot(
        engine=engine,
        kv_usage_fraction=usage,
        num_running=_count(_sum(samples, "sglang:num_running_reqs")),
        num_waiting=_count(_sum(samples, "sglang:num_queue_reqs")),
        prefix_cache_hit_rate=_mean(samples, "sglang:cache_hit_rate"),
        block_size=page,
        num_gpu_blocks=cap // page if page and cap is not None else None,
        kv_capacity_tokens=cap,
        kv_used_tokens=used if used is not None else (None if usage is None or cap is None else usage * cap),
        model_names=_models(samples, "model_name"),
    )


def _read_trtllm(engine: str, samples: list[Sample]) -> EngineSnapshot:
    max_blocks = _sum(samples, "trtllm_kv_cache_max_blocks", "trtllm_kv_cache_total_blocks")
    used_blocks = _sum(samples, "trtllm_kv_cache_used_blocks")
    free_blocks = _sum(samples, "trtllm_kv_cache_free_blocks")
    if used_blocks is None and max_blocks is not None and free_blocks is not None:
        used_blocks = max_blocks - free_blocks
    block_size = _count(_mean(samples, "trtllm_kv_cache_tokens_per_block"))
    usage = _mean(samples, "trtllm_kv_cache_utilization")
    if usage is None:
        usage = _ratio(used_blocks, max_blocks)
    return _block_snapshot(
        engine, usage, max_blocks, used_blocks, block_size,
        running=_sum(samples, "trtllm_num_requests_running"),
        waiting=_sum(samples, "trtllm_num_requests_waiting"),
        hit_rate=_mean(samples, "trtllm_kv_cache_hit_rate"),
        models=_models(samples, "model_name"),
    )


def _read_triton(engine: str, samples: list[Sample]) -> EngineSnapshot:
    kv = "nv_trt_llm_kv_cache_block_metrics"
    key = "kv_cache_block_type"
    max_blocks = _sum(samples, kv, **{key: "max"})
    used_blocks = _sum(samples, kv, **{key: "used"})
    free_blocks = _sum(samples, kv, **{key: "free"})
    if used_blocks is None and max_blocks is not None and free_blocks is not None:
        used_blocks = max_blocks - free_blocks
    usage = _mean(samples, kv, **{key: "fraction"})
    if usage is None:
        usage = _ratio(used_blocks, max_blocks)
    req = "nv_trt_llm_request_metrics"
    running = _sum(samples, req, request_type="scheduled")
    if running is None:
        running = _sum(samples, req, request_type="active")
    return _block_snapshot(
        engine, usage, max_blocks, used_blocks, _count(_mean(samples, kv, **{key: "tokens_per"})),
        running=running,
        waiting=_sum(samples, req, request_type="waiting"),
        hit_rate=None,
        models=_models(samples, "model"),
    )


def _block_snapshot(engine, usage, max_blocks, used_blocks, block_size, *, running, waiting, hit_rate, models):
    num_blocks = _count(max_blocks)
    capacity = block_size * num_blocks if block_size and num_blocks is not None else None
    if used_blocks is not None and block_size:
        used_tokens = used_blocks * block_size
    elif usage is not None and capacity is not None:
        used_tokens = usage * capacity
    else:
        used_tokens = None
    return EngineSnapshot(
        engine=engine,
        kv_usage_fraction=usage,
        num_running=_count(running),
        num_waiting=_count(waiting),
        prefix_cache_hit_rate=hit_rate,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        num_used_blocks=used_blocks,
        kv_capacity_tokens=capacity,
        kv_used_tokens=used_tokens,
        model_names=models,
    )


#: engine -> (reader, labels that tell several engines behind one endpoint apart)
_READERS: dict[str, tuple[Callable[[str, list[Sample]], EngineSnapshot], tuple[str, ...]]] = {
    VLLM: (_read_vllm, ("engine",)),
    SGLANG: (_read_sglang, ("dp_rank",)),
    TRTLLM: (_read_trtllm, ()),
    TRITON_TRTLLM: (_read_triton, ("model",)),
}


# ----- combining engines -----------------------------------------------------------------


def _add(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return float(sum(known)) if known and len(known) == len(values) else None


def _same(values: list):
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 else None


def combine(engine: str, parts: list[EngineSnapshot], ids: tuple[str, ...]) -> EngineSnapshot:
    """Several engines as one: sums for counts and counters, capacity-weighted mean usage."""
    assert parts, "combine needs at least one engine"
    usages = [p.kv_usage_fraction for p in parts]
    caps = [p.kv_capacity_tokens or p.num_gpu_blocks for p in parts]
    if all(u is not None for u in usages):
        if all(c for c in caps):
            usage = sum(u * c for u, c in zip(usages, caps)) / sum(caps)
        else:
            usage = sum(usages) / len(usages)
    else:
        usage = None
    queries = _add([p.prefix_cache_queries for p in parts])
    hits = _add([p.prefix_cache_hits for p in parts])
    hit_rate = _ratio(hits, queries)
    if hit_rate is None and queries is None:
        rates = [p.prefix_cache_hit_rate for p in parts if p.prefix_cache_hit_rate is not None]
        hit_rate = sum(rates) / len(rates) if rates else None
    models: dict[str, None] = {}
    for p in parts:
        models.update(dict.fromkeys(p.model_names))
    return EngineSnapshot(
        engine=engine,
        kv_usage_fraction=usage,
        num_running=_count(_add([p.num_running for p in parts])),
        num_waiting=_count(_add([p.num_waiting for p in parts])),
        num_preemptions=_add([p.num_preemptions for p in parts]),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hit_rate,
        block_size=_same([p.block_size for p in parts]),
        num_gpu_blocks=_count(_add([p.num_gpu_blocks for p in parts])),
        num_used_blocks=_add([p.num_used_blocks for p in parts]),
        kv_capacity_tokens=_count(_add([p.kv_capacity_tokens for p in parts])),
        kv_used_tokens=_add([p.kv_used_tokens for p in parts]),
        cache_dtype=_same([p.cache_dtype for p in parts]),
        gpu_memory_utilization=_same([p.gpu_memory_utilization for p in parts]),
        enable_prefix_caching=_same([p.enable_prefix_caching for p in parts]),
        model_names=tuple(models),
        engine_ids=ids,
        per_engine=tuple(parts),
    )
