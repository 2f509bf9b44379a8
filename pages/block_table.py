"""Block table: a small paged KV pool stepped event by event (arrive, share a prefix, grow,
fork, copy-on-write, finish), or a story the user builds."""

from __future__ import annotations

import streamlit as st

from kvsim.errors import KvsimError
from kvsim.figures.blocktable import block_grid_figure, block_table_figure, block_table_frame, owner_colors
from kvsim.scenario import PoolSnapshot, ScenarioRecorder, seed_scenario

PLAY_INTERVAL_S = 1.5
STORY, BUILD = "Guided story", "Build your own"


@st.cache_data(show_spinner=False)
def _story() -> list[PoolSnapshot]:
    return seed_scenario()


st.title("Block table: how PagedAttention stores a sequence")
st.caption(
    "A sequence's KV cache is cut into blocks of a fixed number of token slots. Its block table maps logical "
    "block i (tokens i x B to (i+1) x B - 1) to any free physical block, so memory is taken one block at a time "
    "and only the last block has empty slots. Blocks are reference counted: a shared prompt prefix or a forked "
    "sample points at the same physical block, and a write into a shared, partly filled block copies it first "
    "(copy-on-write)."
)

mode = st.radio("Scenario", [STORY, BUILD], horizontal=True, key="bt_mode",
                help="The guided story is a fixed scenario on 16 blocks of 16 tokens; build your own runs your "
                     "operations on a real block pool.")


# ----- building a scenario ------------------------------------------------------------------

def _recorder() -> ScenarioRecorder:
    rec = st.session_state.get("bt_recorder")
    if rec is None:
        rec = ScenarioRecorder(int(st.session_state.get("bt_new_blocks", 16)),
                               int(st.session_state.get("bt_new_block_size", 16)), prefix_caching=True)
        rec.snapshot("An empty pool: every block is free")
        st.session_state["bt_recorder"] = rec
    return rec


def _prompt_ids(num_tokens: int, shared_tokens: int, name: str) -> list[int]:
    """Token ids: the shared system prompt (same ids for every sequence) then ids unique to ``name``."""
    shared = min(shared_tokens, num_tokens)
    base = 1_000_000 * (1 + sum(ord(ch) for ch in name))
    return list(range(shared)) + [base + i for i in range(num_tokens - shared)]


def _apply(op: str, name: str, other: str, num_tokens: int, shared_tokens: int) -> None:
    rec = _recorder()
    name = name.strip()
    if not name:
        raise KvsimError("give the sequence a name")
    if op == "allocate":
        if num_tokens < 1:
            raise KvsimError("a new sequence needs at least 1 token")
        rec.allocate(name, _prompt_ids(num_tokens, shared_tokens, name),
                     f"{name} arrives with {num_tokens} tokens ({min(shared_tokens, num_tokens)} of them the shared prompt)")
    elif op == "append":
        rec.append(name, num_tokens, f"{name} generates {num_tokens} token(s)")
    elif op == "fork":
        child = other.strip()
        if not child:
            raise KvsimError("name the forked sequence")
        rec.fork(name, child, f"{name} forks {child}: {child} shares all of {name}'s blocks")
    else:
        rec.free(name, f"{name} finishes: its references are dropped")
    st.session_state["bt_build_event"] = len(rec.snapshots) - 1


if mode == BUILD:
    with st.form("bt_build_form"):
        c = st.columns([1.2, 1, 1, 1, 1])
        op = c[0].selectbox("Operation", ["allocate", "append", "fork", "free"], key="bt_op",
                            help="allocate: a new sequence with a prompt; append: generate tokens; fork: a second "
                                 "sample sharing every block; free: the sequence finishes.")
        name = c[1].text_input("Sequence", value="A", key="bt_name")
        other = c[2].text_input("Forked child (fork)", value="A2", key="bt_child")
        num_tokens = int(c[3].number_input("Tokens (allocate / append)", min_value=0, max_value=100_000, value=20,
                                           step=1, key="bt_tokens"))
        shared_tokens = int(c[4].number_input("Shared prompt tokens (allocate)", min_value=0, max_value=100_000,
                                              value=32, step=1, key="bt_shared",
                                              help="Leading tokens equal across sequences: full blocks of them "
                                                   "are prefix-cache hits for the next sequence."))
        go_clicked = st.form_submit_button("Apply", type="primary")
    c = st.columns([1, 1, 2])
    c[0].number_input("Blocks in a new pool", min_value=1, max_value=64, value=16, step=1, key="bt_new_blocks")
    c[1].number_input("Block size of a new pool (tokens)", min_value=1, max_value=64, value=16, step=1,
                      key="bt_new_block_size")
    if c[2].button("Start a new pool", key="bt_reset"):
        st.session_state.pop("bt_recorder", None)
        st.session_state["bt_build_event"] = 0
    if go_clicked:
        try:
            _apply(op, name, other, num_tokens, shared_tokens)
        except KvsimError as exc:
            st.error(str(exc))
    snapshots = _recorder().snapshots
    event_key = "bt_build_event"
