"""Live page in AppTest: a run draws measured beside predicted KV with titles and axis titles,
a pool too small shows preemptions instead of failing, bad input is an st.error that keeps
the last result on screen."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.app.apphelpers import charts as _charts, metrics as _metrics, open_page


def _open() -> AppTest:
    return open_page("pages/live.py", timeout=120)


def _set_small(at: AppTest) -> None:
    at.number_input(key="live_requests").set_value(6)
    at.text_input(key="live_prompt").set_value("uniform:8:40")
    at.text_input(key="live_output").set_value("uniform:8:24")


def test_live_page_runs_and_draws_measured_beside_predicted():
    at = _open()
    assert not at.get("plotly_chart")  # nothing is run before the button
    _set_small(at)
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    charts = _charts(at)
    assert len(charts) >= 2
    for fig in charts:
        assert fig["layout"]["title"]["text"]
        assert fig["layout"]["xaxis"]["title"]["text"] and fig["layout"]["yaxis"]["title"]["text"]
    kv = charts[0]
    names = {t["name"]: t for t in kv["data"]}
    measured, predicted = names["paged: measured blocks in use"], names["paged: predicted (calculator)"]
    assert measured["y"] == predicted["y"] and max(measured["y"]) > 0
    assert "contiguous: measured reservations" in names
    m = _metrics(at)
    assert m["Tokens match contiguous"] == "yes"
    assert m["Finished requests"] == "6 / 6"
    assert m["Worst step difference"] == "0 B"
    assert len(at.caption) >= 3
    assert len(at.get("download_button")) == 2


def test_samples_share_the_prompt_and_copy_on_write():
    at = _open()
    _set_small(at)
    at.number_input(key="live_samples").set_value(3)
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    m = _metrics(at)
    assert m["Samples per request"] == "3"
    assert int(m["Copy-on-write copies"].replace(",", "")) > 0
    assert m["Tokens match contiguous"] == "yes"
    assert m["Worst step difference"] == "0 B"
    assert m["Finished requests"] == "6 / 6"
    names = {t["name"]: t for t in _charts(at)[0]["data"]}
    assert names["paged: measured blocks in use"]["y"] == names["paged: predicted (calculator)"]["y"]


def test_small_pool_preempts_and_bad_input_keeps_the_result():
    at = _open()
    _set_small(at)
    at.checkbox(key="live_auto_pool").uncheck().run()
    at.number_input(key="live_blocks").set_value(5)
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    m = _metrics(at)
    assert int(m["Preemptions"]) > 0
    assert m["Finished requests"] == "6 / 6"
    assert m["Worst step difference"] == "0 B"
    # a bad length spec: one-line error, previous charts still shown
    at.text_input(key="live_prompt").set_value("uniform:40:8")
    at.button(key="live_run").click().run()
    assert not at.exception
    assert at.error and "uniform" in at.error[0].value
    assert at.get("plotly_chart")
    # a pool that cannot hold even one request: an error, not a crash
    at.text_input(key="live_prompt").set_value("uniform:8:40")
    at.number_input(key="live_blocks").set_value(1)
    at.button(key="live_run").click().run()
    assert not at.exception
    assert at.error and "pool" in at.error[0].value
