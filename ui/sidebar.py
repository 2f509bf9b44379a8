"""The shared sidebar: which model, KV dtype and tensor-parallel degree every page uses.

The choice lives in ``st.session_state`` (keys prefixed ``sb_``) and in the URL's query
parameters (``model``, ``dtype``, ``tp``) so a link reproduces what was shown. A bad
upload or bad hand-set sizes show ``st.error`` and keep the previous model.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from kvsim.errors import KvsimError
from kvsim.spec import KV_DTYPE_BYTES, PRESETS, ModelSpec, custom_spec, get_preset, load_hf_config

CUSTOM = "custom (set by hand)"
UPLOAD = "upload config.json"
DEFAULT_MODEL = "opt-13b"


@dataclass(frozen=True)
class ModelChoice:
    """What the sidebar hands every page."""

    spec: ModelSpec
    kv_dtype: str
    tp: int
    model_id: str  # preset id, "custom" or "upload"


def _init_from_query() -> None:
    if st.session_state.get("sb_initialised"):
        return
    qp = st.query_params
    model = qp.get("model", DEFAULT_MODEL)
    st.session_state["sb_model"] = model if model in PRESETS else DEFAULT_MODEL
    dtype = qp.get("dtype", "fp16")
    st.session_state["sb_dtype"] = dtype if dtype in KV_DTYPE_BYTES else "fp16"
    try:
        st.session_state["sb_tp"] = max(1, min(64, int(qp.get("tp", 1))))
    except ValueError:
        st.session_state["sb_tp"] = 1
    st.session_state["sb_initialised"] = True


def render_sidebar() -> ModelChoice:
    """Draw the sidebar and store the choice in session state; returns it."""
    _init_from_query()
    options = list(PRESETS) + [CUSTOM, UPLOAD]
    with st.sidebar:
        st.header("Model")
        model_id = st.selectbox(
            "Model", options, key="sb_model",
            format_func=lambda k: PRESETS[k].name if k in PRESETS else k,
            help="Presets carry the numbers of each model's published config.json.",
        )
        spec = st.session_state.get("sb_spec") or get_preset(DEFAULT_MODEL)
        if model_id in PRESETS:
            spec = get_preset(model_id)
        elif model_id == CUSTOM:
            c1, c2, c3 = st.columns(3)
            layers = c1.number_input("layers", min_value=1, value=32, step=1, key="sb_layers")
            kv_heads = c2.number_input("KV heads", min_value=1, value=8, step=1, key="sb_kv_heads")
            head_dim = c3.number_input("head dim", min_value=1, value=128, step=1, key="sb_head_dim")
            try:
                spec = custom_spec(int(layers), int(kv_heads), int(head_dim))
            except KvsimError as exc:
                st.error(str(exc))
        else:
            upload = st.file_uploader("Hugging Face config.json", type=["json"], key="sb_upload")
            if upload is not None:
                try:
                    spec = load_hf_config(upload.getvalue(), name=upload.name)
                except KvsimError as exc:
                    st.error(f"{exc}; keeping {spec.name}")
            else:
                st.caption(f"No file yet; showing {spec.name}.")
        kv_dtype = st.selectbox("KV cache dtype", list(KV_DTYPE_BYTES), key="sb_dtype")
        tp = int(st.number_input("Tensor-parallel degree", min_value=1, max_value=64, step=1, key="sb_tp",
                                 help="Numbers are per GPU: KV heads per rank = max(1, kv_heads // tp); MLA is replicated."))
        st.caption(spec.summary())
    st.session_state["sb_spec"] = spec
    if model_id in PRESETS:
        st.query_params["model"] = model_id
    st.query_params["dtype"] = kv_dtype
    st.query_params["tp"] = str(tp)
    choice = ModelChoice(spec=spec, kv_dtype=kv_dtype, tp=tp, model_id=model_id if model_id in PRESETS else "custom")
    st.session_state["sb_choice"] = choice
    return choice


def current_model() -> ModelChoice:
    """The sidebar's choice, for pages (the sidebar renders before every page)."""
    choice = st.session_state.get("sb_choice")
    if choice is None:  # a page run on its own (tests): fall back to the default
        choice = ModelChoice(get_preset(DEFAULT_MODEL), "fp16", 1, DEFAULT_MODEL)
    return choice
