"""Live engine benchmark: output tokens per second of the paged engine (and the contiguous
baseline) on one fixed workload.

Workload: 32 requests arriving at once, prompts uniform 32-128 tokens, outputs uniform
32-128 tokens (seed 0), at most 16 running, block 16, a pool that fits them (no
preemption). Throughput is output tokens / the engine clock (sum of step times: the cache
measurement and correctness checks between steps are not counted; checks are off here).
The median of ``--repeat`` runs is printed, one JSON line per configuration, then the
hardware. Configurations:

- CPU, torch backend: the ``tiny`` and ``small`` scale-downs of Llama-3.1-8B, fp32, 1 thread;
- CPU, Triton interpreter (``--interpreter``): a 1-layer model on 4 requests (the
  interpreter runs the kernels in numpy, so this measures correctness cost, not speed);
- CUDA (when present): triton backend, ``small`` and ``base``, fp32 and bf16.

Run: ``python benchmarks/bench_live.py [--repeat 3] [--interpreter]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch


def _one(size: str, *, device: str, backend: str, dtype: str, repeat: int, requests: int = 32,
         layers: int | None = None) -> dict:
    from kvsim.live import EngineConfig, LiveModelConfig, LiveSettings, default_num_blocks, run_live, scaled_config
    from kvsim.live.requests import prepare_requests
    from kvsim.spec import get_preset
    from kvsim.workloads import synthetic_workload

    if layers is not None:
        model = LiveModelConfig(num_layers=layers, num_heads=2, num_kv_heads=1, head_dim=16, hidden_size=32,
                                intermediate_size=64, name="interp-1layer")
        w = synthetic_workload(requests, "uniform:8:16", "uniform:4:8", seed=0)
    else:
        model = scaled_config(get_preset("llama-3.1-8b"), size)
        w = synthetic_workload(requests, "uniform:32:128", "uniform:32:128", seed=0)
    prepared = prepare_requests(w, max_len=512, vocab_size=model.vocab_size)
    blocks = default_num_blocks(prepared, 16, 16)
    settings = LiveSettings(model=model, engine=EngineConfig(block_size=16, num_blocks=blocks, max_num_seqs=16,
                                                             backend=backend, check_every=0, validate=device == "cpu"),
                            dtype=dtype, device=device, max_len=512, threads=1)
    runs = [run_live(w, settings).summary for _ in range(repeat)]
    s = runs[0]
    return {
        "model": model.name, "params": model.num_params, "device": s["device"], "backend": s["backend"],
        "dtype": dtype, "requests": requests, "output_tokens": s["output_tokens"],
        "paged_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "contiguous_tokens_per_s": statistics.median(r["contiguous"]["tokens_per_s"] for r in runs),
        "tpot_p50_ms": statistics.median(r["tpot_p50_ms"] for r in runs),
        "measured_peak_kv_bytes": s["measured_peak_kv_bytes"], "predicted_peak_kv_bytes": s["predicted_peak_kv_bytes"],
        "contiguous_peak_kv_bytes": s["contiguous"]["measured_peak_kv_bytes"], "tokens_match": s["tokens_match"],
        "repeat": repeat,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--interpreter", action="store_true", help="also time the Triton interpreter (slow)")
    ap.add_argument("--_interp-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._interp_child:
        print(json.dumps(_one("tiny", device="cpu", backend="triton", dtype="fp32", repeat=1, requests=4, layers=1)))
        return
    rows = []
    for size in ("tiny", "small"):
        rows.append(_one(size, device="cpu", backend="torch", dtype="fp32", repeat=args.repeat))
        print(json.dumps(rows[-1]), flush=True)
    if args.interpreter:
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        out = subprocess.run([sys.executable, __file__, "--_interp-child"], env=env, capture_output=True, text=True)
        if out.returncode == 0:
            print(out.stdout.strip(), flush=True)
        else:
            print(json.dumps({"interpreter": "failed", "stderr": out.stderr.strip().splitlines()[-1:]}))
    if torch.cuda.is_available():
        for size in ("small", "base"):
            for dtype in ("fp32", "bf16"):
                print(json.dumps(_one(size, device="cuda", backend="triton", dtype=dtype, repeat=args.repeat)),
                      flush=True)
    from kvsim.live.record import hardware

    print(json.dumps({"hardware": hardware(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
