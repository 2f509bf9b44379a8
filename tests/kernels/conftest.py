"""Run the Triton kernels under the CPU interpreter when there is no GPU.

Triton reads TRITON_INTERPRET when a kernel is decorated, so this has to happen before
anything imports triton (kernels imports it lazily, on first use of the triton backend).
"""

import os
import sys
from pathlib import Path

import torch

# The helpers in paged_cases.py are imported by name; with --import-mode=importlib
# pytest does not put test directories on sys.path, so do it here.
sys.path.insert(0, str(Path(__file__).resolve().parent))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernels  # noqa: E402


def _backends():
    params = [pytest.param("torch", id="torch")]
    marks = () if "triton" in kernels.available_backends() else (pytest.mark.skip(reason="triton unavailable"),)
    params.append(pytest.param("triton", id="triton", marks=marks))
    return params


BACKENDS = _backends()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def device():
    """CUDA when present (compiled kernels), else CPU (torch backend and the interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
