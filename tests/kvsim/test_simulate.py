"""simulate(): the issue's must-show figures, the page entry points, memory options."""

from __future__ import annotations


import pytest

from kvsim.errors import KvsimError
from kvsim.scenario import seed_scenario
from kvsim.simulate import SUMMARY_KEYS, run_strategies, simulate, sweep_block_sizes
from kvsim.spec import get_preset
from kvsim.strategies import next_pow2, parse_strategy, reservation_tokens
from kvsim.timeline import TIMELINE_COLUMNS
from kvsim.traces import read_trace
from kvsim.units import GiB
from kvsim.workloads import preset_workload, workload_from_lengths
from kvsim.traces import default_traces_dir as traces_dir


def test_opt13b_12gib_sharegpt_like_paged_vs_reserve_max():
    """The PagedAttention paper's Figure 2 setting: paged keeps >= 90 % of its memory as token
    states, max-length reservation < 40 % (paper: 96.3 % and 20.4 %)."""
    spec = get_preset("opt-13b")
    w = preset_workload("sharegpt-like", 600, arrivals="poisson:2", seed=0, max_len=2048)
    res = run_strategies(w, spec, ["reserve-max", "paged"], kv_memory_bytes=12 * GiB, block_size=16)
    paged, rmax = res["paged"].summary, res["reserve-max"].summary
    assert paged.finished == rmax.finished == 600
    assert paged.token_state_fraction >= 0.90
    assert rmax.token_state_fraction < 0.40
    # 12 GiB / (2048 tokens * 800 KiB) = 7.68: seven max-length reservations at once
    assert rmax.max_running == 7


def test_mooncake_prefix_cache_hits():
    path = traces_dir() / "mooncake_conversation_trace.jsonl"
    if not path.exists():
        pytest.skip("Mooncake trace not available")
    w = read_trace(path)
    r = simulate(w, get_preset("llama-3.1-8b"), block_size=512, prefix_caching=True)
    s = r.summary
    assert s.prefix_query_blocks == 288_500
    assert s.prefix_hit_blocks == pytest.approx(105_592, rel=0.01)
    assert s.preemptions == 0 and s.dropped == 0 and s.unlimited_memory


def test_summary_has_the_cli_keys_and_timeline_is_documented():
    r = simulate(workload_from_lengths([30, 40], [20, 10]), get_preset("llama-3.1-8b"), num_blocks=50)
    d = r.summary.to_dict()
    assert set(SUMMARY_KEYS) <= set(d)
    assert set(r.timeline.columns) <= set(TIMELINE_COLUMNS)
    assert (r.timeline["source"] == "paged").all()
    assert d["bytes_per_token"] == 131072 and d["capacity_bytes"] == 50 * 16 * 131072


def test_memory_options():
    w = workload_from_lengths([30], [20])
    spec = get_preset("llama-3.1-8b")  # 2 MiB per 16-token block
    assert simulate(w, spec, kv_memory_bytes=5 * 2**20).summary.num_blocks == 2
    unl = simulate(w, spec).summary
    assert unl.unlimited_memory and unl.num_blocks == 4  # ceil(49 / 16)
    arena = simulate(w, spec, strategy="oracle").summary
    assert arena.capacity_bytes == 49 * 131072 and arena.num_blocks is None
    with pytest.raises(KvsimError, match="not both"):
        simulate(w, spec, num_blocks=3, kv_memory_bytes=10**9)
    with pytest.raises(KvsimError, match="hold no block"):
        simulate(w, spec, kv_memory_bytes=1000)
    with pytest.raises(KvsimError, match="paged"):
        simulate(w, spec, strategy="pow2", prefix_caching=True)
    with pytest.raises(KvsimError, match="unknown strategy"):
        simulate(w, spec, strategy="best-fit")
    with pytest.raises(KvsimError):
        simulate(w, spec, block_size=0)
    with pytest.raises(KvsimError):
        simulate([1, 2], spec)


def test_run_strategies_progress_and_labels():
    seen = []
    w = preset_workload("alpaca-like", 200, seed=2, max_len=2048)
    res = run_strategies(w, get_preset("opt-13b"), ["reserve-max", "pow2", "oracle", "paged", "paged+prefix"],
                         kv_memory_bytes=4 * GiB, progress=seen.append)
    assert list(res) == ["reserve-max", "pow2", "oracle", "paged", "paged+prefix"]
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0) and 0 < seen[0] < 0.25
    fr = {k: v.summary.token_state_fraction for k, v in res.items()}
    # the paper's ordering: Max < Pow2 < Oracle < paged
    assert fr["reserve-max"] < fr["pow2"] < fr["oracle"] < fr["paged"]
    assert res["paged+prefix"].summary.prefix_caching


def test_block_size_sweep_slack_grows_with_block_size():
    w = preset_workload("alpaca-like", 100, seed=0, max_len=2048)
    df = sweep_block_sizes(w, get_preset("opt-13b"), [1, 16, 256])
    assert df["block_size"].tolist() == [1, 16, 256]
    assert df["internal_fraction"].iloc[0] == 0.0
    assert df["internal_fraction"].is_monotonic_increasing


def test_strategy_helpers():
    assert [next_pow2(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [1, 2, 4, 1024, 1024, 2048]
    assert reservation_tokens("reserve-max", 10, 2048) == 2048
    assert reservation_tokens("pow2", 10, 2048) == 16
    assert reservation_tokens("oracle", 10, 2048) == 10
    assert parse_strategy("paged+prefix") == ("paged", True)
    assert parse_strategy("vLLM") == ("paged", False)


def test_seed_scenario_opens_on_the_seed_picture():
    snaps = seed_scenario()
    first = snaps[0]
    assert first.tables == {"A": (7, 2, 11)} and first.tokens == {"A": 33}
    cells = {c.block_id: c for c in first.blocks}
    assert (cells[7].filled, cells[2].filled, cells[11].filled) == (16, 16, 1)
    assert cells[7].owners == ("A",) and cells[7].ref_count == 1
    second = snaps[1]
    assert second.tables["B"][:2] == (7, 2) and set(second.shared_blocks) == {7, 2}
    cow = [s for s in snaps if s.copies]
    assert len(cow) == 1 and cow[0].copies[0][0] == 11
    a2 = cow[0].tables["A2"]
    assert a2[:2] == (7, 2) and a2[2] == cow[0].copies[0][1] and cow[0].tables["A"][2] == 11
    last = snaps[-1]
    assert last.tables == {} and last.num_free_blocks == 16
    assert {c.block_id for c in last.blocks if c.cached} >= {7, 2}  # the system prompt stays cached
    assert [s.index for s in snaps] == list(range(len(snaps)))
