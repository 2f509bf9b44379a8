"""Strategies: the PagedAttention paper's Figure 2 replayed on a workload. Where the KV
memory goes (token states, reservation, internal and external fragmentation) under each
allocation strategy, a block-size sweep, preemptions and prefix-cache hits."""

from __future__ import annotations

import json
import math

import pandas as pd
import streamlit as st

from kvsim.errors import KvsimError
from kvsim.figures.strategies import (
    PAPER_SETTING, activity_figure, block_size_sweep_figure, fraction_figure, memory_breakdown_figure, summary_frame,
)
from kvsim.scheduler import SchedulerConfig
from kvsim.simulate import SimResult, run_strategies
from kvsim.strategies import PAPER_TOKEN_STATE_PERCENT
from kvsim.timeline import concat_timelines
from kvsim.units import GiB, fmt_bytes
from kvsim.workloads import PRESET_WORKLOADS, Workload
from ui.sidebar import current_model
from ui.workload_choice import (
    PRESET, SYNTHETIC, UPLOAD, WorkloadChoice, build_workload, sha256_of, upload_columns,
)

ALL_STRATEGIES = ("reserve-max", "pow2", "oracle", "paged", "paged+prefix")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SOURCES = {PRESET: "Preset (fitted stand-in)", SYNTHETIC: "Synthetic (your lengths)", UPLOAD: "Upload a trace"}
GIB_MODE, BLOCKS_MODE = "KV memory (GiB)", "Number of blocks"

choice = current_model()
spec = choice.spec

st.title("Strategies: where the KV memory goes")
st.caption(
    "The PagedAttention paper's Figure 2, replayed: one workload through a continuous-batching scheduler under each "
    "allocation strategy, with the same KV memory. Reservation strategies (Orca Max / Pow2 / Oracle) claim a "
    "contiguous slot range per request up front; paged (vLLM) takes fixed-size blocks as a sequence grows. "
    f"Model from the sidebar: {spec.name}, KV {choice.kv_dtype}, tp {choice.tp}."
)


# ----- cached runs (page layer; hashable arguments; the upload's bytes are keyed by their hash) ----

@st.cache_data(show_spinner=False, max_entries=16)
def _cached_workload(wc: WorkloadChoice, _data: bytes | None, max_len: int) -> Workload:
    return build_workload(wc, _data, max_len=max_len)


@st.cache_data(show_spinner=False, max_entries=64)
def _cached_sim(wc: WorkloadChoice, _data: bytes | None, spec_, kv_dtype: str, tp: int, strategy: str,
                block_size: int, num_blocks: int | None, kv_bytes: int | None, max_len: int,
                max_num_seqs: int, max_batched_tokens: int) -> SimResult:
    workload = _cached_workload(wc, _data, max_len)
    runs = run_strategies(workload, spec_, [strategy], block_size=block_size, kv_dtype=kv_dtype, tp=tp,
                          num_blocks=num_blocks, kv_memory_bytes=kv_bytes, max_len=max_len,
                          scheduler=SchedulerConfig(max_num_seqs, max_batched_tokens))
    return next(iter(runs.values()))


def _store_upload() -> None:
    f = st.session_state.get("strat_uploader")
    st.session_state["strat_upload"] = None if f is None else (f.name, f.getvalue())


# ----- workload ----------------------------------------------------------------------------------

