"""Benchmark: replay the full Azure conversation trace, event-driven versus step by step.

Llama-3.1-8B, fp16 KV, paged with 16-token blocks, 40 GiB of KV memory, trace arrivals
(0.02 s per engine step). Both replays run in this one process; the script checks that
their Timelines are identical and prints both times and their ratio.

    python benchmarks/bench_simulate.py [--repeat N] [--skip-steps]

The trace is read from $KVSIM_TRACES_DIR or ../shared/traces next to the repository.
Not a test: timings depend on the machine (the CPU model is printed with them).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import pandas as pd

from kvsim.simulate import simulate
from kvsim.spec import get_preset
from kvsim.hostinfo import cpu_model
from kvsim.traces import default_traces_dir as traces_dir, read_trace
from kvsim.units import GiB

TRACE = "AzureLLMInferenceTrace_conv.csv"


def timed(fn, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of the event-driven replay; the best is reported")
    ap.add_argument("--skip-steps", action="store_true", help="skip the (slow) step-by-step replay")
    args = ap.parse_args()
    path = traces_dir() / TRACE
    if not path.exists():
        print(f"trace {TRACE} not found in {traces_dir()}; set KVSIM_TRACES_DIR", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    workload = read_trace(path)
    read_s = time.perf_counter() - t0
    spec = get_preset("llama-3.1-8b")
    kw = dict(strategy="paged", block_size=16, kv_memory_bytes=40 * GiB)

    ev_s, ev = timed(lambda: simulate(workload, spec, event_driven=True, **kw), args.repeat)
    s = ev.summary
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), Python {platform.python_version()}")
    print(f"trace: {TRACE}, {len(workload):,} requests (read in {read_s:.2f} s)")
    print(f"setup: {spec.name} fp16, paged block 16, 40 GiB KV = {s.num_blocks:,} blocks; arrivals from the trace")
    print(f"result: {s.steps:,} steps, {s.finished:,} finished, {s.preemptions} preemptions, "
          f"running max {s.max_running} mean {s.mean_running:.1f}, token states {s.token_state_fraction:.1%}")
    print(f"event-driven : {ev_s:.2f} s (best of {args.repeat})")
    if args.skip_steps:
        return 0
    st_s, st = timed(lambda: simulate(workload, spec, event_driven=False, **kw), 1)
    pd.testing.assert_frame_equal(ev.timeline, st.timeline)
    assert ev.summary == st.summary
    print(f"step-by-step : {st_s:.2f} s")
    print(f"speed-up     : {st_s / ev_s:.1f}x (identical Timelines: {len(st.timeline):,} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
