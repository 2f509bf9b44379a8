"""Live: a small Llama-style model decoding through a real paged KV cache, measured beside the
calculator's prediction and a contiguous max-length baseline."""

from __future__ import annotations

import json

import streamlit as st
import torch

import kernels
from kvsim.errors import KvsimError
from kvsim.figures.live import activity_figure, kv_timeline_figure, step_time_figure
from kvsim.live import EngineConfig, LIVE_SIZES, LiveSettings, default_num_blocks, run_live, scaled_config
from kvsim.live.requests import WORKLOAD_KINDS, make_workload, prepare_requests
from kvsim.units import fmt_bytes
from ui.sidebar import current_model

choice = current_model()
spec = choice.spec
has_cuda = torch.cuda.is_available()
gpu_triton = has_cuda and kernels.triton_mode() == "triton"

st.title("Live: a real paged KV cache, measured")
st.caption(
    f"A Llama-style decoder (RMSNorm, rotary, GQA, SwiGLU) with seeded random weights, shaped like {spec.name} "
    "scaled down, decodes greedily through a paged KV pool (with several samples per request, the prompt is "
    "forked and the extra samples sample with seeded generators): the block pool decides admission, block "
    "tables, prefix hits, copy-on-write and preemption; K/V are written and read by the paged-attention kernels. "
    "The cache is poisoned (NaN) where it holds nothing, so its usage is counted from the tensor itself and set "
    "beside the calculator's prediction from the sequence lengths and the sharing structure alone. The same "
    "requests then run with one max-length reservation each."
)

c = st.columns(4)
size = c[0].selectbox("Model size", list(LIVE_SIZES), key="live_size",
                      format_func=lambda k: f"{k} (1/{LIVE_SIZES[k]} of {spec.name})",
                      help="Layers, KV heads and head_dim divided by the same number; the GQA group and MLP ratio kept.")
devices = (["cuda", "cpu"] if has_cuda else ["cpu"])
device = c[1].selectbox("Device", devices, key="live_device", help="CUDA appears only where torch sees a GPU.")
backends = ["triton", "torch"] if (device == "cuda" and gpu_triton) else ["torch"]
backend = c[2].selectbox("Attention backend", backends, key="live_backend",
                         help="triton: the compiled kernels (GPU only); torch: the reference kernels.")
dtypes = ["fp32", "bf16", "fp16"] if device == "cuda" else ["fp32"]
dtype = c[3].selectbox("Precision", dtypes, key="live_dtype",
                       help="Model and KV cache precision (fp32 makes the greedy tokens comparable exactly).")

c = st.columns(4)
block_size = c[0].selectbox("Block size (tokens)", [8, 16, 32, 64], index=1, key="live_block")
max_num_seqs = int(c[1].number_input("Max running sequences", 1, 256, 8, key="live_max_seqs"))
auto_pool = c[2].checkbox("Pool fits the workload", value=True, key="live_auto_pool",
                          help="Size the pool for the max running sequences at their longest; untick to set it "
                               "(too small a pool preempts, it does not crash).")
num_blocks_in = int(c[3].number_input("Pool size (blocks)", 1, 1_000_000, 12, key="live_blocks",
                                      disabled=auto_pool))

c = st.columns(4)
workload_kind = c[0].selectbox("Workload", list(WORKLOAD_KINDS), key="live_workload")
num_requests = int(c[1].number_input("Requests", 1, 10_000, 12, key="live_requests"))
prompt_len = c[2].text_input("Prompt lengths", "uniform:16:64", key="live_prompt", disabled=workload_kind != "synthetic",
                             help="N, fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA")
output_len = c[3].text_input("Output lengths", "uniform:16:64", key="live_output", disabled=workload_kind != "synthetic")
c = st.columns(5)
shared_prefix = int(c[0].number_input("Shared prompt prefix (tokens)", 0, 100_000, 0, key="live_prefix",
                                      help="A system prompt every request starts with; the prefix cache shares it."))
arrivals = c[1].text_input("Arrivals", "all-at-once", key="live_arrivals", help="all-at-once or poisson:RATE (per s)")
max_len = int(c[2].number_input("Max length (tokens)", 2, 65_536, 256, key="live_max_len",
                                help="Longest request (lengths are scaled to fit) and the contiguous reservation."))
prefix_caching = c[3].checkbox("Prefix caching", value=True, key="live_prefix_caching")
num_samples = int(c[4].number_input("Samples per request", 1, 64, 1, key="live_samples",
                                    help="Parallel sampling: the prompt is prefilled once and forked; the samples "
                                         "share its blocks copy-on-write (sample 0 greedy, the others seeded "
                                         "sampling). They count against the max running sequences together."))


def _settings():
    workload = make_workload(workload_kind, num_requests=num_requests, prompt=prompt_len, output=output_len,
                             arrivals=arrivals, shared_prefix=shared_prefix, seed=0, num_samples=num_samples)
    model = scaled_config(spec, size)
    settings = LiveSettings(model=model, engine=EngineConfig(block_size=block_size, num_blocks=1,
                            max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching, backend=backend),
                            dtype=dtype, device=device, max_len=max_len)
    if auto_pool:
        prepared = prepare_requests(workload, max_len=max_len, vocab_size=model.vocab_size)
        blocks = default_num_blocks(prepared, block_size, max_num_seqs)
    else:
        blocks = num_blocks_in
    from dataclasses import replace

    return workload, replace(settings, engine=replace(settings.engine, num_blocks=blocks))


