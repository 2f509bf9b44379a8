"""Block table page in AppTest: opens on the seed's picture, steps, plays, and the
build-your-own mode reports mistakes with st.error while keeping the last picture."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.app.apphelpers import charts as _charts

PAGE = "pages/block_table.py"


def _open(app: AppTest) -> AppTest:
    app.switch_page(PAGE).run()
    assert not app.exception
    return app


def _trace(fig: dict, name: str) -> dict:
    return next(t for t in fig["data"] if t.get("name") == name)


def test_opens_on_the_seed_picture(app):
    at = _open(app)
    assert "7, 2, 11" in at.info[0].value
    grid, tables = _charts(at)
    assert sorted(_trace(grid, "sequence A")["customdata"]) == [2, 7, 11]
    assert [row[2] for row in _trace(tables, "entries")["customdata"]] == [7, 2, 11]
    assert grid["layout"]["title"]["text"] and tables["layout"]["xaxis"]["title"]["text"]
    assert at.dataframe[0].value["physical block"].tolist() == [7, 2, 11]
    m = {x.label: x.value for x in at.metric}
    assert m["Blocks in use"] == "3 of 16" and m["Empty slots in held blocks"] == "15"


def test_next_prev_and_slider_step_through_events(app):
    at = _open(app)
    at.button(key="bt_next").click().run()
    assert at.session_state["bt_event"] == 1 and "prefix-cache hits" in at.info[0].value
    grid = _charts(at)[0]
    texts = dict(zip([r[0] for r in _trace(grid, "blocks")["customdata"]], _trace(grid, "blocks")["text"]))
    assert "ref 2" in texts[7]
    at.button(key="bt_prev").click().run()
    at.button(key="bt_prev").click().run()  # clamps at the first event
    assert at.session_state["bt_event"] == 0
    at.slider(key="bt_event").set_value(4).run()
    assert not at.exception
    assert any("block 11 copied to block 14" in w.value for w in at.warning)
    grid = _charts(at)[0]
    assert any(t.get("name") == "copy-on-write 11 -> 14" for t in grid["data"])


def test_play_advances_and_stops_at_the_end(app):
    at = _open(app)
    at.button(key="bt_play").click().run()
    assert not at.exception
    assert at.session_state["bt_event"] == 1 and at.session_state["bt_playing"]
    at.slider(key="bt_event").set_value(9).run()  # at the last event the player stops
    assert not at.exception
    assert at.session_state["bt_event"] == 9 and not at.session_state["bt_playing"]


def test_build_your_own_reports_mistakes_and_keeps_the_picture(app):
    at = _open(app)
    at.radio(key="bt_mode").set_value("Build your own").run()
    assert "empty pool" in at.info[0].value
    apply = "FormSubmitter:bt_build_form-Apply"  # form widgets take effect with the submit click
    at.text_input(key="bt_name").input("A")
    at.number_input(key="bt_tokens").set_value(40)
    at.button(key=apply).click().run()
    assert not at.exception and not at.error
    assert "A arrives with 40 tokens" in at.info[0].value
    grid = _charts(at)[0]
    assert len(_trace(grid, "sequence A")["customdata"]) == 3  # ceil(40 / 16)
    # the same name again is a mistake: one-line error, the picture stays
    at.button(key=apply).click().run()
    assert not at.exception
    assert len(at.error) == 1 and "already exists" in at.error[0].value
    assert "A arrives with 40 tokens" in at.info[0].value
    # more tokens than the pool holds
    at.selectbox(key="bt_op").set_value("append")
    at.number_input(key="bt_tokens").set_value(1000)
    at.button(key=apply).click().run()
    assert not at.exception and len(at.error) == 1
    assert "A arrives with 40 tokens" in at.info[0].value
    # fork then free the parent: the child keeps the blocks
    at.selectbox(key="bt_op").set_value("fork")
    at.button(key=apply).click().run()
    at.selectbox(key="bt_op").set_value("free")
    at.button(key=apply).click().run()
    assert not at.exception and not at.error
    grid = _charts(at)[0]
    assert len(_trace(grid, "sequence A2")["customdata"]) == 3
    assert not any(t.get("name") == "sequence A" for t in grid["data"])
