"""Arena: first fit, coalescing, external fragmentation, against a brute-force slot map."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.arena import Arena
from kvsim.errors import KvsimError


def test_first_fit_and_coalescing():
    a = Arena(10)
    x = a.allocate(3)
    y = a.allocate(3)
    z = a.allocate(3)
    assert (x, y, z) == (0, 3, 6) and a.free_slots == 1
    a.free(y)
    assert a.holes() == [(3, 3), (9, 1)]
    assert a.allocate(4) is None  # 4 slots free in total, but no hole of 4: external fragmentation
    assert a.unusable_slots(4) == 4
    assert a.allocate(2) == 3  # first fit
    a.free(x)
    assert a.holes() == [(0, 3), (5, 1), (9, 1)]
    a.free(3)
    assert a.holes() == [(0, 6), (9, 1)]  # merged with the previous hole
    a.free(z)
    assert a.holes() == [(0, 10)] and a.free_slots == 10
    a.check_invariants()


def test_misuse_raises():
    a = Arena(4)
    with pytest.raises(KvsimError):
        a.free(0)
    with pytest.raises(KvsimError):
        a.allocate(0)
    with pytest.raises(KvsimError):
        Arena(0)
    s = a.allocate(2)
    a.free(s)
    with pytest.raises(KvsimError, match="already freed"):
        a.free(s)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=60))
def test_matches_brute_force_first_fit(ops):
    cap = 40
    a = Arena(cap)
    slots = [None] * cap  # owner per slot
    live: list[int] = []
    for i, (do_alloc, size) in enumerate(ops):
        if do_alloc or not live:
            # brute force: lowest start with `size` consecutive free slots
            want = next((s for s in range(cap - size + 1) if all(v is None for v in slots[s:s + size])), None)
            got = a.allocate(size)
            assert got == want
            if got is not None:
                slots[got:got + size] = [got] * size
                live.append(got)
        else:
            start = live.pop(size % len(live))
            a.free(start)
            slots = [None if v == start else v for v in slots]
        a.check_invariants()
        assert a.free_slots == slots.count(None)
        # unusable slots for a request of `size`: free runs shorter than it
        runs, run = [], 0
        for v in slots + ["end"]:
            if v is None:
                run += 1
            else:
                if run:
                    runs.append(run)
                run = 0
        assert a.unusable_slots(size) == sum(r for r in runs if r < size)
        assert a.largest_hole == max(runs, default=0)
