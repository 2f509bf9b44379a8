"""Engine: a running serving engine's measured KV usage beside the planner's prediction."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from kvsim.calculator import kv_usage
from kvsim.capacity import DEFAULT_GPU_UTIL, plan_capacity
from kvsim.engine import (
    ENGINE_LABELS, Scrape, check_url, compare_log_with_plan, parse_vllm_log, plan_for_log, scrape,
    scrapes_to_timeline,
)
from kvsim.engine.sample import SAMPLE_LABEL, SAMPLE_VLLM_LOG, sample_scrapes
from kvsim.errors import KvsimError
from kvsim.figures.engine import capacity_ratio_figure, engine_kv_figure, engine_rates_figure, engine_requests_figure
from kvsim.gpus import GPUS, get_gpu
from kvsim.units import fmt_bytes
from ui.sidebar import current_model

choice = current_model()
spec = choice.spec
ss = st.session_state
ss.setdefault("eng_scrapes", [])
ss.setdefault("eng_running", False)
ss.setdefault("eng_error", None)

st.title("Serving engine")
st.caption(
    "Point kvsim at a running vLLM, SGLang or TensorRT-LLM server's Prometheus endpoint and watch its real KV "
    "usage, queue and preemptions beside what the planner predicts for the sidebar's model on the GPU you pick."
)


@st.cache_data(show_spinner=False)
def _sample() -> list[Scrape]:
    return sample_scrapes()


# ----- controls ----------------------------------------------------------------------------
c1, c2, c3, c4 = st.columns([3, 1, 1, 1])
url = c1.text_input("Metrics URL", value="http://localhost:8000/metrics", key="eng_url",
                    help="vLLM and SGLang: /metrics (a URL without a path gets /metrics); "
                         "trtllm-serve: /prometheus/metrics; Triton: port 8002, /metrics.")
interval_s = float(c2.number_input("Interval (s)", min_value=0.5, max_value=60.0, value=2.0, step=0.5, key="eng_interval"))
timeout_s = float(c3.number_input("Timeout (s)", min_value=0.2, max_value=30.0, value=3.0, step=0.5, key="eng_timeout"))
max_samples = int(c4.number_input("Keep samples", min_value=10, max_value=5000, value=300, step=10, key="eng_keep"))

g1, g2, g3 = st.columns([2, 1, 1])
gpu_id = g1.selectbox("GPU the engine runs on", list(GPUS), index=list(GPUS).index("h100-80gb"), key="eng_gpu",
                      format_func=lambda k: GPUS[k].name)
util_in = float(g2.number_input("gpu_memory_utilization (0 = the engine's)", min_value=0.0, max_value=1.0,
                                value=0.0, step=0.05, key="eng_util"))
assumed_tokens = int(g3.number_input("Assumed tokens per running request", min_value=1, max_value=10_000_000,
                                     value=1024, step=256, key="eng_assumed",
                                     help="For the 'predicted for running requests' line: each running request "
                                          "is assumed to hold this many tokens."))

b1, b2, b3, _ = st.columns([1, 1, 1, 5])
if b1.button("Start", type="primary", key="eng_start"):
    try:
        checked = check_url(url)
        if ss.get("eng_polled_url") != checked:
            ss["eng_scrapes"] = []
        ss.update(eng_running=True, eng_error=None, eng_polled_url=checked)
        if not ss["eng_scrapes"]:
            ss["eng_t0"] = time.monotonic()
    except KvsimError as exc:
        ss["eng_error"] = str(exc)
if b2.button("Stop", key="eng_stop"):
    ss["eng_running"] = False
if b3.button("Clear", key="eng_clear"):
    ss.update(eng_scrapes=[], eng_running=False, eng_error=None)

if ss["eng_error"]:
    st.error(ss["eng_error"])


def _plan(block_size: int, engine_util: float | None):
    util = util_in or engine_util or DEFAULT_GPU_UTIL
    try:
        return plan_capacity(spec, get_gpu(gpu_id), kv_dtype=choice.kv_dtype, tp=choice.tp,
                             block_size=block_size, gpu_util=util)
    except KvsimError as exc:
        st.warning(f"No planner prediction: {exc}")
        return None


def _view(scrapes: list[Scrape], measured: bool) -> None:
    last = scrapes[-1].snapshot
    block_size = last.block_size or 16
    bpt = spec.bytes_per_token(choice.kv_dtype, choice.tp)
    timeline = scrapes_to_timeline(scrapes, bytes_per_token=bpt, source="measured" if measured else "example")
    per_request = kv_usage(spec, [assumed_tokens], kv_dtype=choice.kv_dtype, tp=choice.tp,
                           block_size=block_size).allocated_bytes
    engines = max(1, len(last.engine_ids))
    timeline["predicted_kv_bytes"] = timeline["running"] * per_request / engines
    plan = _plan(block_size, last.gpu_memory_utilization)
    label = ENGINE_LABELS[last.engine] + ("" if measured else f" - {SAMPLE_LABEL}")

    m = st.columns(5)
    m[0].metric("KV usage", "n/a" if last.kv_usage_fraction is None else f"{last.kv_usage_fraction:.1%}")
    m[1].metric("Running", "n/a" if last.num_running is None else f"{last.num_running:,}")
    m[2].metric("Waiting", "n/a" if last.num_waiting is None else f"{last.num_waiting:,}")
    rate = timeline["preemptions_per_s"].iloc[-1]
    m[3].metric("Preemptions / s", "n/a" if pd.isna(rate) else f"{rate:.2f}")
    hit = timeline["prefix_hit_rate"].iloc[-1]
    m[4].metric("Prefix hit rate", "n/a" if pd.isna(hit) else f"{hit:.1%}")

    engine_cap = timeline["capacity_bytes"].iloc[-1] if "capacity_bytes" in timeline else None
    planner_cap = plan.kv_tokens * bpt if plan is not None else None
    fig = engine_kv_figure(timeline, engine_capacity_bytes=None if pd.isna(engine_cap) else engine_cap,
                           predicted_capacity_bytes=planner_cap,
                           title=f"KV cache: {label}")
    st.plotly_chart(fig, width="stretch")
    plan_text = (f"planner capacity = {spec.name} on {GPUS[gpu_id].name} at utilization {plan.gpu_util:g}, block "
                 f"{plan.block_size}, KV {choice.kv_dtype}, tp {choice.tp}, 1 GiB reserve assumed"
                 if plan is not None else "no planner capacity")
    st.caption(
        f"Engine's used KV (usage x its capacity) in bytes of {spec.name} ({fmt_bytes(bpt)}/token, sidebar dtype and tp), "
        f"per engine; {plan_text}; 'predicted for running requests' assumes {assumed_tokens:,} tokens each."
        + ("" if measured else " Example data, not a measurement.")
    )
    r1, r2 = st.columns(2)
    r1.plotly_chart(engine_requests_figure(timeline, title=f"Requests: {label}"), width="stretch")
    r1.caption("Running batch and queue as the engine reports them at each scrape.")
    r2.plotly_chart(engine_rates_figure(timeline, title=f"Preemptions and prefix hits: {label}"),
                    width="stretch")
    r2.caption("Counters turned into rates over each interval (vLLM's prefix counters count tokens); engines "
               "that publish a hit-rate gauge instead are shown as reported.")

    st.subheader("Cache configuration: engine vs planner")
    rows = [
        ("block size (tokens)", last.block_size, plan.block_size if plan else None),
        ("KV blocks per engine", last.blocks_per_engine, plan.num_blocks if plan else None),
        ("KV tokens per engine", None if last.kv_capacity_tokens is None else last.kv_capacity_tokens // engines,
         plan.kv_tokens if plan else None),
        ("gpu_memory_utilization", last.gpu_memory_utilization, plan.gpu_util if plan else None),
        ("KV cache dtype", last.cache_dtype, choice.kv_dtype),
        ("prefix caching", last.enable_prefix_caching, None),
        ("engines behind the endpoint", engines, None),
    ]
    table = pd.DataFrame(rows, columns=["setting", "engine", "planner"]).astype(str).replace("None", "not reported")
    st.dataframe(table, hide_index=True, width="stretch")
    with st.expander("Measured timeline"):
        st.dataframe(timeline, hide_index=True, width="stretch")


@st.fragment(run_every=interval_s if ss["eng_running"] else None)
def live() -> None:
    if ss["eng_running"]:
        try:
            snap = scrape(ss["eng_polled_url"], timeout_s=timeout_s)
        except KvsimError as exc:
            ss.update(eng_running=False, eng_error=f"{exc} (polling stopped)")
            st.rerun()
        else:
            kept = ss["eng_scrapes"] + [Scrape(time.monotonic() - ss["eng_t0"], snap)]
            ss["eng_scrapes"] = kept[-max_samples:]
    scrapes = ss["eng_scrapes"]
    if scrapes:
        status = "polling every %g s" % interval_s if ss["eng_running"] else "stopped"
        st.success(f"{len(scrapes)} scrape(s) from {ss.get('eng_polled_url')} ({status}).")
        _view(scrapes, measured=True)
    else:
        st.info(
            "No engine polled yet. Start one and press Start: `vllm serve MODEL` exposes /metrics on port 8000; "
            "SGLang `python -m sglang.launch_server --model-path MODEL --enable-metrics` on port 30000; "
            "`trtllm-serve MODEL` at /prometheus/metrics. Until then the view shows a "
            f"{SAMPLE_LABEL}."
        )
        _view(_sample(), measured=False)


live()

# ----- start-up log -----------------------------------------------------------------------
st.subheader("vLLM start-up log")
st.caption("Paste the lines vLLM prints at start-up ('GPU KV cache size', '# GPU blocks', 'Maximum concurrency ...'); "
           "they are compared with the planner for the sidebar's model on the GPU above.")


def _load_example() -> None:
    st.session_state["eng_log"] = SAMPLE_VLLM_LOG


st.text_area("Start-up log", key="eng_log", height=160, placeholder="INFO ... GPU KV cache size: 435,200 tokens")
l1, l2, _ = st.columns([1, 1, 4])
compare = l1.button("Compare with the planner", key="eng_compare")
l2.button("Load example log", key="eng_example", on_click=_load_example)
if compare:
    try:
        log = parse_vllm_log(ss.get("eng_log") or "")
        plan = plan_for_log(log, spec, get_gpu(gpu_id), kv_dtype=choice.kv_dtype, tp=choice.tp,
                            gpu_util=util_in or None)
        ss["eng_log_result"] = (log, plan, compare_log_with_plan(log, plan))
    except KvsimError as exc:
        st.error(str(exc))
if ss.get("eng_log_result"):
    log, plan, rows = ss["eng_log_result"]
    st.dataframe(pd.DataFrame([r.to_dict() for r in rows]), hide_index=True, width="stretch")
    st.plotly_chart(capacity_ratio_figure([r.quantity for r in rows], [r.ratio for r in rows]),
                    width="stretch")
    st.caption(
        f"Engine's figures from the log over the planner's for {plan.model} on {plan.gpu} at utilization "
        f"{plan.gpu_util:g}, block {plan.block_size}, KV {plan.kv_dtype}, tp {plan.tp}, 1 GiB reserve and "
        "weights estimated from the parameter count (assumed); 1.0 means the prediction matches."
        + (f" The log names {log.model}." if log.model else "")
    )
