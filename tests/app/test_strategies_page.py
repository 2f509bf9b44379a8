"""Strategies page in AppTest, and its upload handling as plain functions of the bytes.

Bad traces (missing columns, negative or NaN lengths, empty, unsorted, not a trace) give
one st.error line while the previous results stay on screen."""

from __future__ import annotations


import pytest
from streamlit.testing.v1 import AppTest

from tests.app.apphelpers import charts as _charts

from kvsim.errors import KvsimError

from ui.workload_choice import UPLOAD, WorkloadChoice, build_workload, read_upload, sha256_of, upload_columns

PAGE = "pages/strategies.py"
MOONCAKE = (b'{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2], "output_length": 20}\n'
            b'{"timestamp": 500, "input_length": 700, "hash_ids": [1, 3], "output_length": 5}\n'
            b'{"timestamp": 900, "input_length": 100, "hash_ids": [4], "output_length": 9}\n')
AZURE_HEAD = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
BAD_TRACES = {
    "missing.csv": (b"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,5\n", "missing column"),
    "negative.csv": (AZURE_HEAD + b"2023-11-16 18:15:46.6805900,-5,3\n", "at least 1"),
    "nan.csv": (b"num_prefill_tokens,num_decode_tokens\n10,\n", "missing or not a number"),
    "empty.csv": (b"", "is empty"),
    "unsorted.csv": (AZURE_HEAD + b"2023-11-16 18:15:47.0,5,3\n2023-11-16 18:15:46.0,5,3\n", "not sorted"),
    "picture.png": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not a trace"),
    "prose.jsonl": (b"{this is not json\n", "not JSON"),
}


def _open(app: AppTest) -> AppTest:
    app.switch_page(PAGE).run()
    assert not app.exception
    return app


def _upload(at: AppTest, name: str, data: bytes) -> AppTest:
    """What the file uploader's callback stores; AppTest has no uploader driver."""
    at.session_state["strat_upload"] = (name, data)
    return at


def test_opens_with_results_beside_the_papers_numbers(app):
    at = _open(app)
    assert not at.error
    charts = _charts(at)
    titles = [c["layout"]["title"]["text"] for c in charts]
    assert len(charts) == 4
    assert any(t.startswith("Where the KV memory goes") for t in titles)
    assert any(t.startswith("Block size") for t in titles)
    for c in charts:
        x_titles = [v["title"]["text"] for k, v in c["layout"].items() if k.startswith("xaxis") and "title" in v]
        y_titles = [v["title"]["text"] for k, v in c["layout"].items() if k.startswith("yaxis") and "title" in v]
        assert c["layout"]["title"]["text"] and x_titles and y_titles
    table = at.dataframe[0].value.set_index("strategy")
    assert table.loc["reserve-max", "paper Fig. 2 token states (%)"] == 20.4
    assert table.loc["paged", "paper Fig. 2 token states (%)"] == 96.3
    # the paper's ordering holds on the stand-in workload: Max < Pow2 < Oracle < paged
    ts = table["token states (%)"]
    assert ts["reserve-max"] < ts["pow2"] < ts["oracle"] < ts["paged"]
    assert table["finished"].eq(200).all()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == "200"
    assert any(m.startswith("Prefix-cache hit rate") for m in metrics)
    assert len(at.get("download_button")) == 3


def test_changed_inputs_are_flagged_until_run(app):
    at = _open(app)
    at.number_input(key="strat_n").set_value(50).run()
    assert any("changed since these results" in i.value for i in at.info)
    assert {m.label: m.value for m in at.metric}["Requests"] == "200"
    at.button(key="strat_run").click().run()
    assert not at.exception and not any("changed since" in i.value for i in at.info)
    assert {m.label: m.value for m in at.metric}["Requests"] == "50"


@pytest.mark.parametrize("name", list(BAD_TRACES))
def test_bad_trace_is_one_line_error_and_results_stay(app, name):
    data, words = BAD_TRACES[name]
    at = _open(app)
    before = at.dataframe[0].value.copy()
    at.session_state["strat_source"] = UPLOAD
    at.run()
    _upload(at, name, data)
    at.button(key="strat_run").click().run()
    assert not at.exception
    assert len(at.error) == 1
    msg = at.error[0].value
    assert words in msg and "\n" not in msg and "Traceback" not in msg
    assert len(_charts(at)) == 4
    assert at.dataframe[0].value.equals(before)


def test_good_upload_replaces_the_results(app):
    at = _open(app)
    at.session_state["strat_source"] = UPLOAD
    at.run()
    _upload(at, "mooncake.jsonl", MOONCAKE)
    at.radio(key="strat_arrivals").set_value("trace")
    at.button(key="strat_run").click().run()
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric}["Requests"] == "3"
    assert at.dataframe[0].value["finished"].eq(3).all()


