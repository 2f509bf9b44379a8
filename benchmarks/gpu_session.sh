#!/usr/bin/env bash
# Everything kvsim measures on a GPU, in one run (about 6-8 minutes on one H200):
#   1. the kernel tests on CUDA (compiled Triton against the float64 reference),
#   2. the kernel benchmark (Llama-3.1-8B decode shapes; JSON + table),
#   3. the live engine on CUDA with the Triton kernels (bf16 and fp32), and its benchmark.
# Needs python3 with torch (CUDA), triton, numpy, pandas, pytest and hypothesis; the project
# runs from this tree (PYTHONPATH), nothing is installed. Results go to $OUT (default out/).
# Usage: bash benchmarks/gpu_session.sh
set -u
cd "$(dirname "$0")/.."
out="${OUT:-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=python3

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $py -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"
} 2>&1 | tee "$out/device.txt"

echo "== 1. kernel tests on CUDA"
timeout 300 $py -m pytest tests/kernels -q -x -p no:cacheprovider 2>&1 | tail -n 15 | tee "$out/kernel_tests.txt"

echo "== 2. kernel benchmark"
timeout 330 $py benchmarks/bench_kernels.py --json-out "$out/bench_kernels.json" 2>&1 | tee "$out/bench_kernels.txt"

echo "== 3. live engine on CUDA"
for dtype in bf16 fp32; do
  timeout 120 $py -m kvsim live --device cuda --backend triton --dtype "$dtype" --json \
    > "$out/live_cuda_$dtype.json" 2> "$out/live_cuda_$dtype.err"
  echo "live $dtype: exit $?"
done
timeout 240 $py benchmarks/bench_live.py --repeat 3 2>&1 | tee "$out/bench_live.txt"

echo "== summary"
$py - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for dtype in ("bf16", "fp32"):
    p = out / f"live_cuda_{dtype}.json"
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        print(f"live {dtype}: no result (see {p.with_suffix('.err').name})")
        continue
    keys = ("backend", "measured_peak_kv_bytes", "predicted_peak_kv_bytes", "tokens_match", "max_abs_error",
            "tokens_per_s", "cuda_max_memory_allocated_bytes")
    print(f"live {dtype}: " + ", ".join(f"{k}={d.get(k)}" for k in keys))
PY
tail -n 25 "$out/bench_kernels.txt"
