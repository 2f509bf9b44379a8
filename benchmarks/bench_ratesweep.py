"""Rate sweep over the Azure LLM inference conversation trace (or a synthetic preset), timed.

Replays the trace's requests (prompt and output lengths) at several mean request rates,
keeping the trace's own arrival pattern compressed to each rate (``--arrivals scaled``) or
re-drawn as Poisson arrivals, under each memory strategy, with the step-time cost model as
the scheduler's clock; prints the normalized latency per strategy and rate, each strategy's
sustained rate, paged's gain beside the PagedAttention paper's, and the wall time.

    python benchmarks/bench_ratesweep.py                      # whole trace, defaults below
    python benchmarks/bench_ratesweep.py --requests 2000 --rates 4,8,12
    # the paper's setting: ShareGPT-like lengths, OPT-13B on one A100 40GB, Poisson arrivals
    python benchmarks/bench_ratesweep.py --workload sharegpt-like --requests 1000 --model opt-13b \
        --gpu a100-40gb --max-len 2048 --arrivals poisson --rates 0.5,1,1.5,2,2.5,3,4,6

The trace is read from $KVSIM_TRACES_DIR, or else ``shared/traces`` beside the repository;
when it is absent the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd

from kvsim.costmodel import CostModel
from kvsim.gpus import get_gpu
from kvsim.ratesweep import PAPER_HEADLINE, PAPER_SOURCE, rate_sweep
from kvsim.spec import get_preset
from kvsim.hostinfo import cpu_model
from kvsim.traces import default_traces_dir as traces_dir, read_trace
from kvsim.workloads import PRESET_WORKLOADS, preset_workload

TRACE = "AzureLLMInferenceTrace_conv.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="azure-conv", choices=["azure-conv", *PRESET_WORKLOADS],
                    help="the Azure conversation trace (default) or a synthetic preset")
    ap.add_argument("--seed", type=int, default=0, help="seed of synthetic lengths and Poisson arrivals")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="a100-80gb")
    ap.add_argument("--max-len", type=int, default=16384, help="max_len (what reserve-max reserves); default 16384")
    ap.add_argument("--rates", default="4,6,8,10,12,16", help="mean request rates, req/s (comma-separated)")
    ap.add_argument("--strategies", default="reserve-max,pow2,oracle,paged")
    ap.add_argument("--requests", type=int, default=0,
                    help="first N requests of the trace (0 = all); requests of a synthetic preset (0 = 1000)")
    ap.add_argument("--arrivals", default="scaled", choices=["scaled", "poisson"])
    args = ap.parse_args(argv)

    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    t0 = time.perf_counter()
    if args.workload == "azure-conv":
        path = traces_dir() / TRACE
        if not path.is_file():
            print(f"trace {TRACE} not found under {traces_dir()} (set KVSIM_TRACES_DIR); skipping")
            return 0
        workload = read_trace(path, limit=args.requests or None)
    else:
        if args.arrivals == "scaled":
            ap.error("a synthetic preset has no trace times: use --arrivals poisson")
        workload = preset_workload(args.workload, args.requests or 1000, max_len=args.max_len, seed=args.seed)
    model = CostModel(get_preset(args.model), get_gpu(args.gpu))
    result = rate_sweep(workload, model, rates, strategies, max_len=args.max_len, arrivals=args.arrivals,
                        seed=args.seed)
    wall = time.perf_counter() - t0

    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    print(f"# {result.describe()}")
    print(f"# unloaded normalized latency {result.unloaded_latency_s * 1e3:.2f} ms/token; "
          f"bound {result.latency_bound_s * 1e3:.2f} ms/token")
    cols = ["strategy", "rate_per_s", "normalized_latency_s", "ttft_p50_s", "tpot_p50_s",
            "throughput_tokens_per_s", "max_running", "preemptions", "dropped"]
    print(result.table[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print()
    print(result.sustained.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print()
    print(result.comparison().to_string(index=False, float_format=lambda v: f"{v:.2f}x"))
    print(f"# paper: {PAPER_HEADLINE}; {PAPER_SOURCE}")
    runs = len(rates) * len(strategies)
    print(f"wall time {wall:.1f} s for {runs} replays of {len(workload):,} requests on {cpu_model()} "
          f"({os.cpu_count()} logical CPUs, Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