def test_generic_csv_gets_a_column_mapping(app):
    data = b"id,in_tok,out_tok,t_ms\n1,100,20,0\n2,50,10,250\n3,70,30,900\n"
    assert upload_columns(data) == ["id", "in_tok", "out_tok", "t_ms"]
    at = _open(app)
    at.session_state["strat_source"] = UPLOAD
    at.run()
    _upload(at, "mine.csv", data)
    at.run()
    at.selectbox(key="strat_map_prompt").set_value("in_tok")
    at.selectbox(key="strat_map_output").set_value("out_tok")
    at.selectbox(key="strat_map_arrival").set_value("t_ms")
    at.selectbox(key="strat_map_unit").set_value("ms")
    at.button(key="strat_run").click().run()
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric}["Mean prompt / output"] == "73 / 20 tokens"


def test_no_strategy_is_an_error_not_a_crash(app):
    at = _open(app)
    at.multiselect(key="strat_strategies").set_value([])
    at.button(key="strat_run").click().run()
    assert not at.exception
    assert any("at least one strategy" in e.value for e in at.error)
    assert len(_charts(at)) == 4


# ----- the upload functions, without a page ---------------------------------------------------

def _choice(data: bytes, name: str = "t.jsonl", **kw) -> WorkloadChoice:
    return WorkloadChoice(source=UPLOAD, upload_name=name, upload_sha256=sha256_of(data), **kw)


def test_read_upload_detects_formats_and_keeps_hashes():
    wl = read_upload(MOONCAKE, "m.jsonl")
    assert [r.prompt_tokens for r in wl.requests] == [600, 700, 100]
    assert [r.arrival_s for r in wl.requests] == [0.0, 0.5, 0.9]
    assert wl.hash_block_size == 512 and wl.requests[0].block_hashes == (1, 2)
    assert upload_columns(MOONCAKE) is None and upload_columns(AZURE_HEAD + b"x,1,2\n") is None
    assert len(read_upload(MOONCAKE, "m.jsonl", limit=2)) == 2


def test_build_workload_arrivals_and_mistakes():
    timed = build_workload(_choice(MOONCAKE, arrivals="trace"), MOONCAKE)
    assert [r.arrival_s for r in timed.requests] == [0.0, 0.5, 0.9]
    flat = build_workload(_choice(MOONCAKE, arrivals="all-at-once"), MOONCAKE)
    assert all(r.arrival_s == 0.0 for r in flat.requests)
    poisson = build_workload(_choice(MOONCAKE, arrivals="poisson", rate_per_s=4.0), MOONCAKE)
    assert [r.prompt_tokens for r in poisson.requests] == [600, 700, 100]
    untimed = b"num_prefill_tokens,num_decode_tokens\n10,3\n"
    with pytest.raises(KvsimError, match="no timestamps"):
        build_workload(_choice(untimed, "s.csv", arrivals="trace"), untimed)
    with pytest.raises(KvsimError, match="upload a trace"):
        build_workload(_choice(MOONCAKE), None)
    with pytest.raises(KvsimError, match="changed"):
        build_workload(_choice(MOONCAKE), MOONCAKE + b"\n")
    generic = b"a,b\n5,6\n"
    with pytest.raises(KvsimError, match="must differ"):
        build_workload(_choice(generic, "g.csv", mapping=("a", "a", "", "s")), generic)
    with pytest.raises(KvsimError, match="map its prompt"):
        build_workload(_choice(generic, "g.csv"), generic)
    wl = build_workload(_choice(generic, "g.csv", mapping=("a", "b", "", "s")), generic)
    assert (wl.requests[0].prompt_tokens, wl.requests[0].output_tokens) == (5, 6)


def test_build_workload_presets_and_sharing():
    base = WorkloadChoice(source="preset", num_requests=30, system_prompt_tokens=64, num_samples=2)
    wl = build_workload(base, max_len=2048)
    assert len(wl) == 30
    assert all(r.num_samples == 2 and r.shared_prefix_tokens == 64 and r.prompt_tokens > 64 for r in wl.requests)
    assert all(r.final_len <= 2048 for r in wl.requests)
    syn = build_workload(WorkloadChoice(source="synthetic", prompt_len="10", output_len="uniform:3:5", num_requests=4))
    assert [r.prompt_tokens for r in syn.requests] == [10] * 4
    assert all(3 <= r.output_tokens <= 5 for r in syn.requests)
    with pytest.raises(KvsimError, match="length spec"):
        build_workload(WorkloadChoice(source="synthetic", prompt_len="ten", output_len="5", num_requests=4))
    assert hash(base) == hash(WorkloadChoice(source="preset", num_requests=30, system_prompt_tokens=64, num_samples=2))
