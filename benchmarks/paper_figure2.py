"""The PagedAttention paper's Figure 2, replayed: where KV memory goes under each strategy.

OPT-13B, fp16 KV, 12 GiB of KV memory (the paper's A100-40GB setting), the ShareGPT-like
workload (a fitted stand-in, see kvsim.workloads), 1000 requests at 2 requests/s (Poisson),
16-token blocks. Prints the time-averaged split of used memory beside the paper's
token-state percentages.

    python benchmarks/paper_figure2.py [--requests N] [--rate R] [--seed S]
"""

from __future__ import annotations

import argparse

from kvsim.simulate import run_strategies
from kvsim.spec import get_preset
from kvsim.strategies import PAPER_NAMES, PAPER_TOKEN_STATE_PERCENT
from kvsim.units import GiB
from kvsim.workloads import preset_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spec = get_preset("opt-13b")
    w = preset_workload("sharegpt-like", args.requests, arrivals=f"poisson:{args.rate}", seed=args.seed, max_len=2048)
    res = run_strategies(w, spec, ["reserve-max", "pow2", "oracle", "paged"], kv_memory_bytes=12 * GiB, block_size=16)
    print(f"{spec.name}, 12 GiB KV, {w.description}")
    print(f"{'strategy':14s} {'token states':>12s} {'paper':>7s} {'reservation':>11s} {'internal':>9s} "
          f"{'external':>9s} {'running':>8s}")
    for name, r in res.items():
        s = r.summary
        print(f"{PAPER_NAMES[name]:14s} {s.token_state_fraction:12.1%} {PAPER_TOKEN_STATE_PERCENT[name]:6.1f}% "
              f"{s.reservation_fraction:11.1%} {s.internal_fraction:9.1%} {s.external_fraction:9.1%} "
              f"{s.mean_running:8.1f}")


if __name__ == "__main__":
    main()
