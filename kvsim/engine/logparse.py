"""Read the KV capacity a vLLM server printed at start-up, and set it beside the planner's.

vLLM has announced its KV capacity in several forms over its history; all are read:

- ``# GPU blocks: 5691, # CPU blocks: 2048`` (the v0 executors; the device name may differ,
  ``# cuda blocks: ...``), and ``# GPU blocks: 5691`` alone (early v1);
- ``Maximum concurrency for 8192 tokens per request: 11.12x``, the length written with or
  without thousands separators (``8,192``);
- ``GPU KV cache size: 34,952 tokens``;
- the single line that joins the last two:
  ``GPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens per request: 4.27x``.

Lines that explain the budget are read too where present: v1's ``Available KV cache memory:
4.80 GiB``; v0's memory profile (``total_gpu_memory (39.50GiB) x gpu_memory_utilization (0.90)``,
``model weights take 14.96GiB``, ``the rest of the memory reserved for KV Cache is 11.12GiB``);
and the engine's config line (``model='...'``, ``tensor_parallel_size=``, ``kv_cache_dtype=``,
``max_seq_len=``). When a log holds a line several times (a restart, several ranks), the last
one counts: it describes the engine that is running now.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from kvsim.capacity import DEFAULT_GPU_UTIL, DEFAULT_RESERVE_BYTES, CapacityPlan, plan_capacity
from kvsim.errors import KvsimError
from kvsim.gpus import GPUSpec
from kvsim.spec import ModelSpec
from kvsim.units import GiB

_INT = r"\d{1,3}(?:,\d{3})+(?!\d)|\d+"  # an integer, with or without thousands separators
_NUM = f"({_INT})"
_FLOAT = f"((?:{_INT})(?:\\.\\d+)?)"

_BLOCKS = re.compile(r"#\s*(\w+) blocks:\s*" + _NUM + r"(?:\s*,\s*#\s*CPU blocks:\s*" + _NUM + r")?")
_CONCURRENCY = re.compile(r"Maximum concurrency for\s+" + _NUM + r"\s+tokens per request:\s*" + _FLOAT + r"\s*x")
_KV_TOKENS = re.compile(r"(\w+) KV cache size:\s*" + _NUM + r"\s+tokens")
_AVAILABLE = re.compile(r"Available KV cache memory:\s*" + _FLOAT + r"\s*(GiB|MiB|GB)")
_V0_TOTAL = re.compile(r"total_gpu_memory\s*\(\s*" + _FLOAT + r"\s*GiB\s*\)\s*x\s*gpu_memory_utilization\s*\(\s*" + _FLOAT + r"\s*\)")
_V0_WEIGHTS = re.compile(r"model weights take\s*" + _FLOAT + r"\s*GiB")
_V1_WEIGHTS = re.compile(r"Model loading took\s*" + _FLOAT + r"\s*GiB")
_V0_KV = re.compile(r"reserved for KV Cache is\s*" + _FLOAT + r"\s*GiB")
_MODEL = re.compile(r"\bmodel='([^']+)'")
_TP = re.compile(r"\btensor_parallel_size=(\d+)")
_KV_DTYPE = re.compile(r"\bkv_cache_dtype=([\w.]+)")
_MAX_SEQ = re.compile(r"\bmax_seq_len=(\d+)")

_UNIT_BYTES = {"GiB": GiB, "MiB": 1 << 20, "GB": 10**9}


@dataclass(frozen=True)
class VllmLogCapacity:
    """What a vLLM start-up log says about its KV cache (None where it says nothing)."""

    num_gpu_blocks: int | None = None  # "# GPU blocks: N"
    num_cpu_blocks: int | None = None  # "# CPU blocks: M" (v0 swap space)
    kv_cache_tokens: int | None = None  # "GPU KV cache size: N tokens"
    max_model_len: int | None = None  # L in "Maximum concurrency for L tokens per request"
    max_concurrency: float | None = None  # X in "...: X.XXx"
    available_kv_bytes: int | None = None  # v1 "Available KV cache memory" (per rank)
    kv_reserved_bytes: int | None = None  # v0 "the rest of the memory reserved for KV Cache"
    total_gpu_memory_bytes: int | None = None  # v0 profile line
    gpu_memory_utilization: float | None = None  # v0 profile line
    weights_bytes: int | None = None  # "model weights take" / "Model loading took"
    model: str | None = None  # model='...' in the config line
    tensor_parallel_size: int | None = None
    kv_cache_dtype: str | None = None
    max_seq_len: int | None = None
    lines_matched: int = 0  # capacity lines found (all occurrences)

    @property
    def kv_memory_bytes(self) -> int | None:
        """KV memory per rank, whichever form the log gave it in."""
        return self.available_kv_bytes if self.available_kv_bytes is not None else self.kv_reserved_bytes

    def to_dict(self) -> dict:
        data = asdict(self)
        data["kv_memory_bytes"] = self.kv_memory_bytes
        return data


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _float(text: str) -> float:
    return float(text.replace(",", ""))


def _last(pattern: re.Pattern, text: str) -> re.Match | None:
    found = None
    for found in pattern.finditer(text):
        pass
    return found


def parse_vllm_log(text: str) -> VllmLogCapacity:
    """Read the capacity lines of a vLLM start-up log; none found is a KvsimError."""
    if not isinstance(text, str):
        raise KvsimError(f"a log must be text, got {type(text).__name__}")
    blocks = [m for m in _BLOCKS.finditer(text) if m.group(1).upper() != "CPU"]
    conc = list(_CONCURRENCY.finditer(text))
    tokens = [m for m in _KV_TOKENS.finditer(text)]
    matched = len(blocks) + len(conc) + len(tokens)
    if not matched:
        raise KvsimError(
            "no KV capacity lines found; paste the start-up log that holds 'GPU KV cache size: N tokens', "
            "'# GPU blocks: N' or 'Maximum concurrency for L tokens per request: X.XXx'"
        )
    fields: dict = {"lines_matched": matched}
    if blocks:
        fields["num_gpu_blocks"] = _int(blocks[-1].group(2))
        if blocks[-1].group(3):
            fields["num_cpu_blocks"] = _int(blocks[-1].group(3))
    if conc:
        fields["max_model_len"] = _int(conc[-1].group(1))
        fields["max_concurrency"] = _float(conc[-1].group(2))
    if tokens:
        fields["kv_cache_tokens"] = _int(tokens[-1].group(2))
    if m := _last(_AVAILABLE, text):
        fields["available_kv_bytes"] = int(_float(m.group(1)) * _UNIT_BYTES[m.group(2)])
    if m := _last(_V0_TOTAL, text):
        fields["total_gpu_memory_bytes"] = int(_float(m.group(1)) * GiB)
        fields["gpu_memory_utilization"] = _float(m.group(2))
    if m := _last(_V0_WEIGHTS, text) or _last(_V1_WEIGHTS, text):
        fields["weights_bytes"] = int(_float(m.group(1)) * GiB)
    if m := _last(_V0_KV, text):
        fields["kv_reserved_bytes"] = int(_float(m.group(1)) * GiB)
    if m := _last(_MODEL, text):
        fields["model"] = m.group(1)
    if m := _last(_TP, text):
        fields["tensor_parallel_size"] = int(m.group(1))
    if m := _last(_KV_DTYPE, text):
        fields["kv_cache_dtype"] = m.group(1)
    if m := _last(_MAX_SEQ, text):
        fields["max_seq_len"] = int(m.group(1))
    return VllmLogCapacity(**fields)


# ----- beside the planner ----------------------------------------------------------------


@dataclass(frozen=True)
class ComparisonRow:
    """One quantity as the engine reported it and as the planner predicts it."""

    quantity: str  # what is compared, with its unit
    engine: float | None  # the engine's figure (None: the log does not say)
    planner: float  # the planner's figure for the same model, GPU and settings
    ratio: float | None  # engine / planner (1.0: the planner got it exactly)
    note: str = ""  # how the engine figure was obtained when not printed directly

    def to_dict(self) -> dict:
        return asdict(self)


def plan_for_log(
    log: VllmLogCapacity,
    spec: ModelSpec,
    gpu: GPUSpec,
    *,
    kv_dtype: str = "fp16",
    tp: int = 1,
    block_size: int = 16,
    gpu_util: float | None = None,
    weight_dtype: str = "bf16",
    weights_override_bytes: int | None = None,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> CapacityPlan:
    """The planner's capacity for the engine the log describes.

    The request length of the concurrency figure is the log's (else the model's maximum);
    the memory utilization is the caller's, else the log's (v0 prints it), else the
    planner's default 0.9.
    """
    util = gpu_util if gpu_util is not None else (log.gpu_memory_utilization or DEFAULT_GPU_UTIL)
    return plan_capacity(
        spec, gpu, kv_dtype=kv_dtype, tp=tp, block_size=block_size, gpu_util=util,
        weight_dtype=weight_dtype, weights_override_bytes=weights_override_bytes,
        reserve_bytes=reserve_bytes, max_len=log.max_model_len,
    )


def compare_log_with_plan(log: VllmLogCapacity, plan: CapacityPlan) -> list[ComparisonRow]:
    """Rows of engine-versus-planner figures: tokens, blocks, KV memory, concurrency."""
    B = plan.block_size
    rows: list[ComparisonRow] = []
    tokens, note = log.kv_cache_tokens, ""
    if tokens is None and log.num_gpu_blocks is not None:
        tokens, note = log.num_gpu_blocks * B, f"# GPU blocks x block size {B}"
    rows.append(ComparisonRow("KV cache tokens", tokens, plan.kv_tokens, _ratio(tokens, plan.kv_tokens), note))
    blocks, note = log.num_gpu_blocks, ""
    if blocks is None and log.kv_cache_tokens is not None:
        blocks, note = log.kv_cache_tokens // B, f"KV cache tokens / block size {B}"
    rows.append(ComparisonRow("KV blocks", blocks, plan.num_blocks, _ratio(blocks, plan.num_blocks), note))
    mem = log.kv_memory_bytes
    rows.append(ComparisonRow("KV memory per rank (GiB)", None if mem is None else mem / GiB,
                              plan.kv_budget_bytes / GiB, _ratio(mem, plan.kv_budget_bytes)))
    if log.max_model_len is not None:
        rows.append(ComparisonRow(
            f"max concurrency at {log.max_model_len:,} tokens", log.max_concurrency, plan.max_concurrency,
            _ratio(log.max_concurrency, plan.max_concurrency)))
    return rows


def _ratio(a: float | None, b: float) -> float | None:
    return None if a is None or not b else a / b
