"""The run record: everything needed to say what produced a live run's numbers.

Following the advice for runtime experiments: engine version, model revision (here the
model config and its seed), attention backend, precision, block configuration,
prompt/output length distribution and hardware. Plain JSON-able dicts.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import subprocess
from pathlib import Path

import torch

import kvsim
from kvsim.hostinfo import cpu_model


def git_commit() -> str:
    """``git rev-parse HEAD`` of the source tree kvsim runs from, or "unknown"."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(kvsim.__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else "unknown"


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def hardware(device: torch.device) -> dict:
    """CPU model and core count; GPU name and memory on CUDA."""
    import os

    hw = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        hw["gpu"] = props.name
        hw["gpu_memory_bytes"] = int(props.total_memory)
        hw["cuda"] = torch.version.cuda
    return hw


def build_record(*, model_config: dict, dtype: str, device: torch.device, backend: str, engine_config: dict,
                 pool_bytes: int, workload: dict, extra: dict | None = None) -> dict:
    """The record of one live run (see the module docstring)."""
    rec = {
        "kvsim_version": kvsim.__version__,
        "git_commit": git_commit(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": model_config,
        "seed": model_config.get("seed"),
        "attention_backend": backend,
        "precision": dtype,
        "device": str(device),
        "block_size": engine_config.get("block_size"),
        "num_blocks": engine_config.get("num_blocks"),
        "pool_bytes": pool_bytes,
        "engine": engine_config,
        "workload": workload,
        "hardware": hardware(device),
        "torch_version": torch.__version__,
        "triton_version": package_version("triton"),
        "python_version": platform.python_version(),
    }
    if extra:
        rec.update(extra)
    return rec


__all__ = ["build_record", "git_commit", "cpu_model", "hardware", "package_version"]
