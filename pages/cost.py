"""Cost: what paging does not remove. Step time, throughput and latency from a roofline
cost model, and the rate sweep."""

from __future__ import annotations

import streamlit as st

from kvsim.capacity import WEIGHT_DTYPE_BYTES, plan_capacity
from kvsim.costmodel import (
    CostModel, batch_sweep, context_sweep, intensity_grid, roofline_boundary,
)
from kvsim.errors import KvsimError
from kvsim.figures.cost import batch_cost_figure, context_cost_figure, rate_sweep_figure, roofline_figure
from kvsim.gpus import GPUS, custom_gpu, get_gpu
from kvsim.ratesweep import (
    DEFAULT_LATENCY_FACTOR, DEFAULT_STRATEGIES, PAPER_HEADLINE, PAPER_SOURCE, RateSweepResult, rate_sweep,
)
from kvsim.units import fmt_bytes
from kvsim.workloads import PRESET_WORKLOADS, preset_workload
from ui.sidebar import current_model

CUSTOM_GPU = "custom"

choice = current_model()
spec = choice.spec

st.title("Cost: what paging does not remove")
st.caption(
    "Paging fixes allocation, not attention's cost: every decode step still reads each sequence's whole KV "
    "cache and the weights once. A roofline model turns a step's bytes and FLOPs into time "
    "(max(bytes / bandwidth, FLOPs / throughput) for the linear layers, plus the same for attention): "
    "a lower bound at the GPU's published peaks unless you lower the efficiencies."
)

c = st.columns([2, 1, 1, 1])
gpu_id = c[0].selectbox("GPU", list(GPUS) + [CUSTOM_GPU], index=0, key="cost_gpu",
                        format_func=lambda k: GPUS[k].name if k in GPUS else "custom (set by hand)")
weight_dtype = c[1].selectbox("Weight dtype", list(WEIGHT_DTYPE_BYTES), index=list(WEIGHT_DTYPE_BYTES).index("bf16"),
                              key="cost_wdtype")
bw_eff = c[2].number_input("Bandwidth efficiency", min_value=0.05, max_value=1.0, value=1.0, step=0.05,
                           key="cost_bw_eff", help="Fraction of peak bandwidth kernels reach (1 = roofline bound).")
fl_eff = c[3].number_input("Compute efficiency", min_value=0.05, max_value=1.0, value=1.0, step=0.05,
                           key="cost_fl_eff", help="Fraction of peak 16-bit tensor throughput reached.")
if gpu_id == CUSTOM_GPU:
    g = st.columns(3)
    mem = g[0].number_input("Memory (GiB)", min_value=1.0, value=80.0, key="cost_mem")
    bw = g[1].number_input("Bandwidth (GB/s)", min_value=1.0, value=2000.0, key="cost_bw")
    tf = g[2].number_input("16-bit throughput (TFLOP/s)", min_value=0.1, value=300.0, key="cost_tf")

default_max_ctx = min(spec.max_position_embeddings or 32768, 131072)
c = st.columns(3)
batch_for_context = int(c[0].number_input("Batch for the context chart (sequences)", min_value=1, max_value=4096,
                                          value=8, step=1, key="cost_batch"))
context_for_batch = int(c[1].number_input("Context for the batch chart (tokens)", min_value=1, max_value=10_000_000,
                                          value=min(1024, default_max_ctx), step=128, key="cost_context"))
max_context = int(c[2].number_input("Longest context to chart (tokens)", min_value=2, max_value=10_000_000,
                                    value=default_max_ctx, step=1024, key="cost_max_ctx"))


def _build():
    gpu = get_gpu(gpu_id) if gpu_id != CUSTOM_GPU else custom_gpu(float(mem), float(bw), float(tf))
    model = CostModel(spec, gpu, kv_dtype=choice.kv_dtype, weight_dtype=weight_dtype, tp=choice.tp,
                      bandwidth_efficiency=float(bw_eff), compute_efficiency=float(fl_eff))
    contexts = sorted({min(max_context, 1 << k) for k in range(7, 40) if (1 << (k - 1)) < max_context}
                      | {max_context})
    try:
        plan = plan_capacity(spec, gpu, kv_dtype=choice.kv_dtype, tp=choice.tp, weight_dtype=weight_dtype,
                             max_len=context_for_batch)
        max_batch = int(plan.max_concurrency)
        capacity_note = None
    except KvsimError as exc:
        plan, max_batch, capacity_note = None, None, str(exc)
    return model, contexts, plan, max_batch, capacity_note


try:
    model, contexts, plan, max_batch, capacity_note = _build()
    st.session_state["cost_last"] = (model, contexts, plan, max_batch, capacity_note)
