"""Block-table figures carry what the pool holds: owners, shared blocks' ref counts, fill,
cached free blocks, copy-on-write arrows. Expectations come from the scenario's story
(stated in kvsim.scenario) or from the pool itself, never from the figure code."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.figures.blocktable import (
    block_grid_figure, block_table_figure, block_table_frame, grid_shape, owner_colors,
)
from kvsim.scenario import ScenarioRecorder, seed_scenario

SNAPS = seed_scenario()
COLORS = owner_colors(SNAPS)


def _trace(fig, name):
    matches = [t for t in fig.data if t.name == name]
    assert matches, f"no trace named {name!r} in {[t.name for t in fig.data]}"
    return matches[0]


def _cells(fig) -> dict[int, list]:
    """block id -> [id, owners, ref count, filled, cached, state] from the label trace."""
    return {row[0]: list(row) for row in _trace(fig, "blocks").customdata}


def test_step0_is_the_seed_picture():
    fig = block_grid_figure(SNAPS[0], COLORS)
    assert sorted(_trace(fig, "sequence A").customdata) == [2, 7, 11]
    cells = _cells(fig)
    assert cells[7][1] == "A" and cells[7][2] == 1
    assert cells[11][3] == 1  # 33 tokens: the third block holds one
    assert cells[0][5] == "free" and cells[0][1] == ""
    texts = dict(zip([r[0] for r in _trace(fig, "blocks").customdata], _trace(fig, "blocks").text))
    assert "1/16" in texts[11] and "16/16" in texts[7]
    # the table beside it: logical 0, 1, 2 -> physical 7, 2, 11
    frame = block_table_frame(SNAPS[0])
    assert frame[frame["sequence"] == "A"]["physical block"].tolist() == [7, 2, 11]
    assert frame["slots written"].tolist() == [16, 16, 1]
    tables = block_table_figure(SNAPS[0], COLORS)
    entries = _trace(tables, "entries")
    assert [row[2] for row in entries.customdata] == [7, 2, 11]
    assert entries.text[0].startswith("<b>→ 7")


def test_shared_blocks_show_their_ref_counts():
    fig = block_grid_figure(SNAPS[1], COLORS)  # B shares A's two system-prompt blocks
    cells = _cells(fig)
    assert cells[7][2] == 2 and cells[2][2] == 2 and set(cells[7][1].split(", ")) == {"A", "B"}
    texts = dict(zip([r[0] for r in _trace(fig, "blocks").customdata], _trace(fig, "blocks").text))
    assert "ref 2" in texts[7] and "ref 2" in texts[2] and "ref" not in texts[11]
    outline = _trace(fig, "shared (ref count > 1)")
    assert list(outline.x).count(None) == 2  # one outline rectangle per shared block
    # each owner paints one stripe of a shared block
    assert 7 in _trace(fig, "sequence A").customdata and 7 in _trace(fig, "sequence B").customdata
    frame = block_table_frame(SNAPS[3])  # after the fork: three tables point at 7
    assert frame[frame["physical block"] == 7]["ref count"].tolist() == [3, 3, 3]


def test_copy_on_write_is_an_arrow_from_source_to_copy():
    snap = SNAPS[4]
    assert snap.copies == ((11, 14),)
    fig = block_grid_figure(snap, COLORS)
    rows, cols = grid_shape(16)
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert len(arrows) == 1
    a = arrows[0]
    # cell origins: id -> (id % cols, id // cols); the arrow joins the two cells' centres
    assert int(a.ax) == 11 % cols and int(a.ay) == 11 // cols
    assert int(a.x) == 14 % cols and int(a.y) == 14 // cols
    assert any(t.name == "copy-on-write 11 -> 14" for t in fig.data)
    assert not [a for a in block_grid_figure(SNAPS[5], COLORS).layout.annotations if a.showarrow]


def test_finished_pool_shows_cached_free_blocks_apart_from_free_ones():
    fig = block_grid_figure(SNAPS[-1], COLORS)
    assert sorted(_trace(fig, "free, still cached").customdata) == [2, 7]
    assert sorted(_trace(fig, "free").customdata) == sorted(set(range(16)) - {2, 7})
    assert not [t for t in fig.data if (t.name or "").startswith("sequence ")]
    empty = block_table_figure(SNAPS[-1], COLORS)
    assert any("no sequences" in a.text for a in empty.layout.annotations)


def test_colours_stay_with_a_sequence_and_differ_between_sequences():
    assert list(COLORS) == ["A", "B", "A2"]
    assert len(set(COLORS.values())) == 3
    for snap in SNAPS:
        fig = block_grid_figure(snap, COLORS)
        for name, color in COLORS.items():
            for t in fig.data:
                if t.name == f"sequence {name}":
                    assert t.fillcolor == color


def test_figures_have_titles_and_axis_titles():
    for fig in (block_grid_figure(SNAPS[0], COLORS), block_table_figure(SNAPS[0], COLORS)):
        assert fig.layout.title.text
        assert fig.layout.xaxis.title.text


def test_grid_shape_fits_every_block():
    for n in range(1, 70):
        rows, cols = grid_shape(n)
        assert rows * cols >= n and (rows - 1) * cols < n and cols * cols >= n


ops = st.lists(st.tuples(st.sampled_from(["allocate", "append", "fork", "free"]), st.integers(0, 3),
                         st.integers(1, 40)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(ops, st.integers(1, 3), st.sampled_from([4, 8, 16]))
def test_grid_and_tables_agree_with_the_pool(seq_ops, shared_blocks, block_size):
    """Whatever the story, every block is drawn once (as free, cached, or one stripe per
    owner), and each table's slots add up to the sequence's stored tokens."""
    rec = ScenarioRecorder(12, block_size, prefix_caching=True)
    names: list[str] = []
    for op, who, n in seq_ops:
        try:
            if op == "allocate":
                name = f"S{len(names)}"
                rec.allocate(name, list(range(shared_blocks * block_size)) + [10_000 + len(names)] * n, "alloc")
                names.append(name)
            elif names and op == "append":
                rec.append(names[who % len(names)], n, "append")
            elif names and op == "fork":
                child = f"S{len(names)}"
                rec.fork(names[who % len(names)], child, "fork")
                names.append(child)
            elif names and op == "free":
                rec.free(names[who % len(names)], "free")
        except Exception as exc:  # pool full, sequence already freed: mistakes the recorder reports
            assert type(exc).__module__.startswith("kvsim")
    snaps = rec.snapshots or [rec.snapshot("empty")]
    colors = owner_colors(snaps)
    for snap in snaps:
        fig = block_grid_figure(snap, colors)
        drawn: dict[int, int] = {}
        for t in fig.data:
            if t.name and (t.name.startswith("sequence ") or t.name in ("free", "free, still cached")):
                for b in t.customdata:
                    drawn[b] = drawn.get(b, 0) + 1
        assert set(drawn) == set(range(snap.num_blocks))
        for cell in snap.blocks:
            assert drawn[cell.block_id] == max(1, len(cell.owners))
            assert len(cell.owners) == cell.ref_count
        frame = block_table_frame(snap)
        for name, table in snap.tables.items():
            sub = frame[frame["sequence"] == name]
            assert sub["physical block"].tolist() == list(table)
            assert int(sub["slots written"].sum()) == snap.tokens[name]
