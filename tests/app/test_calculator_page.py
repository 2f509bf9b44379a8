"""Calculator page in AppTest: opens on the seed example, survives bad input, reads the URL."""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from tests.app.apphelpers import APP, metrics


def test_opens_on_seed_example(app):
    assert not app.exception
    m = metrics(app)
    assert m["Bytes per token"] == "819,200"  # OPT-13B fp16, the default model
    assert m["Blocks"] == "3" and m["Slack tokens"] == "15"
    charts = [json.loads(c.proto.spec) for c in app.get("plotly_chart")]
    assert len(charts) >= 4
    titles = [c["layout"]["title"]["text"] for c in charts]
    assert any("15 empty slot(s)" in t for t in titles)


def test_bad_context_shows_error_and_keeps_last_result(app):
    app.text_input(key="calc_context").input("12, banana").run()
    assert not app.exception
    assert any("banana" in e.value for e in app.error)
    assert metrics(app)["Blocks"] == "3"  # the previous, valid result stays on screen


def test_changing_inputs_updates_numbers(app):
    app.text_input(key="calc_context").input("32").run()
    assert metrics(app)["Blocks"] == "2" and metrics(app)["Slack tokens"] == "0"
    app.number_input(key="calc_conc").set_value(4).run()
    assert metrics(app)["Blocks"] == "8"


def test_query_params_seed_the_page():
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["model"] = "llama-3.1-8b"
    at.query_params["block"] = "32"
    at.query_params["context"] = "100"
    at.run()
    assert not at.exception
    m = metrics(at)
    assert m["Bytes per token"] == "131,072" and m["Blocks"] == "4" and m["Slack tokens"] == "28"


def test_capacity_that_cannot_fit_is_an_error_not_a_crash():
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["model"] = "llama-3.1-70b"
    at.query_params["tp"] = "4"  # 32.9 GiB of bf16 weights per GPU: fits the default A100 40GB
    at.run()
    assert not at.exception and not at.error
    at.selectbox(key="calc_gpu").set_value("l4").run()  # 0.9 x 22.5 GiB cannot hold them
    assert not at.exception
    assert any("no room for a KV cache" in e.value for e in at.error)
    assert metrics(at)["Bytes per token"] == f"{2 * 2 * 128 * 2 * 80:,}"  # the calculator above still shows


def test_custom_model_from_sidebar():
    # AppTest drops sidebar elements from its tree on reruns under st.navigation, so the
    # sidebar's widgets are driven through their session-state keys.
    at = AppTest.from_file(APP, default_timeout=90)
    at.session_state["sb_initialised"] = True
    at.session_state["sb_model"] = "custom (set by hand)"
    at.session_state["sb_dtype"] = "fp16"
    at.session_state["sb_tp"] = 1
    at.session_state["sb_layers"] = 40
    at.session_state["sb_kv_heads"] = 40
    at.session_state["sb_head_dim"] = 128
    at.run()
    assert not at.exception
    assert metrics(at)["Bytes per token"] == "819,200"


def test_dtype_and_tp_from_the_url():
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["model"] = "llama-3.1-70b"
    at.query_params["dtype"] = "fp8"
    at.query_params["tp"] = "4"
    at.run()
    assert not at.exception
    assert metrics(at)["Bytes per token"] == f"{2 * 2 * 128 * 1 * 80:,}"  # 8 KV heads / tp 4, one byte each
