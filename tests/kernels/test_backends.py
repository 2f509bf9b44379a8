"""Backend selection, lazy triton import, and what the run record can say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kernels

REPO = Path(__file__).resolve().parents[2]


def test_available_backends_and_mode():
    assert "torch" in kernels.available_backends()
    assert kernels.triton_mode() in ("triton", "triton-interpreter", "unavailable")
    assert ("triton" in kernels.available_backends()) == (kernels.triton_mode() != "unavailable")


def test_import_without_triton():
    """`import kernels` never imports triton, and everything but backend='triton' works without it."""
    script = """
import sys
import kernels
assert "triton" not in sys.modules, "import kernels imported triton"
sys.modules["triton"] = None  # as if triton were not installed
import importlib.util
importlib.util.find_spec = lambda name, *a, _orig=importlib.util.find_spec: None if name == "triton" else _orig(name, *a)
import torch
assert kernels.triton_mode() == "unavailable", kernels.triton_mode()
assert kernels.available_backends() == ["torch"]
cache = torch.randn(2, 8, 1, 64)
table = torch.tensor([[1, 0]], dtype=torch.int32)
out = kernels.paged_attention(torch.randn(1, 2, 64), cache, cache, table, torch.tensor([9], dtype=torch.int32))
assert out.shape == (1, 2, 64)
try:
    kernels.paged_attention(torch.randn(1, 2, 64), cache, cache, table, torch.tensor([9], dtype=torch.int32),
                            backend="triton")
except RuntimeError as e:
    assert "unavailable" in str(e)
else:
    raise AssertionError("backend='triton' should fail without triton")
print("ok")
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
