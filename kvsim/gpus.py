"""GPU presets: memory for the capacity planner, bandwidth and matrix throughput for the
step-time model.

Memory is the total the driver reports (``nvidia-smi``'s MiB), which is what a serving
engine's ``gpu_memory_utilization`` multiplies. Bandwidth and dense (no sparsity) 16-bit
tensor-core throughput are the vendors' published peaks; real kernels reach a fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import KvsimError
from kvsim.units import GiB, MiB


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator's published figures."""

    name: str  # display name
    memory_bytes: int  # total device memory as the driver reports it
    bandwidth_bytes_per_s: float  # peak HBM/GDDR bandwidth
    flops_16bit: float  # dense fp16/bf16 tensor-core peak, FLOP/s
    source: str = ""  # where the figures come from

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


GPUS: dict[str, GPUSpec] = {
    "a100-40gb": GPUSpec(
        "A100 40GB (SXM)", 40960 * MiB, 1555e9, 312e12,
        "NVIDIA A100 datasheet: 1,555 GB/s, 312 TFLOPS BF16 dense",
    ),
    "a100-80gb": GPUSpec(
        "A100 80GB (SXM)", 81920 * MiB, 2039e9, 312e12,
        "NVIDIA A100 datasheet: 2,039 GB/s, 312 TFLOPS BF16 dense",
    ),
    "h100-80gb": GPUSpec(
        "H100 80GB (SXM)", 81559 * MiB, 3.35e12, 989e12,
        "NVIDIA H100 datasheet: 3.35 TB/s, 989 TFLOPS BF16 dense (1,979 with sparsity)",
    ),
    "h200": GPUSpec(
        "H200 141GB (SXM)", 143771 * MiB, 4.8e12, 989e12,
        "NVIDIA H200 datasheet: 4.8 TB/s, 989 TFLOPS BF16 dense (1,979 with sparsity)",
    ),
    "l4": GPUSpec(
        "L4 24GB", 23034 * MiB, 300e9, 121e12,
        "NVIDIA L4 datasheet: 300 GB/s, 121 TFLOPS BF16 dense (242 with sparsity)",
    ),
    "rtx-4090": GPUSpec(
        "GeForce RTX 4090 24GB", 24564 * MiB, 1008e9, 165.2e12,
        "NVIDIA Ada whitepaper: 1,008 GB/s, 165.2 TFLOPS FP16 tensor dense (FP32 accumulate)",
    ),
}


def gpu_names() -> list[str]:
    return list(GPUS)


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU preset up by id (case-insensitive)."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    if key not in GPUS:
        raise KvsimError(f"unknown GPU {name!r}; choose one of: {', '.join(GPUS)}")
    return GPUS[key]


def custom_gpu(
    memory_gib: float,
    bandwidth_gb_per_s: float = 1000.0,
    tflops_16bit: float = 100.0,
    name: str = "custom GPU",
) -> GPUSpec:
    """A GPU set by hand (memory in GiB, bandwidth in GB/s, throughput in TFLOP/s)."""
    for label, value in (
        ("GPU memory (GiB)", memory_gib),
        ("bandwidth (GB/s)", bandwidth_gb_per_s),
        ("throughput (TFLOP/s)", tflops_16bit),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
            raise KvsimError(f"{label} must be a positive number, got {value!r}")
        if value == float("inf"):
            raise KvsimError(f"{label} must be finite")
    return GPUSpec(name, int(round(memory_gib * GiB)), bandwidth_gb_per_s * 1e9, tflops_16bit * 1e12, "set by hand")