st.subheader("Workload")
source = st.radio("Requests from", list(SOURCES), format_func=SOURCES.get, horizontal=True, key="strat_source")
upload = st.session_state.get("strat_upload")  # (name, bytes) or None
mapping = None
limit = None
preset, prompt_len, output_len, num_requests, seed = "sharegpt-like", "uniform:16:512", "uniform:16:512", 200, 0
c = st.columns(4)
if source == PRESET:
    preset = c[0].selectbox("Preset", list(PRESET_WORKLOADS), format_func=lambda k: PRESET_WORKLOADS[k].name,
                            key="strat_preset", help="Lognormal lengths with the paper's mean lengths; not the dataset.")
    num_requests = int(c[1].number_input("Requests", min_value=1, max_value=100_000, value=200, step=100,
                                         key="strat_n", help="A few hundred run in about a second."))
    seed = int(c[2].number_input("Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key="strat_seed"))
elif source == SYNTHETIC:
    prompt_len = c[0].text_input("Prompt lengths (tokens)", value="uniform:16:512", key="strat_prompt_len",
                                 help="N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA")
    output_len = c[1].text_input("Output lengths (tokens)", value="lognormal:256:0.8", key="strat_output_len",
                                 help="N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA")
    num_requests = int(c[2].number_input("Requests", min_value=1, max_value=100_000, value=200, step=100,
                                         key="strat_syn_n"))
    seed = int(c[3].number_input("Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key="strat_syn_seed"))
else:
    c[0].file_uploader("Trace (CSV or JSON lines)", type=["csv", "jsonl", "json", "txt"], key="strat_uploader",
                       on_change=_store_upload,
                       help="Azure (TIMESTAMP, ContextTokens, GeneratedTokens), Mooncake JSON lines, "
                            "ShareGPT-stats CSV, or any CSV with columns you map. Format detected from the content.")
    limit = int(c[1].number_input("First N requests", min_value=1, max_value=1_000_000, value=500, step=100,
                                  key="strat_limit", help="Long traces take longer: start small."))
    if upload is not None:
        c[2].caption(f"Loaded **{upload[0]}** ({fmt_bytes(len(upload[1]))}).")
        cols = upload_columns(upload[1])
        if cols is not None:
            st.caption("Not a known trace format: say which columns hold what.")
            m = st.columns(4)
            prompt_col = m[0].selectbox("Prompt tokens column", cols, key="strat_map_prompt")
            output_col = m[1].selectbox("Output tokens column", cols, index=min(1, len(cols) - 1), key="strat_map_output")
            arrival_col = m[2].selectbox("Arrival column", ["(none)"] + cols, key="strat_map_arrival")
            unit = m[3].selectbox("Arrival unit", ["s", "ms", "datetime"], key="strat_map_unit")
            mapping = (prompt_col, output_col, "" if arrival_col == "(none)" else arrival_col, unit)
    else:
        c[2].caption("No file yet.")

samples, beam, system_prompt = 1, 1, 0
if source != UPLOAD:
    with st.expander("Sharing: parallel sampling, beam search, a shared system prompt"):
        s = st.columns(3)
        samples = int(s[0].number_input("Parallel samples per request", min_value=1, max_value=64, value=1, step=1,
                                        key="strat_samples", help="n sequences share the prompt's blocks (fork)."))
        beam = int(s[1].number_input("Beam width", min_value=1, max_value=64, value=1, step=1, key="strat_beam",
                                     help="Beams share the prompt and re-fork as they go. Not with samples > 1."))
        system_prompt = int(s[2].number_input("Shared system prompt (tokens)", min_value=0, max_value=100_000,
                                              value=0, step=64, key="strat_system",
                                              help="Prepended to every prompt: paged+prefix reuses its blocks."))

a = st.columns([2, 1, 1])
arrival_modes = ["all-at-once", "poisson"] + (["trace"] if source == UPLOAD else [])
arrivals = a[0].radio("Arrivals", arrival_modes, horizontal=True, key="strat_arrivals",
                      format_func={"all-at-once": "all at once", "poisson": "Poisson", "trace": "trace timestamps"}.get)
rate = float(a[1].number_input("Rate (requests/s)", min_value=0.01, max_value=10_000.0, value=2.0, step=0.5,
                               key="strat_rate", disabled=arrivals != "poisson",
                               help="Arrival times placed at 0.02 s per engine step."))

# ----- memory, block size, strategies -----------------------------------------------------------

st.subheader("Memory and strategies")
bpt = spec.bytes_per_token(choice.kv_dtype, choice.tp)
m = st.columns([1.3, 1, 1, 1])
mem_mode = m[0].radio("Give the KV memory as", [GIB_MODE, BLOCKS_MODE], key="strat_mem_mode", horizontal=True)
if mem_mode == GIB_MODE:
    kv_gib = float(m[1].number_input("KV memory (GiB per GPU)", min_value=0.01, max_value=10_000.0, value=12.0,
                                     step=1.0, key="strat_kv_gib",
                                     help="The paper's setting: about 12 GiB of KV for OPT-13B on an A100-40GB."))
    num_blocks_in = None
else:
    num_blocks_in = int(m[1].number_input("Blocks", min_value=1, max_value=10_000_000, value=1000, step=100,
                                          key="strat_blocks", help="Reservation strategies get the same bytes."))
    kv_gib = None
block_size = int(m[2].selectbox("Block size (tokens)", BLOCK_SIZES, index=BLOCK_SIZES.index(16), key="strat_block"))
max_len = int(m[3].number_input("max_len (tokens)", min_value=1, max_value=10_000_000,
                                value=min(spec.max_position_embeddings or 2048, 4096), step=256, key="strat_max_len",
                                help="Longest sequence: what reserve-max reserves; longer requests are dropped."))
strategies = st.multiselect("Strategies", list(ALL_STRATEGIES), default=list(ALL_STRATEGIES), key="strat_strategies",
                            help="paged+prefix: paged with prefix caching (shared prompt blocks stored once).")
with st.expander("Scheduler and block-size sweep"):
    e = st.columns(3)
    max_num_seqs = int(e[0].number_input("Max running sequences", min_value=1, max_value=100_000, value=256, step=32,
                                         key="strat_max_seqs"))
    max_batched = int(e[1].number_input("Max tokens per step", min_value=1, max_value=10_000_000, value=8192,
                                        step=1024, key="strat_max_tokens"))
    sweep_sizes = e[2].multiselect("Sweep block sizes", list(BLOCK_SIZES), default=list(BLOCK_SIZES),
                                   key="strat_sweep", help="Paged, one replay per size, the same KV bytes.")

if kv_gib is not None:
    kv_bytes = int(math.floor(kv_gib * GiB))
    mem_text = f"{kv_gib:g} GiB of KV ({kv_bytes // (block_size * bpt):,} blocks of {block_size})"
else:
    kv_bytes = None
    mem_text = f"{num_blocks_in:,} blocks of {block_size} tokens ({fmt_bytes(num_blocks_in * block_size * bpt)})"

wc = WorkloadChoice(
    source=source, preset=preset, prompt_len=prompt_len, output_len=output_len, num_requests=num_requests, seed=seed,
    num_samples=samples, beam_width=beam, system_prompt_tokens=system_prompt, arrivals=arrivals, rate_per_s=rate,
    upload_name=upload[0] if upload else "", upload_sha256=sha256_of(upload[1]) if upload else "",
    mapping=mapping, limit=limit,
)
data = upload[1] if (upload and source == UPLOAD) else None
run_key = (wc, spec, choice.kv_dtype, choice.tp, kv_bytes, num_blocks_in, block_size, max_len, tuple(strategies),
           max_num_seqs, max_batched, tuple(sorted(sweep_sizes)))


def _run() -> dict:
    """Every strategy, then the sweep; returns what the page shows (kept in session state)."""
    if not strategies:
        raise KvsimError("choose at least one strategy")
    workload = _cached_workload(wc, data, max_len)
    sweep = sorted(sweep_sizes)
    total = len(strategies) + len(sweep)
    bar = st.progress(0.0, text="Starting...")
    common = dict(kv_dtype=choice.kv_dtype, tp=choice.tp, max_len=max_len, max_num_seqs=max_num_seqs,
                  max_batched_tokens=max_batched)
    results: dict[str, SimResult] = {}
    try:
        for i, name in enumerate(strategies):
            bar.progress(i / total, text=f"Replaying {len(workload):,} requests: {name} ({i + 1} of {total})")
            res = _cached_sim(wc, data, spec, strategy=name, block_size=block_size, num_blocks=num_blocks_in,
                              kv_bytes=kv_bytes, **common)
            results[res.label] = res
        # the sweep keeps the KV bytes fixed: blocks = bytes / (block size x bytes per token)
        sweep_bytes = kv_bytes if kv_bytes is not None else num_blocks_in * block_size * bpt
        rows = []
        for j, b in enumerate(sweep):
            k = len(strategies) + j
            bar.progress(k / total, text=f"Block-size sweep: {b} tokens per block ({k + 1} of {total})")
            rows.append(_cached_sim(wc, data, spec, strategy="paged", block_size=b, num_blocks=None,
                                    kv_bytes=sweep_bytes, **common).summary.to_dict())
    finally:
        bar.empty()
    return {
        "key": run_key, "results": results, "sweep": pd.DataFrame(rows) if rows else None,
        "workload": workload.description or workload.name, "stats": workload.stats(),
        "memory": mem_text, "block_size": block_size, "model": f"{spec.name}, KV {choice.kv_dtype}, tp {choice.tp}",
        "choice": wc.describe(), "max_len": max_len,
    }


clicked = st.button("Run", type="primary", key="strat_run")
if clicked or "strat_result" not in st.session_state:
    try:
        st.session_state["strat_result"] = _run()
    except KvsimError as exc:
        st.error(str(exc))
        if "strat_result" in st.session_state:
            st.caption("Showing the previous results below.")

shown = st.session_state.get("strat_result")
if shown is None:
    st.stop()
if shown["key"] != run_key:
    st.info("The inputs above changed since these results: press Run to replay.")

# ----- results -------------------------------------------------------------------------------------

results: dict[str, SimResult] = shown["results"]
summaries = {lb: r.summary.to_dict() for lb, r in results.items()}
stats = shown["stats"]
assumed = f"{shown['model']}; {shown['memory']}; max_len {shown['max_len']:,}; {stats['requests']:,} requests"
st.subheader("Results")
st.caption(f"Workload: {shown['workload']}.")

r = st.columns(4)
r[0].metric("Requests", f"{stats['requests']:,}")
r[1].metric("Mean prompt / output", f"{stats['mean_prompt_tokens']:,.0f} / {stats['mean_output_tokens']:,.0f} tokens")
r[2].metric("KV memory", shown["memory"].split(" (")[0],
            help=shown["memory"])
best = max(summaries, key=lambda lb: summaries[lb]["token_state_fraction"])
r[3].metric("Most memory holding tokens", f"{best}: {100 * summaries[best]['token_state_fraction']:.1f} %")

table = summary_frame(summaries)
st.plotly_chart(fraction_figure(table, assumed), width="stretch")
st.caption(
    "Each bar splits the KV memory in use (allocated + external fragmentation), averaged over the engine steps of the "
    "run, as the paper's Figure 2 does; black diamonds are the paper's token-state shares "
    + ", ".join(f"{PAPER_TOKEN_STATE_PERCENT[k]:g} % ({k})" for k in ("reserve-max", "pow2", "oracle", "paged"))
    + f" ({PAPER_SETTING}). Our workload is a stand-in, so expect the order, not the digits. Assumed: {assumed}."
)
st.dataframe(table, hide_index=True, width="stretch")
st.caption(
    "Token states / reservation / internal / external: step-averaged shares of the memory in use (they add to 100). "
    "'paper Fig. 2' is the paper's measured token-state share (" + PAPER_SETTING + "; paged+prefix has no paper "
    "number). Peak allocated is per GPU; preemptions count recompute preemptions; dropped requests can never fit "
    "(longer than max_len or the whole memory)."
)

st.plotly_chart(memory_breakdown_figure({lb: r.timeline for lb, r in results.items()}, assumed), width="stretch")
st.caption(
    "Stacked KV memory per engine step (GiB per GPU): token states at the bottom, then what reservations hold for "
    "tokens still to come, slots that will never be written (internal), free holes too small for the next request "
    "(external) and free memory. Long runs are averaged into at most 400 points per strategy. "
    f"Assumed: {assumed}."
)

st.subheader("Preemptions and prefix-cache hits")
prefix_labels = [lb for lb, s in summaries.items() if s["prefix_caching"]]
p = st.columns(max(2, len(prefix_labels) + 1))
p[0].metric("Preemptions (paged)", f"{summaries['paged']['preemptions']:,}" if "paged" in summaries else "not run",
            help="Recompute preemptions: a request whose next block does not fit is evicted and restarted later.")
for i, lb in enumerate(prefix_labels, start=1):
    s = summaries[lb]
    p[i].metric(f"Prefix-cache hit rate ({lb})", f"{100 * s['prefix_hit_rate']:.1f} %",
                help=f"{s['prefix_hit_blocks']:,} of {s['prefix_query_blocks']:,} prompt blocks served from the cache.")
if prefix_labels and all(summaries[lb]["prefix_hit_blocks"] == 0 for lb in prefix_labels):
    st.caption("No prompt block was shared: add a shared system prompt (Sharing, above) or upload a Mooncake trace "
               "(its hash ids mark shared prefixes) to see hits.")
st.plotly_chart(activity_figure({lb: r.timeline for lb, r in results.items()}, assumed), width="stretch")
st.caption(
    "Sequences in the running batch, cumulative preemptions and (for prefix caching) the share of prompt blocks "
    "found in the cache so far, per engine step. Hits include a preempted request finding its own prompt blocks "
    f"still cached when it is readmitted. Assumed: {assumed}."
)

sweep = shown["sweep"]
if sweep is not None and len(sweep):
    st.subheader("Block size")
    st.plotly_chart(block_size_sweep_figure(sweep, assumed, current_block_size=shown["block_size"]), width="stretch")
    st.caption(
        "Paged, one replay per block size with the same KV bytes: every sequence wastes only its last block's empty "
        "slots, which grow with the block size, so the token-state share falls and fewer sequences run at once; "
        "preemptions count requests evicted to make room (the paper picks 16: small blocks cost kernel efficiency, "
        f"which this memory simulation does not model). Assumed: {assumed}."
    )

st.subheader("Downloads")
d = st.columns(3)
d[0].download_button("Timelines (CSV)", concat_timelines({lb: r.timeline for lb, r in results.items()}).to_csv(index=False),
                     file_name="kvsim_strategies_timelines.csv", mime="text/csv", key="strat_dl_tl")
payload = {"workload": shown["workload"], "model": shown["model"], "memory": shown["memory"],
           "max_len": shown["max_len"], "summaries": summaries}
d[1].download_button("Summaries (JSON)", json.dumps(payload, indent=2, default=str), file_name="kvsim_strategies.json",
                     mime="application/json", key="strat_dl_json")
if sweep is not None and len(sweep):
    d[2].download_button("Block-size sweep (CSV)", sweep.to_csv(index=False), file_name="kvsim_block_sweep.csv",
                         mime="text/csv", key="strat_dl_sweep")