except KvsimError as exc:
    st.error(str(exc))
    if "cost_last" not in st.session_state:
        st.stop()
    model, contexts, plan, max_batch, capacity_note = st.session_state["cost_last"]
    st.caption("Showing the last valid input.")

assumed = model.describe()
boundary = roofline_boundary(model, context_for_batch)
one = model.step_cost(decode_context=[context_for_batch])

m = st.columns(3)
m[0].metric("Weights read per step", fmt_bytes(one.weight_bytes), help=f"{one.weight_bytes:,} bytes per rank")
m[1].metric("KV read per token of context", fmt_bytes(spec.bytes_per_token(model.kv_dtype, model.tp)),
            help="Every decode step reads this much per token already in the sequence's cache.")
m[2].metric("GPU ridge point", f"{boundary.ridge_point:,.0f} FLOP/B",
            help="Peak FLOP/s over peak bandwidth: steps with fewer FLOPs per byte are memory-bound.")
m = st.columns(3)
m[0].metric("Linear layers compute-bound from", "never" if boundary.linear_ridge_tokens is None
            else f"{boundary.linear_ridge_tokens:,} tokens", help="Tokens per step (decode sequences + prefill tokens).")
m[1].metric("Decode attention intensity", f"{boundary.attention_intensity:,.1f} FLOP/B",
            help="FLOPs per KV byte of one decode token: about 2 x q heads / (KV heads x KV dtype bytes).")
m[2].metric("One decode step, batch 1", f"{1e3 * one.time_s:,.2f} ms",
            help=f"At {context_for_batch:,} tokens: {one.bound}-bound; attention {100 * one.attention_share:.1f} % of it.")
if capacity_note:
    st.warning(f"Memory: {capacity_note}. The time model below still applies per step.")
elif plan is not None:
    st.caption(f"KV memory ({plan.gpu_util:g} of {model.gpu.name}, {fmt_bytes(plan.weights_bytes)} of weights, "
               f"1 GiB reserve): {plan.kv_tokens:,} tokens, at most {max_batch:,} sequences of {context_for_batch:,} "
               f"tokens at once.")

# 1. KV bytes read and attention share versus context
df_ctx = context_sweep(model, contexts, batch_size=batch_for_context)
st.plotly_chart(context_cost_figure(df_ctx, f"{assumed}; decode batch {batch_for_context:,}"),
                width="stretch")
st.caption(
    f"A decode step of {batch_for_context:,} sequences, all at the context on the x axis: KV bytes read grow "
    f"linearly with context (a sliding layer stops at its window), the weights stay {fmt_bytes(one.weight_bytes)}. "
    f"Assumed: {assumed}."
)

# 2. batch size versus throughput and per-token latency
top = max(1024, 2 * (max_batch or 0))
batches = [b for b in (1 << k for k in range(0, 20)) if b <= top]
df_b = batch_sweep(model, batches, context_for_batch, max_batch_in_memory=max_batch)
st.plotly_chart(batch_cost_figure(df_b, f"{assumed}; context {context_for_batch:,} tokens",
                                  max_batch_in_memory=max_batch, ridge_batch=boundary.step_ridge_batch),
                width="stretch")
st.caption(
    f"Decode steps of growing batches, every sequence at {context_for_batch:,} tokens: one token per sequence per "
    f"step, so throughput = batch / step time and the per-token latency is the step time. "
    + ("Beyond the dotted line the KV cache does not fit. " if max_batch else "")
    + f"Assumed: {assumed}."
)

# 3. the memory-bound / compute-bound boundary
grid_ctx = sorted({min(c, max_context) for c in (128, context_for_batch, max_context)})
grid = intensity_grid(model, batches, grid_ctx)
st.plotly_chart(roofline_figure(grid, model.ridge_point, model.bandwidth_bytes_per_s, model.flops_per_s,
                                f"{assumed}; decode batches {batches[0]}-{batches[-1]:,}"),
                width="stretch")
if boundary.step_ridge_batch is None:
    verdict = (f"At {context_for_batch:,} tokens no decode batch reaches the ridge: each sequence adds KV bytes as fast "
               f"as FLOPs, so decode stays memory-bound however large the batch.")
else:
    verdict = (f"At {context_for_batch:,} tokens a decode batch of about {boundary.step_ridge_batch:,.0f} sequences "
               f"reaches the ridge.")