if st.button("Run", type="primary", key="live_run"):
    bar = st.progress(0.0, text="starting")
    try:
        workload, settings = _settings()
        result = run_live(workload, settings, progress=lambda f, msg: bar.progress(min(1.0, f), text=msg))
        st.session_state["live_result"] = result
        st.session_state["live_settings"] = settings
        bar.progress(1.0, text="done")
    except KvsimError as exc:
        bar.empty()
        st.error(str(exc))

result = st.session_state.get("live_result")
if result is None:
    st.info("Choose the settings and press Run (the defaults take a few seconds on a CPU).")
    st.stop()

settings = st.session_state["live_settings"]
s = result.summary
cfg = settings.model
assumed = (f"{cfg.name}: {cfg.num_layers} layers, {cfg.num_heads} q / {cfg.num_kv_heads} KV heads x {cfg.head_dim}, "
           f"{s['dtype']} on {s['device']} ({s['backend']}); block {settings.engine.block_size}, "
           f"pool {settings.engine.num_blocks} blocks")

m = st.columns(4)
m[0].metric("Peak KV, measured", fmt_bytes(s["measured_peak_kv_bytes"]),
            help="Blocks holding written K/V, counted from the poisoned tensor.")
m[1].metric("Peak KV, predicted", fmt_bytes(s["predicted_peak_kv_bytes"]),
            help="The calculator, given only each step's sequence lengths.")
m[2].metric("Worst step difference", f"{s['max_step_error_bytes']:,} B",
            help="Largest |measured - predicted| over all steps (blocks in use and written K/V).")
cont = s.get("contiguous") or {}
m[3].metric("Peak KV, contiguous", fmt_bytes(cont["measured_peak_kv_bytes"]) if cont else "-",
            help=f"Max-length reservations of {settings.max_len} tokens, measured from the tensors.")
m = st.columns(4)
err = s["max_abs_error"]
m[0].metric("Max |paged - dense| attention", "not checked" if err != err else f"{err:.1e}",
            help=f"Over {s['checked_steps']} sampled steps, all layers, against attention on contiguous K/V.")
m[1].metric("Tokens match contiguous", "-" if s["tokens_match"] is None else ("yes" if s["tokens_match"] else "NO"))
m[2].metric("Preemptions", f"{s['preemptions']:,}")
m[3].metric("Finished requests", f"{s['finished']} / {s['requests']}")
m = st.columns(4)
m[0].metric("Throughput", f"{s['tokens_per_s']:,.0f} tok/s")
m[1].metric("TTFT p50 / p99", f"{s['ttft_p50_ms']:,.0f} / {s['ttft_p99_ms']:,.0f} ms")
m[2].metric("TPOT p50 / p99", f"{s['tpot_p50_ms']:,.1f} / {s['tpot_p99_ms']:,.1f} ms")
m[3].metric("Prefix-cache hits", f"{s['prefix_hit_blocks']:,} blocks")
if s["samples_per_request"] > 1:
    m = st.columns(4)
    m[0].metric("Samples per request", f"{s['samples_per_request']}")
    m[1].metric("Copy-on-write copies", f"{s['cow_copies']:,}",
                help="Shared, partly filled prompt blocks copied at a sample's first append (kernels.copy_blocks).")

st.plotly_chart(kv_timeline_figure(result.timeline, assumed), width="stretch")
st.caption(
    "Per engine step: blocks holding written K/V (solid blue, counted from the NaN-poisoned pool) beside the "
    "calculator's allocated bytes for the same sequence lengths (dotted), the written K/V itself (green), and the "
    f"contiguous engine's reservations of {settings.max_len} tokens per request (orange). Free blocks kept by the "
    f"prefix cache are not counted. Assumed: {assumed}."
)
st.plotly_chart(activity_figure(result.timeline, assumed), width="stretch")
st.caption(
    f"Running sequences and waiting requests per step (FCFS admission, at most {settings.engine.max_num_seqs} "
    "sequences running; a request's samples count one each), and "
    "preemptions by recompute of the newest request when the pool runs out of blocks. Assumed: " + assumed + "."
)

if s["device"].startswith("cuda"):
    from kvsim.costmodel import CostModel, compare_step_times
    from kvsim.gpus import GPUS

    name = torch.cuda.get_device_name().lower()
    match = next((k for k, g in GPUS.items() if k.split("-")[0] in name), None)
    gpu_id = st.selectbox("GPU for the cost model", list(GPUS), index=list(GPUS).index(match) if match else 0,
                          key="live_cost_gpu")
    model = CostModel(cfg.to_spec(), GPUS[gpu_id], kv_dtype=s["dtype"], weight_dtype="fp32" if s["dtype"] == "fp32"
                      else "bf16", weight_params=cfg.num_params)
    compare = compare_step_times(model, result.paged.batches)
    st.plotly_chart(step_time_figure(compare, model.describe()), width="stretch")
    st.caption("Each measured step time beside the roofline cost model's lower bound for the same batch and "
               "context lengths. A tiny model is far from the roofline: launch and Python overheads dominate. "
               f"Assumed: {model.describe()}.")
else:
    st.caption("The step-time comparison with the cost model is shown only for CUDA runs: the cost model describes "
               "a GPU's bandwidth and tensor-core throughput, which a CPU run does not exercise.")

st.subheader("Run record")
st.json(s["record"], expanded=False)
from kvsim.cli.live import jsonable  # noqa: E402  (plain-Python helper, no argparse side effects)

d = st.columns(2)
d[0].download_button("Timeline (CSV)", result.timeline.to_csv(index=False), file_name="live_timeline.csv",
                     mime="text/csv", key="live_dl_csv")
d[1].download_button("Record (JSON)", json.dumps(jsonable(s), indent=2), file_name="live_record.json",
                     mime="application/json", key="live_dl_json")
