"""Calculator benchmark: 1,000,000 sequence lengths through the vectorised path.

Prints the median wall time of `kv_usage` over one million random context lengths for a
full-attention model (Llama-3.1-8B) and a mixed sliding/full one (Gemma-3-27B), and, in the
same run, a plain Python loop over a 100,000-length slice for scale (the ratio is per
sequence). Run: `python benchmarks/bench_calculator.py [--n 1000000] [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import numpy as np

from kvsim.calculator import kv_usage
from kvsim.hostinfo import cpu_model
from kvsim.spec import get_preset


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _python_loop(spec, lens, block_size: int) -> int:
    per_token = spec.bytes_per_token()
    total = 0
    for n in lens:
        total += math.ceil(n / block_size) * block_size * per_token
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 131_072, size=args.n)
    cpu = cpu_model()
    rows = []
    for preset in ("llama-3.1-8b", "gemma-3-27b"):
        spec = get_preset(preset)
        t = _median_time(lambda: kv_usage(spec, lens, block_size=16), args.repeat)
        rows.append({"model": preset, "sequences": args.n, "median_s": t, "sequences_per_s": args.n / t})
    spec = get_preset("llama-3.1-8b")
    k = min(100_000, args.n)
    sub = lens[:k].tolist()
    loop_t = _median_time(lambda: _python_loop(spec, sub, 16), max(1, args.repeat // 2))
    assert _python_loop(spec, sub, 16) == kv_usage(spec, sub, block_size=16).allocated_bytes
    vec_per_seq = rows[0]["median_s"] / args.n
    loop_per_seq = loop_t / k
    result = {"cpu": cpu, "numpy": np.__version__, "rows": rows,
              "python_loop_per_sequence_s": loop_per_seq, "vectorised_per_sequence_s": vec_per_seq,
              "speedup": loop_per_seq / vec_per_seq}
    print(json.dumps(result, indent=2))
    print(f"\nCPU: {cpu}")
    print(f"{'model':<14} {'sequences':>10} {'median (s)':>11} {'seq/s':>14}")
    for r in rows:
        print(f"{r['model']:<14} {r['sequences']:>10,} {r['median_s']:>11.4f} {r['sequences_per_s']:>14,.0f}")
    print(f"vectorised vs Python loop (allocated bytes only, per sequence): {result['speedup']:.0f}x faster")


if __name__ == "__main__":
    main()
