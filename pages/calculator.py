"""Calculator: bytes per token, blocks, slack, reservation waste and GPU capacity."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from kvsim.calculator import (
    DEFAULT_SWEEP_BLOCK_SIZES, block_size_sweep, concurrency_sweep, kv_usage, parse_lengths,
    per_sequence_table, sequence_lengths,
)
from kvsim.capacity import DEFAULT_GPU_UTIL, WEIGHT_DTYPE_BYTES, plan_capacity
from kvsim.errors import KvsimError
from kvsim.figures.calculator import (
    block_size_sweep_figure, capacity_figure, concurrency_figure, sequence_blocks_figure,
)
from kvsim.gpus import GPUS, custom_gpu, get_gpu
from kvsim.units import GiB, fmt_bytes
from ui.params import init_from_query, sync_to_query
from ui.sidebar import current_model

choice = current_model()
spec = choice.spec

st.title("KV-cache calculator")
st.caption(
    "PagedAttention stores K and V in fixed-size blocks: a sequence of n tokens takes ceil(n / B) blocks, "
    "and only its last block can hold empty slots. Numbers are per GPU (tensor-parallel rank)."
)

init_from_query({"block": ("calc_block", 16, int), "context": ("calc_context", "33", str),
                 "conc": ("calc_conc", 1, int), "maxlen": ("calc_maxlen", 2048, int),
                 "prefix": ("calc_prefix", 0, int), "gpu": ("calc_gpu", "a100-40gb", str)})

c1, c2, c3, c4, c5 = st.columns([1, 2, 1, 1, 1])
block_size = int(c1.number_input("Block size (tokens)", min_value=1, max_value=4096, step=1, key="calc_block"))
context_text = c2.text_input("Context lengths (tokens, comma-separated)", key="calc_context",
                             help="One or several sequences, e.g. `33` or `512, 2k, 8k`.")
concurrency = int(c3.number_input("Copies of each", min_value=1, max_value=1_000_000, step=1, key="calc_conc"))
max_len = int(c4.number_input("max_len (reservation)", min_value=1, step=1, key="calc_maxlen",
                              help="What a max-length reservation (Orca-style) would set aside per sequence."))
prefix = int(c5.number_input("Shared prefix (tokens)", min_value=0, step=1, key="calc_prefix",
                             help="A prompt prefix every sequence shares: its full blocks are stored once."))


def _compute():
    contexts = parse_lengths(context_text)
    lens = sequence_lengths(contexts, concurrency)
    usage = kv_usage(spec, lens, kv_dtype=choice.kv_dtype, tp=choice.tp, block_size=block_size,
                     max_len=max_len, shared_prefix_len=prefix)
    return contexts, lens, usage


try:
    contexts, lens, usage = _compute()
    st.session_state["calc_last"] = (contexts, lens, usage, block_size)
except KvsimError as exc:
    st.error(str(exc))
    if "calc_last" not in st.session_state:
        st.stop()
    contexts, lens, usage, block_size = st.session_state["calc_last"]
    st.caption("Showing the last valid input.")
else:
    sync_to_query({"block": block_size, "context": context_text, "conc": concurrency, "maxlen": max_len,
                   "prefix": prefix})

m = st.columns(5)
m[0].metric("Bytes per token", f"{usage.bytes_per_token:,}", help=fmt_bytes(usage.bytes_per_token))
m[1].metric("Bytes per block", f"{usage.block_bytes:,}", help=fmt_bytes(usage.block_bytes))
m[2].metric("Blocks", f"{usage.blocks:,}", help=f"{usage.num_sequences:,} sequence(s), {usage.tokens:,} tokens")
m[3].metric("Slack tokens", f"{usage.slack_tokens:,}", help="Empty token slots in the sequences' last blocks.")
m[4].metric("Slack", f"{100 * usage.slack_fraction:.1f} %", help=f"{usage.slack_bytes:,} bytes of the allocated memory")
m = st.columns(5)
m[0].metric("Live", fmt_bytes(usage.live_bytes), help=f"{usage.live_bytes:,} bytes holding written tokens")
m[1].metric("Allocated", fmt_bytes(usage.allocated_bytes), help=f"{usage.allocated_bytes:,} bytes in whole blocks")
m[2].metric("Reserved (max_len)", fmt_bytes(usage.reserved_bytes or 0),
            help=f"{usage.num_sequences:,} x {usage.max_len or 0:,} tokens set aside up front")
m[3].metric("Reservation waste", fmt_bytes(usage.reservation_waste_bytes or 0),
            help="Reserved bytes that hold no token: what paging avoids.")
m[4].metric("Saved by prefix sharing", fmt_bytes(usage.sharing_saved_bytes),
            help=f"{usage.shared_blocks} full prefix block(s) stored once instead of per sequence.")
if spec.has_sliding:
    st.info(f"{spec.name} has sliding-window layers (window {spec.sliding_window:,} tokens): they keep only "
            "the blocks that overlap the window, so allocated bytes grow more slowly than blocks.")

left, right = st.columns(2)
with left:
    first = int(contexts[0])
    st.plotly_chart(sequence_blocks_figure(first, block_size), width="stretch")
    st.caption(f"The first sequence ({first:,} tokens). Every block but the last is full; the outlined grey slots "
               "are allocated and empty.")
with right:
    conc_points = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, concurrency})
    longest = max(contexts)
    try:
        conc_df = concurrency_sweep(spec, longest, conc_points, kv_dtype=choice.kv_dtype, tp=choice.tp,
                                    block_size=block_size, max_len=max(max_len, longest))
        st.plotly_chart(concurrency_figure(conc_df, longest, max(max_len, longest)), width="stretch")
        st.caption(f"Sequences of {longest:,} tokens each, no sharing. Reserved assumes max_len "
                   f"{max(max_len, longest):,} per sequence; allocated rounds each up to whole blocks.")
    except KvsimError as exc:
        st.error(str(exc))

sweep = block_size_sweep(spec, lens, DEFAULT_SWEEP_BLOCK_SIZES, kv_dtype=choice.kv_dtype, tp=choice.tp)
st.plotly_chart(block_size_sweep_figure(sweep), width="stretch")
st.caption("Same sequences at each block size. Smaller blocks waste less of their last block but need longer "
           "block tables (4-byte entries) that the kernel must read and the scheduler must manage.")

st.subheader("GPU capacity")
g1, g2, g3, g4, g5 = st.columns(5)
gpu_ids = list(GPUS) + ["custom"]
gpu_id = g1.selectbox("GPU", gpu_ids, key="calc_gpu", format_func=lambda k: GPUS[k].name if k in GPUS else "custom")
custom_mem = g1.number_input("GPU memory (GiB)", min_value=1.0, value=80.0, step=1.0, key="calc_gpu_mem",
                             disabled=gpu_id != "custom")
util = g2.slider("gpu_memory_utilization", 0.05, 1.0, DEFAULT_GPU_UTIL, 0.01, key="calc_util")
weight_dtype = g3.selectbox("Weight dtype", list(WEIGHT_DTYPE_BYTES), index=list(WEIGHT_DTYPE_BYTES).index("bf16"),
                            key="calc_wdtype")
reserve_gib = g4.number_input("Activation reserve (GiB)", min_value=0.0, value=1.0, step=0.5, key="calc_reserve",
                              help="Memory for activations and buffers; an engine measures it by profiling.")
req_len = int(g5.number_input("Tokens per request", min_value=1, value=max_len, step=1, key="calc_reqlen"))
gpu = get_gpu(gpu_id) if gpu_id in GPUS else custom_gpu(float(custom_mem))
try:
    plan = plan_capacity(spec, gpu, kv_dtype=choice.kv_dtype, tp=choice.tp, block_size=block_size, gpu_util=util,
                         weight_dtype=weight_dtype, reserve_bytes=int(reserve_gib * GiB), max_len=req_len)
except KvsimError as exc:
    st.error(str(exc))
    plan = None
if plan is not None:
    k = st.columns(4)
    k[0].metric("KV budget", fmt_bytes(plan.kv_budget_bytes))
    k[1].metric("KV blocks", f"{plan.num_blocks:,}")
    k[2].metric("KV token capacity", f"{plan.kv_tokens:,}")
    k[3].metric(f"Max concurrency @ {req_len:,} tokens", f"{plan.max_concurrency:.2f}x")
    st.plotly_chart(capacity_figure(plan), width="stretch")
    st.code("\n".join(plan.vllm_log_lines()), language="text")
    st.caption(f"Weights estimated as {spec.num_params:,} parameters x {weight_dtype} / tp. The lines above are "
               "the planner's prediction in the form vLLM logs at start-up.")

st.subheader("Download")
table = per_sequence_table(spec, lens, kv_dtype=choice.kv_dtype, tp=choice.tp, block_size=block_size)
d1, d2 = st.columns(2)
d1.download_button("Per-sequence table (CSV)", table.to_csv(index=False), "kvsim_sequences.csv", "text/csv")
payload = {"usage": usage.to_dict(), "capacity": plan.to_dict() if plan else None, "block_size_sweep": sweep.to_dict("records")}
d2.download_button("Everything shown (JSON)", json.dumps(payload, indent=2, default=int), "kvsim_calc.json",
                   "application/json")
with st.expander("Per-sequence table"):
    st.dataframe(pd.DataFrame(table.head(1000)), hide_index=True)
