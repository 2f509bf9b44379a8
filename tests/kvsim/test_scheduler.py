"""Scheduler: hand-computed replays, preemption, drops, time model, and the property that
the event-driven replay equals the plain step-by-step one."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.errors import KvsimError
from kvsim.scheduler import Engine, SchedulerConfig
from kvsim.simulate import _memory_for, simulate
from kvsim.workloads import Request, Workload, workload_from_lengths


def both(workload, **kw):
    """Run both replays, assert they agree exactly, return the step-by-step result."""
    a = simulate(workload, event_driven=False, **kw)
    b = simulate(workload, event_driven=True, **kw)
    pd.testing.assert_frame_equal(a.timeline, b.timeline)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary == b.summary
    return a


def test_single_request_paged_closed_form():
    # P=33, O=5, B=16: stores 33, 34, 35, 36 then finishes at step 4 (last token never stored)
    r = both(workload_from_lengths([33], [5]), strategy="paged", block_size=16, bytes_per_token=1, max_len=64)
    tl = r.timeline
    assert tl["step"].tolist() == [0, 1, 2, 3, 4]
    assert tl["live_bytes"].tolist() == [33, 34, 35, 36, 0]
    assert tl["allocated_bytes"].tolist() == [48, 48, 48, 48, 0]
    assert tl["internal_frag_bytes"].tolist() == [15, 14, 13, 12, 0]
    assert tl["finished"].tolist() == [0, 0, 0, 0, 1]
    assert (tl["reserved_bytes"] == 0).all() and (tl["external_frag_bytes"] == 0).all()
    assert r.summary.steps == 5 and r.summary.finished == 1


@pytest.mark.parametrize("strategy,reserve", [("oracle", 13), ("pow2", 16), ("reserve-max", 20)])
def test_reservation_split_closed_form(strategy, reserve):
    # P=10, O=4: final length 13; stored 10, 11, 12 then finished at step 3
    r = both(workload_from_lengths([10], [4]), strategy=strategy, bytes_per_token=1, max_len=20,
             num_blocks=2, block_size=16)  # 32 token slots
    tl = r.timeline
    assert tl["live_bytes"].tolist() == [10, 11, 12, 0]
    assert tl["allocated_bytes"].tolist() == [reserve] * 3 + [0]
    assert tl["reserved_bytes"].tolist() == [3, 2, 1, 0]
    assert tl["internal_frag_bytes"].tolist() == [reserve - 13] * 3 + [0]
    assert tl["free_bytes"].tolist() == [32 - reserve] * 3 + [32]
    s = r.summary
    total = 3 * reserve
    assert s.token_state_fraction == pytest.approx(33 / total)
    assert s.reservation_fraction == pytest.approx(6 / total)
    assert s.internal_fraction == pytest.approx(3 * (reserve - 13) / total)


def test_external_fragmentation_measured_in_arena():
    # arena of 10 slots; oracle: A (final 4), B (final 3), C (final 3) fit; A finishes first,
    # leaving a 4-slot hole at the front; D needs 6 slots: 4 + 0 free but no hole of 6
    reqs = [Request(0.0, 2, 3), Request(0.0, 2, 2), Request(0.0, 2, 9), Request(0.0, 3, 4)]
    # finals: 4, 3, 10 -> only A and B fit at first (4 + 3 = 7, C needs 10: waits)
    r = both(Workload("w", tuple(reqs)), strategy="oracle", bytes_per_token=1, max_len=16,
             num_blocks=10, block_size=1)
    tl = r.timeline
    # step 0: A, B run; C (10 slots) at the head waits; 3 free slots in one hole < 10
    assert tl.loc[0, "allocated_bytes"] == 7
    assert tl.loc[0, "external_frag_bytes"] == 3 and tl.loc[0, "free_bytes"] == 0
    assert r.summary.finished == 4 and r.summary.external_fraction > 0


def test_preemption_by_recompute_hand_case():
    # 4 blocks of 2 tokens; two requests P=2, O=4 (3 blocks each at the end)
    r = both(workload_from_lengths([2, 2], [4, 4]), strategy="paged", block_size=2, num_blocks=4,
             bytes_per_token=1, max_len=16)
    tl = r.timeline
    assert tl["preemptions"].tolist() == [0, 0, 0, 1, 1]
    assert tl["finished"].tolist() == [0, 0, 0, 1, 2]
    assert tl["running"].tolist() == [2, 2, 2, 0, 0]
    assert tl["waiting"].tolist() == [0, 0, 0, 1, 0]
    assert tl["live_bytes"].tolist() == [4, 6, 8, 0, 0]
    assert tl["allocated_bytes"].tolist() == [4, 8, 8, 0, 0]
    assert r.requests["preemptions"].tolist() == [0, 1]
    assert r.requests["finish_step"].tolist() == [3, 4]


def test_unservable_requests_are_dropped_not_waited_on():
    reqs = (Request(0.0, 10, 10), Request(0.0, 40, 1), Request(0.0, 5, 5, num_samples=9), Request(0.0, 3, 3))
    r = both(Workload("w", reqs), strategy="paged", block_size=4, num_blocks=8, bytes_per_token=1, max_len=64,
             scheduler=SchedulerConfig(max_num_seqs=8))
    s = r.summary
    assert s.finished == 2 and s.dropped == 2
    why = r.requests["dropped"].tolist()
    assert why[0] == "" and "blocks" in why[1] and "max_num_seqs" in why[2] and why[3] == ""
    r2 = both(Workload("w", reqs[:1] + (Request(0.0, 60, 10),)), strategy="reserve-max", bytes_per_token=1,
              max_len=64, num_blocks=8, block_size=4)
    assert r2.summary.dropped == 2  # 64 reserved slots > 32 in the arena; 69 > max_len


def test_parallel_sampling_shares_prompt_and_copies_on_write():
    w = Workload("w", (Request(0.0, 20, 3, num_samples=3),))
    r = both(w, strategy="paged", block_size=16, bytes_per_token=1, max_len=64)
    tl = r.timeline
    # step 0: prompt 20 tokens in 2 blocks shared by 3 tables (6 refs): 4 blocks saved
    assert tl.loc[0, "allocated_bytes"] == 32 and tl.loc[0, "live_bytes"] == 20
    assert tl.loc[0, "shared_saved_bytes"] == 4 * 16
    # step 1: the shared partial block is copied twice; block 0 stays shared (2 saved)
    assert tl.loc[1, "allocated_bytes"] == 4 * 16
    assert tl.loc[1, "live_bytes"] == 16 + 3 * 5
    assert tl.loc[1, "shared_saved_bytes"] == 2 * 16
    assert tl.loc[1, "running"] == 3


def test_prefix_caching_hits_shared_system_prompt():
    reqs = tuple(Request(0.0, 40, 2, shared_prefix_tokens=32) for _ in range(3))
    r = both(Workload("w", reqs), strategy="paged", prefix_caching=True, block_size=16, bytes_per_token=1, max_len=64)
    s = r.summary
    assert s.prefix_query_blocks == 3 * 3 and s.prefix_hit_blocks == 2 * 2
    off = both(Workload("w", reqs), strategy="paged", block_size=16, bytes_per_token=1, max_len=64).summary
    assert off.prefix_query_blocks == 0 and off.peak_allocated_bytes > s.peak_allocated_bytes


def test_time_model_latencies():
    w = workload_from_lengths([33, 10], [5, 1], arrival_s=[0.0, 10.0])
    r = both(w, strategy="paged", block_size=16, bytes_per_token=1, max_len=64, step_time_fn=lambda b: 0.5)
    tl = r.timeline
    # request 0 runs steps 0-4 (t = 0.5 .. 2.5); the engine idles until 10 s; request 1 runs one step
    assert tl["time_s"].tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 10.5]
    assert tl["step_time_s"].tolist() == [0.5] * 6
    q = r.requests
    assert q["ttft_s"].tolist() == pytest.approx([0.5, 0.5])
    assert q["e2e_s"].tolist() == pytest.approx([2.5, 0.5])
    assert q["normalized_latency_s"].tolist() == pytest.approx([0.5, 0.5])
    d = r.summary.to_dict()
    assert d["tpot_p50_s"] == pytest.approx(0.5)
    assert d["throughput_tokens_per_s"] == pytest.approx(6 / 10.5)


def test_step_time_fn_sees_the_batch():
    seen = []

    def fn(batch):
        seen.append((batch.prefill_tokens.tolist(), batch.decode_context_lens.tolist()))
        return 0.01

    both(workload_from_lengths([5, 7], [3, 2]), strategy="paged", block_size=4, bytes_per_token=1, max_len=64,
         step_time_fn=fn)
    # two replays each call fn per step: step 0 prefills 5 and 7; step 1 decodes both (6, 8); step 2 decodes the first
    assert seen[:3] == [([5, 7], []), ([], [6, 8]), ([], [7])]
    assert seen[3:] == seen[:3]


def test_untimed_arrivals_map_to_steps_and_idle_steps_are_rows():
    w = workload_from_lengths([4, 4], [2, 2], arrival_s=[0.0, 0.1])  # 0.1 s / 0.02 s per step = step 5
    r = both(w, strategy="paged", block_size=4, bytes_per_token=1, max_len=64)
    tl = r.timeline
    assert tl["time_s"].tolist() == list(map(float, range(7)))
    assert tl["running"].tolist() == [1, 0, 0, 0, 0, 1, 0]
    assert r.requests["first_step"].tolist() == [0, 5]


def test_bad_step_time_raises():
    with pytest.raises(KvsimError, match="finite"):
        simulate(workload_from_lengths([4], [2]), bytes_per_token=1, max_len=8, step_time_fn=lambda b: float("nan"))


def test_config_validation():
    with pytest.raises(KvsimError):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(KvsimError):
        SchedulerConfig(seconds_per_step=-1)


# ----- property: event-driven == step-by-step, pool clean afterwards -----------------------


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 10))
    reqs, t = [], 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.3]))
        samples = draw(st.sampled_from([1, 1, 1, 2, 3]))
        beam = draw(st.sampled_from([1, 1, 2, 3])) if samples == 1 else 1
        shared = draw(st.sampled_from([0, 0, 8, 17]))
        reqs.append(Request(t, shared + draw(st.integers(1, 30)), draw(st.integers(1, 30)), samples, beam,
                            shared_prefix_tokens=shared))
    return Workload("random", tuple(reqs))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=workloads(),
    strategy=st.sampled_from(["paged", "paged+prefix", "reserve-max", "pow2", "oracle"]),
    block_size=st.sampled_from([1, 2, 3, 4, 8, 16]),
    num_blocks=st.integers(2, 40),
    max_seqs=st.integers(1, 8),
    max_tokens=st.integers(1, 80),
    timed=st.booleans(),
)
def test_event_driven_equals_step_by_step(w, strategy, block_size, num_blocks, max_seqs, max_tokens, timed):
    fn = (lambda b: 0.01 + 0.001 * len(b.decode_context_lens) + 1e-4 * float(b.prefill_tokens.sum())) if timed else None
    kw = dict(strategy=strategy, block_size=block_size, num_blocks=num_blocks, bytes_per_token=3, max_len=96,
              scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens), step_time_fn=fn)
    r = both(w, **kw)
    s = r.summary
    assert s.finished + s.dropped == len(w)  # every request accounted for, no hang
    tl = r.timeline
    parts = tl["live_bytes"] + tl["reserved_bytes"] + tl["internal_frag_bytes"]
    assert (parts == tl["allocated_bytes"]).all()
    assert (tl["allocated_bytes"] + tl["external_frag_bytes"] + tl["free_bytes"] == tl["capacity_bytes"]).all()
    assert (tl[["live_bytes", "reserved_bytes", "internal_frag_bytes", "external_frag_bytes", "free_bytes"]] >= 0).all().all()
    if s.steps:
        assert s.token_state_fraction + s.reservation_fraction + s.internal_fraction + s.external_fraction == pytest.approx(1.0) \
            or s.peak_allocated_bytes == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), block_size=st.sampled_from([1, 2, 4, 16]), num_blocks=st.integers(4, 30),
       prefix=st.booleans(), events=st.booleans())
def test_pool_is_clean_after_a_replay(w, block_size, num_blocks, prefix, events):
    mem, _ = _memory_for("paged", prefix, w, block_size, 1, num_blocks, None, 96)
    eng = Engine(w, mem, SchedulerConfig(), 96, None, None)
    eng.run_events() if events else eng.run_steps()
    pool = mem.pool
    pool.check_invariants()
    assert pool.num_used_blocks == 0 and pool.num_live_tokens == 0 and pool.num_table_refs == 0


def test_event_driven_visits_only_event_steps():
    # not a timing assertion: the event-driven replay must visit far fewer steps. 50 requests,
    # P=100, O=400, B=16, all at once: admission at step 0, a block boundary whenever
    # 100 + t - 1 is a multiple of 16 (t = 13, 29, ..., 397: blocks 8..32 of ceil(499/16)),
    # the finish at step 399.
    w = workload_from_lengths([100] * 50, [400] * 50)
    visited = {}
    for events in (False, True):
        mem, _ = _memory_for("paged", False, w, 16, 1, None, None, 1024)
        eng = Engine(w, mem, SchedulerConfig(), 1024, None, None)
        log = eng.run_events() if events else eng.run_steps()
        visited[events] = eng.visited_steps
        assert len(log.rows["step"]) == 400
    assert visited == {False: 400, True: 1 + 25 + 1}


# ----- the event-driven fast paths: boundary-only windows, single-sequence admission ------


def test_boundary_window_is_cut_by_free_blocks():
    # 3 requests, P=4, O=60, B=4, all at once, 30 blocks: all three cross at the same steps
    # and need 16 blocks each at the end. The boundary-only window runs while a block is free
    # for every running sequence (27, 24, ..., 3 free before the crossing steps), then the
    # general path preempts the newest request.
    w = workload_from_lengths([4] * 3, [60] * 3)
    r = both(w, strategy="paged", block_size=4, num_blocks=30, bytes_per_token=1, max_len=128)
    assert r.summary.preemptions >= 1 and r.summary.finished == 3
    mem, _ = _memory_for("paged", False, w, 4, 1, 30, None, 128)
    eng = Engine(w, mem, SchedulerConfig(), 128, None, None)
    eng.run_events()
    # steps 1, 5, ..., 33 (27 free blocks, 3 a step) go through the window; step 37, with no
    # block free, through the general path, which preempts; later windows run again
    assert eng._cross_steps[:27] == [s for s in range(1, 34, 4) for _ in range(3)]
    assert 37 not in eng._cross_steps and len(eng._cross_steps) > 27
    mem.pool.check_invariants()


@st.composite
def long_single_workloads(draw):
    """Long-running one-sequence requests (the window path) with some arrivals spread out."""
    n = draw(st.integers(2, 12))
    reqs, t = [], 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.02, 0.1, 0.4]))
        shared = draw(st.sampled_from([0, 0, 8]))
        reqs.append(Request(t, shared + draw(st.integers(1, 40)), draw(st.integers(1, 120)),
                            shared_prefix_tokens=shared))
    return Workload("long", tuple(reqs))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=long_single_workloads(),
    prefix=st.booleans(),
    block_size=st.sampled_from([1, 2, 3, 4, 8]),
    num_blocks=st.integers(4, 80),
    max_seqs=st.integers(1, 12),
    timed=st.booleans(),
)
def test_event_driven_equals_step_by_step_long_single_sequences(w, prefix, block_size, num_blocks, max_seqs, timed):
    # tight memory: boundary windows end because free blocks run short, then preemptions;
    # with prefix caching the free stack empties and windows evict cached blocks
    fn = (lambda b: 0.01 + 0.001 * len(b.decode_context_lens)) if timed else None
    r = both(w, strategy="paged+prefix" if prefix else "paged", block_size=block_size, num_blocks=num_blocks,
             bytes_per_token=3, max_len=256, scheduler=SchedulerConfig(max_num_seqs=max_seqs), step_time_fn=fn)
    assert r.summary.finished + r.summary.dropped == len(w)
    mem, _ = _memory_for("paged", prefix, w, block_size, 3, num_blocks, None, 256)
    eng = Engine(w, mem, SchedulerConfig(max_num_seqs=max_seqs), 256, None, None)
    eng.run_events()
    mem.pool.check_invariants()
    assert mem.pool.num_used_blocks == 0
