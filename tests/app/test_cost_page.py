"""Cost page in AppTest: charts with titles, axis titles and their assumptions; inputs move
the numbers; a model that does not fit the GPU warns instead of failing."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.app.apphelpers import APP, charts as _charts, metrics as _metrics, open_page


def _open() -> AppTest:
    return open_page("pages/cost.py")


def test_cost_page_draws_every_chart_with_its_assumptions():
    at = _open()
    charts = _charts(at)
    assert len(charts) >= 3
    for fig in charts:
        title = fig["layout"]["title"]["text"]
        assert "OPT-13B" in title and "A100 40GB" in title  # the default model and GPU are stated
        assert fig["layout"]["xaxis"]["title"]["text"]
        assert fig["layout"]["yaxis"]["title"]["text"]
    # OPT-13B at the A100's published peaks: weights 25.7e9 B, ridge 312e12 / 1.555e12 = 201 FLOP/B.
    m = _metrics(at)
    assert m["Weights read per step"] == "23.9 GiB"
    assert m["GPU ridge point"] == "201 FLOP/B"
    assert m["KV read per token of context"] == "800.0 KiB"
    assert m["Linear layers compute-bound from"] == "201 tokens"
    # context chart: KV bytes read for batch 8 at context 1,024 = 8 x 1,024 x 819,200 B = 6.25 GiB
    ctx = charts[0]
    bars = next(t for t in ctx["data"] if t["type"] == "bar")
    i = [str(x) for x in bars["x"]].index("1024")
    assert abs(bars["y"][i] - 8 * 1024 * 819_200 / 2**30) < 1e-9
    assert len(at.caption) >= 4


def test_inputs_change_the_numbers():
    at = _open()
    at.selectbox(key="cost_gpu").set_value("h100-80gb").run()
    assert not at.exception
    assert _metrics(at)["GPU ridge point"] == "295 FLOP/B"  # 989e12 / 3.35e12
    at.selectbox(key="cost_wdtype").set_value("fp8").run()
    assert _metrics(at)["Weights read per step"] == "12.0 GiB"


def test_a_model_too_big_for_the_gpu_warns_and_still_charts():
    # The sidebar's model comes from the URL (AppTest drops sidebar widgets on reruns under
    # st.navigation). DeepSeek-V3's 671B parameters do not fit one A100.
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["model"] = "deepseek-v3"
    at.run()
    at.switch_page("pages/cost.py").run()
    assert not at.exception
    assert any("no room" in w.value for w in at.warning)
    assert len(_charts(at)) >= 3
    assert "DeepSeek-V3" in _charts(at)[0]["layout"]["title"]["text"]


def test_custom_gpu():
    at = _open()
    at.selectbox(key="cost_gpu").set_value("custom").run()
    at.number_input(key="cost_bw").set_value(1000.0).run()
    at.number_input(key="cost_tf").set_value(100.0).run()
    assert not at.exception
    assert _metrics(at)["GPU ridge point"] == "100 FLOP/B"


def test_rate_sweep_runs_and_reports_the_paper_beside_it():
    at = _open()
    assert any("run the sweep" in i.value for i in at.info)
    at.number_input(key="cost_rs_requests").set_value(60).run()
    at.text_input(key="cost_rs_rates").input("1, 3").run()
    at.multiselect(key="cost_rs_strategies").set_value(["reserve-max", "paged"]).run()
    at.button(key="cost_rs_run").click().run()
    assert not at.exception
    charts = _charts(at)
    sweep = next(c for c in charts if "request rate" in c["layout"]["title"]["text"])
    names = [t["name"] for t in sweep["data"]]
    assert "paged" in names and "reserve-max" in names
    assert sweep["layout"]["xaxis"]["title"]["text"] == "request rate (requests/s)"
    assert any("Kwon et al." in c.value for c in at.caption)
    assert len(at.dataframe) == 2


def test_bad_rates_show_an_error():
    at = _open()
    at.text_input(key="cost_rs_rates").input("1, fast").run()
    at.button(key="cost_rs_run").click().run()
    assert not at.exception
    assert any("fast" in e.value for e in at.error)
    assert len(_charts(at)) >= 3  # the cost charts stay on screen
