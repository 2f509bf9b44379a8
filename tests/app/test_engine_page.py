"""Engine page (AppTest): the empty state shows the labelled example, a loopback engine is
polled and drawn, network failures show one st.error and the page keeps working, and a
pasted start-up log is compared with the planner."""

from __future__ import annotations

import base64
import json
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kvsim.engine.sample import SAMPLE_LABEL, SAMPLE_VLLM_LOG

from tests.app.apphelpers import APP
from tests.loopback import closed_port, serve


VLLM_TEXT = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="1000"} 1.0
"""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = (VLLM_TEXT if self.path == "/metrics" else "<html>nope</html>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4" if self.path == "/metrics" else "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    with serve(_Handler) as url:
        yield url


def _page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90).run()
    at.switch_page("pages/engine.py").run()
    assert not at.exception
    return at


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def _values(arr) -> list[float]:
    """A trace's data array, whether plain or plotly's typed-array form {dtype, bdata}."""
    if isinstance(arr, dict) and "bdata" in arr:
        return np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"])).tolist()
    return list(arr)


def _button(at: AppTest, key: str):
    return next(b for b in at.button if b.key == key)


def test_empty_state_explains_and_shows_labelled_example():
    at = _page()
    info = " ".join(i.value for i in at.info)
    assert "vllm serve MODEL" in info and "/metrics" in info and "8000" in info
    figs = _figures(at)
    assert len(figs) >= 3
    for fig in figs:  # every chart titled, both axes titled
        assert fig["layout"]["title"]["text"]
        assert fig["layout"]["xaxis"]["title"]["text"] and fig["layout"]["yaxis"]["title"]["text"]
    assert SAMPLE_LABEL in figs[0]["layout"]["title"]["text"]
    assert any("not a measurement" in c.value for c in at.caption)


def test_polls_a_loopback_engine(server):
    at = _page()
    at.text_input(key="eng_url").set_value(server + "/metrics").run()
    _button(at, "eng_start").click().run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["KV usage"] == "25.0%"
    assert metrics["Running"] == "7" and metrics["Waiting"] == "2"
    fig = _figures(at)[0]
    assert SAMPLE_LABEL not in fig["layout"]["title"]["text"]
    measured = next(t for t in fig["data"] if t["name"] == "measured (engine)")
    # sidebar default OPT-13B fp16: 819,200 bytes/token; 0.25 x 1000 blocks x 16 tokens in use
    assert _values(measured["y"])[-1] == pytest.approx(0.25 * 1000 * 16 * 819_200 / 2**30)
    _button(at, "eng_stop").click().run()
    assert not at.exception


@pytest.mark.parametrize("make_url, needle", [
    (lambda srv: f"http://127.0.0.1:{closed_port()}/metrics", "connection refused"),
    (lambda srv: srv + "/index.html", "HTML"),
    (lambda srv: "ftp://127.0.0.1/metrics", "only http:// and https://"),
])
def test_network_errors_show_one_line_and_page_keeps_working(server, make_url, needle):
    at = _page()
    at.text_input(key="eng_url").set_value(make_url(server)).run()
    _button(at, "eng_start").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and needle in errors[0] and "\n" not in errors[0]
    assert _figures(at), "the example view stays on screen"
    at.text_input(key="eng_url").set_value(server + "/metrics").run()
    _button(at, "eng_start").click().run()
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric}["Running"] == "7"


def test_startup_log_compared_with_planner():
    at = _page()
    _button(at, "eng_example").click().run()
    assert at.text_area(key="eng_log").value == SAMPLE_VLLM_LOG
    _button(at, "eng_compare").click().run()
    assert not at.exception and not at.error
    df = at.dataframe[-1].value
    assert "KV cache tokens" in list(df["quantity"])
    row = df[df["quantity"] == "KV cache tokens"].iloc[0]
    assert row["engine"] == 435_200
    assert row["ratio"] == pytest.approx(435_200 / row["planner"])


def test_bad_log_shows_error_and_keeps_page():
    at = _page()
    at.text_area(key="eng_log").set_value("nothing useful here").run()
    _button(at, "eng_compare").click().run()
    assert not at.exception
    assert len(at.error) == 1 and "no KV capacity lines" in at.error[0].value
