"""Capacity planner: how many KV blocks, tokens and concurrent requests fit on a GPU.

Per tensor-parallel rank, following the budget a serving engine such as vLLM computes::

    usable     = gpu_memory * gpu_memory_utilization
    kv_budget  = usable - weights / tp - reserve          (reserve: activations, buffers)
    num_blocks = floor(kv_budget / block_bytes)           block_bytes = B * bytes_per_token
    kv_tokens  = num_blocks * B                           ("GPU KV cache size: N tokens")
    max_concurrency = num_blocks * block_bytes / request_allocated_bytes(max_len)

For a full-attention model the last line is ``num_blocks / ceil(max_len / B)``, the figure
vLLM logs as "Maximum concurrency for L tokens per request: X.XXx"; sliding-window layers
make a request's footprint smaller and its concurrency higher. The reserve is an
assumption (default 1 GiB); a real engine measures its activation peak by profiling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvsim.calculator import check_block_size, kv_usage
from kvsim.errors import KvsimError
from kvsim.gpus import GiB, GPUSpec
from kvsim.spec import ModelSpec, canonical_dtype

#: Bytes per parameter for weight dtypes (int4 packs two per byte).
WEIGHT_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5,
}

DEFAULT_GPU_UTIL = 0.9
DEFAULT_RESERVE_BYTES = 1 * GiB


def weights_bytes(spec: ModelSpec, weight_dtype: str = "bf16", tp: int = 1) -> int:
    """Weight bytes on one rank: parameters x bytes per parameter / tp (rounded up)."""
    key = str(weight_dtype).lower()
    if key not in WEIGHT_DTYPE_BYTES:
        raise KvsimError(f"unknown weight dtype {weight_dtype!r}; choose one of {', '.join(WEIGHT_DTYPE_BYTES)}")
    if spec.num_params <= 0:
        raise KvsimError(f"{spec.name} has no parameter count; give the weight size by hand")
    return math.ceil(spec.num_params * WEIGHT_DTYPE_BYTES[key] / tp)


@dataclass(frozen=True)
class CapacityPlan:
    """KV capacity of one tensor-parallel rank (every rank holds the same blocks)."""

    model: str
    gpu: str
    gpu_memory_bytes: int  # total device memory
    gpu_util: float  # fraction of it the engine may use
    usable_bytes: int  # gpu_memory_bytes * gpu_util
    weights_bytes: int  # weights on this rank
    reserve_bytes: int  # activations, CUDA graphs, buffers (assumed)
    kv_budget_bytes: int  # what is left for the KV cache
    kv_dtype: str
    tp: int
    block_size: int  # tokens per block
    bytes_per_token: int  # KV bytes per token on this rank
    block_bytes: int  # block_size * bytes_per_token
    num_blocks: int  # whole blocks that fit in the budget
    kv_tokens: int  # num_blocks * block_size
    max_len: int  # tokens per request for the concurrency figure
    request_bytes: int  # KV one request of max_len tokens holds (blocks, windows applied)
    max_concurrency: float  # requests of max_len tokens that fit at once

    def vllm_log_lines(self) -> list[str]:
        """The capacity as vLLM prints it at start-up."""
        return [
            f"GPU KV cache size: {self.kv_tokens:,} tokens",
            f"Maximum concurrency for {self.max_len:,} tokens per request: {self.max_concurrency:.2f}x",
        ]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["vllm_log"] = self.vllm_log_lines()
        return data


def _positive_number(label: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or not value > 0:
        raise KvsimError(f"{label} must be a positive number, got {value!r}")
    if value == float("inf"):
        raise KvsimError(f"{label} must be finite")
    return float(value)


def plan_capacity(
    spec: ModelSpec,
    gpu: GPUSpec,
    *,
    kv_dtype: str = "fp16",
    tp: int = 1,
    block_size: int = 16,
    gpu_util: float = DEFAULT_GPU_UTIL,
    weight_dtype: str = "bf16",
    weights_override_bytes: int | None = None,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    max_len: int | None = None,
) -> CapacityPlan:
    """KV blocks, tokens and concurrency for ``spec`` on ``gpu`` (per rank)."""
    block_size = check_block_size(block_size)
    dtype = canonical_dtype(kv_dtype)
    util = _positive_number("gpu_memory_utilization", gpu_util)
    if util > 1:
        raise KvsimError(f"gpu_memory_utilization must be at most 1, got {gpu_util!r}")
    if isinstance(reserve_bytes, bool) or not isinstance(reserve_bytes, (int, float)) or reserve_bytes < 0 or reserve_bytes != reserve_bytes:
        raise KvsimError(f"reserve must be a non-negative number, got {reserve_bytes!r}")
    if weights_override_bytes is not None:
        if isinstance(weights_override_bytes, bool) or not isinstance(weights_override_bytes, (int, float)) \
                or weights_override_bytes < 0 or weights_override_bytes != weights_override_bytes:
            raise KvsimError(f"weights size must be a non-negative number, got {weights_override_bytes!r}")
        weights = int(weights_override_bytes)
    else:
        weights = weights_bytes(spec, weight_dtype, tp)
    if max_len is None:
        max_len = spec.max_position_embeddings or 4096
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
        raise KvsimError(f"max_len must be a positive integer, got {max_len!r}")

    usable = int(gpu.memory_bytes * util)
    budget = usable - weights - int(reserve_bytes)
    if budget <= 0:
        raise KvsimError(
            f"no room for a KV cache: weights {weights / GiB:.2f} GiB + reserve {reserve_bytes / GiB:.2f} GiB "
            f"exceed the usable {usable / GiB:.2f} GiB of {gpu.name} (try more tensor parallelism, "
            f"a smaller weight dtype or a larger GPU)"
        )
    bytes_per_token = spec.bytes_per_token(dtype, tp)
    block_bytes = block_size * bytes_per_token
    num_blocks = budget // block_bytes
    request = kv_usage(spec, [max_len], kv_dtype=dtype, tp=tp, block_size=block_size)
    return CapacityPlan(
        model=spec.name,
        gpu=gpu.name,
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_util=util,
        usable_bytes=usable,
        weights_bytes=weights,
        reserve_bytes=int(reserve_bytes),
        kv_budget_bytes=budget,
        kv_dtype=dtype,
        tp=tp,
        block_size=block_size,
        bytes_per_token=bytes_per_token,
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        kv_tokens=num_blocks * block_size,
        max_len=max_len,
        request_bytes=request.allocated_bytes,
        max_concurrency=num_blocks * block_bytes / request.allocated_bytes,
    )