else:
    snapshots = _story()
    event_key = "bt_event"

last = len(snapshots) - 1
if event_key not in st.session_state or st.session_state[event_key] > last:
    st.session_state[event_key] = last if mode == BUILD else 0


# ----- stepping ------------------------------------------------------------------------------

def _move(delta: int) -> None:
    st.session_state[event_key] = max(0, min(last, st.session_state[event_key] + delta))
    st.session_state["bt_user_moved"] = True


def _mark_moved() -> None:
    st.session_state["bt_user_moved"] = True


def _toggle_play() -> None:
    playing = not st.session_state.get("bt_playing", False)
    st.session_state["bt_playing"] = playing
    if playing and st.session_state[event_key] >= last:
        st.session_state[event_key] = 0  # play from the start again
        st.session_state["bt_user_moved"] = True


playing = bool(st.session_state.get("bt_playing", False)) and last > 0

c = st.columns([1, 1, 1, 6])
c[0].button("◀ Prev", key="bt_prev", on_click=_move, args=(-1,), width="stretch")
c[1].button("Next ▶", key="bt_next", on_click=_move, args=(1,), width="stretch")
c[2].button("⏸ Pause" if playing else "▶ Play", key="bt_play", on_click=_toggle_play, width="stretch",
            help=f"Advance one event every {PLAY_INTERVAL_S:g} s.")


@st.fragment(run_every=PLAY_INTERVAL_S if playing else None)
def _stepper() -> None:
    moved = st.session_state.pop("bt_user_moved", False)  # a click this run, not the timer
    if st.session_state.get("bt_playing"):
        if not moved and st.session_state[event_key] < last:
            st.session_state[event_key] += 1
        if st.session_state[event_key] >= last:
            st.session_state["bt_playing"] = False
            st.rerun()  # a full rerun drops the timer and relabels the Play button
    if last > 0:
        st.slider("Event", 0, last, key=event_key, format="%d", on_change=_mark_moved,
                  help="Step through the scenario: each event is one operation on the block pool.")
    i = int(st.session_state[event_key])
    snap = snapshots[i]
    colors = owner_colors(snapshots)
    st.info(f"**Event {i} of {last}.** {snap.caption}")
    if snap.copies:
        st.warning("Copy-on-write: " + ", ".join(f"block {s} copied to block {d}" for s, d in snap.copies)
                   + " (red arrow); the writer now owns the copy, the original keeps its other owners.")

    used = snap.num_blocks - snap.num_free_blocks
    written = sum(snap.tokens.values())
    slots = sum(c.filled for c in snap.blocks if c.owners)
    held = used * snap.block_size
    m = st.columns(4)
    m[0].metric("Blocks in use", f"{used} of {snap.num_blocks}")
    m[1].metric("Shared blocks", f"{len(snap.shared_blocks)}",
                help="Blocks referenced by more than one block table: stored once.")
    m[2].metric("Tokens in the tables", f"{written}",
                help="Sum over sequences; a shared block counts for each sequence that reads it.")
    m[3].metric("Empty slots in held blocks", f"{held - slots}",
                help="Internal fragmentation: unwritten slots of blocks in use (at most one last block per sequence).")

    left, right = st.columns([5, 4])
    with left:
        st.plotly_chart(block_grid_figure(snap, colors), width="stretch", key=f"bt_grid_{mode}")
        st.caption(
            f"Each cell is one physical block of {snap.block_size} token slots, coloured by the sequence(s) whose table "
            "points at it; a block shared by k sequences is striped and outlined with 'ref k'. The dark bar and n/B "
            "show slots written. Grey dotted cells are free but still hold a cached prompt prefix (reused on a hit, "
            "evicted last). Assumed: prefix caching on, only full prompt blocks cached."
        )
    with right:
        st.plotly_chart(block_table_figure(snap, colors), width="stretch", key=f"bt_tables_{mode}")
        st.caption("Each row is a sequence's block table: logical block i -> physical block, slots written, and "
                   "'ref k' when the entry is shared. Logical order is contiguous; physical blocks are not.")
        frame = block_table_frame(snap)
        if len(frame):
            st.dataframe(frame, hide_index=True, width="stretch")


_stepper()