st.caption(
    f"Each point is a decode step (batch in the hover) placed by its FLOPs per byte and modelled FLOP/s; the roof is "
    f"min(intensity x bandwidth, peak FLOP/s). The linear layers alone turn compute-bound at "
    f"{'no batch' if boundary.linear_ridge_tokens is None else f'{boundary.linear_ridge_tokens:,} tokens per step'}; "
    f"decode attention sits at {boundary.attention_intensity:,.1f} FLOP/B. {verdict} Assumed: {assumed}."
)

# 4. the rate sweep: normalized latency versus request rate per strategy
st.subheader("Rate sweep: where each strategy's latency explodes")
st.caption(
    "The PagedAttention paper's Figure 12: a workload replayed at growing request rates (Poisson arrivals) through "
    "the scheduler with the cost model above as its clock, under each memory strategy with the same KV memory. "
    "Normalized latency is each request's end-to-end latency over its output length, averaged."
)
r = st.columns([1, 1, 2, 1, 1])
preset = r[0].selectbox("Workload", list(PRESET_WORKLOADS), key="cost_rs_workload",
                        format_func=lambda k: PRESET_WORKLOADS[k].name)
num_requests = int(r[1].number_input("Requests per rate", min_value=10, max_value=20_000, value=300, step=50,
                                     key="cost_rs_requests"))
rates_text = r[2].text_input("Request rates (req/s, comma-separated)", value="0.5, 1, 1.5, 2, 3, 4, 6",
                             key="cost_rs_rates")
rs_max_len = int(r[3].number_input("max_len (tokens)", min_value=16, max_value=1_000_000,
                                   value=min(spec.max_position_embeddings or 2048, 4096), step=256, key="cost_rs_max_len",
                                   help="The model's context for a request: what reserve-max reserves up front."))
bound_ms = float(r[4].number_input("Latency bound (ms/token, 0 = auto)", min_value=0.0, value=0.0, step=10.0,
                                   key="cost_rs_bound",
                                   help=f"Auto: {DEFAULT_LATENCY_FACTOR:g}x the unloaded normalized latency."))
strategies = st.multiselect("Strategies", list(DEFAULT_STRATEGIES), default=list(DEFAULT_STRATEGIES),
                            key="cost_rs_strategies")


@st.cache_data(show_spinner=False, max_entries=8)
def _cached_sweep(model: CostModel, preset: str, num_requests: int, rates: tuple, strategies: tuple,
                  max_len: int, bound_s: float | None) -> RateSweepResult:
    workload = preset_workload(preset, num_requests, max_len=max_len, seed=0)
    return rate_sweep(workload, model, rates, strategies, max_len=max_len, latency_bound_s=bound_s)


def _parse_rates(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.replace(";", ",").split(",") if x.strip())
    except ValueError:
        raise KvsimError(f"request rates must be numbers separated by commas, got {text!r}") from None
    if not values or any(not v > 0 or v == float("inf") for v in values):
        raise KvsimError(f"request rates must be positive numbers, got {text!r}")
    return values


if st.button("Run the rate sweep", key="cost_rs_run", type="primary"):
    try:
        with st.spinner("Replaying the workload at each rate..."):
            st.session_state["cost_rs_result"] = _cached_sweep(
                model, preset, num_requests, _parse_rates(rates_text), tuple(strategies), rs_max_len,
                bound_ms / 1e3 if bound_ms > 0 else None)
    except KvsimError as exc:
        st.error(str(exc))

result = st.session_state.get("cost_rs_result")
if result is None:
    st.info("Set the workload and rates, then run the sweep (a few seconds for a few hundred requests per rate).")
else:
    short = f"{result.workload.split(' (')[0]}, {result.num_requests:,} requests per rate; {result.model}"
    st.plotly_chart(rate_sweep_figure(result.table, short, latency_bound_s=result.latency_bound_s), width="stretch")
    st.caption(f"Assumed: {result.describe()}. Unloaded normalized latency (a lone mean request on the idle GPU): "
               f"{1e3 * result.unloaded_latency_s:.1f} ms/token.")
    sust = result.sustained.assign(sustained_rate_per_s=result.sustained["sustained_rate_per_s"].round(2))
    cmp = result.comparison()
    c1, c2 = st.columns(2)
    c1.markdown("**Sustained request rate** (mean normalized latency within the bound)")
    c1.dataframe(sust, hide_index=True)
    c2.markdown("**Paged's gain over each baseline, beside the paper's**")
    c2.dataframe(cmp.assign(simulator_gain=cmp["simulator_gain"].round(2)), hide_index=True)
    st.caption(f"Paper: {PAPER_HEADLINE}; per baseline, the rate gains it reports on ShareGPT (OPT-13B/66B/175B on "
               f"A100s). {PAPER_SOURCE}. The simulator's gains come from the workload, model and GPU stated above.")
