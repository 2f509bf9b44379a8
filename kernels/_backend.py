"""Which backend runs a call, and whether Triton can run here at all.

Triton is never imported by this module: `import kernels` has to work on a machine
without triton (the Streamlit app and the simulator never need it). The Triton
modules are imported on first use by `triton_module()`, and the mode they were
imported under is remembered, because Triton reads ``TRITON_INTERPRET`` when a
kernel is *decorated*: flipping the variable afterwards changes nothing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType

import torch

BACKENDS = ("auto", "triton", "torch")

# The mode the Triton modules were imported under ("triton" / "triton-interpreter"),
# fixed at first import; None until then.
_imported_mode: str | None = None


def _interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no")


@functools.lru_cache(maxsize=None)
def _triton_installed() -> bool:
    # find_spec scans sys.path: once per process, not once per kernel call.
    return importlib.util.find_spec("triton") is not None


def triton_mode() -> str:
    """How the ``triton`` backend would run here: "triton", "triton-interpreter" or "unavailable".

    - "triton": triton is installed, a CUDA device is visible and the interpreter is
      off; kernels compile for the GPU and need CUDA tensors.
    - "triton-interpreter": ``TRITON_INTERPRET=1`` was set before triton was first
      imported; the same kernels run in numpy on CPU tensors (slow, for tests).
    - "unavailable": triton is not installed, or there is neither a GPU nor the
      interpreter.

    Meant for run records ("which kernels produced these numbers?").
    """
    if _imported_mode is not None:
        return _imported_mode
    if not _triton_installed():
        return "unavailable"
    if _interpret_requested():
        return "triton-interpreter"
    if torch.cuda.is_available():
        return "triton"
    return "unavailable"


def available_backends() -> list[str]:
    """Concrete backends that can run on this machine, best first (e.g. ``["triton", "torch"]``)."""
    return (["triton"] if triton_mode() != "unavailable" else []) + ["torch"]


def resolve(backend: str, device: torch.device) -> str:
    """Map a requested backend to "triton" or "torch" for tensors on `device`.

    "auto" picks compiled Triton for CUDA tensors and the torch reference otherwise
    (the interpreter is never chosen automatically: it is orders of magnitude slower).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    mode = triton_mode()
    if backend == "auto":
        return "triton" if device.type == "cuda" and mode == "triton" else "torch"
    if backend == "triton":
        if mode == "unavailable":
            raise RuntimeError(
                "backend='triton' is unavailable here: triton is not installed, or there is no "
                "CUDA device and TRITON_INTERPRET=1 was not set before triton was imported"
            )
        if mode == "triton" and device.type != "cuda":
            raise ValueError(
                f"backend='triton' needs CUDA tensors, got tensors on {device} "
                "(set TRITON_INTERPRET=1 before importing triton to run the kernels on CPU)"
            )
    return backend


def triton_module(name: str) -> ModuleType:
    """Import ``kernels.<name>`` (a module that imports triton) and remember the mode."""
    global _imported_mode
    mode = triton_mode()
    module = importlib.import_module(f"kernels.{name}")
    if _imported_mode is None:
        _imported_mode = mode
    return module


def interpreting() -> bool:
    """True when the Triton kernels run under the interpreter (decides interpreter workarounds)."""
    return triton_mode() == "triton-interpreter"
