"""A contiguous first-fit arena with coalescing: how pre-paging servers reserve KV memory.

Reservation strategies (``reserve-max``, ``pow2``, ``oracle``) give each request one
contiguous region of token slots, sized up front. When regions are freed in a different
order than they were taken, the free space splits into holes; a hole smaller than the next
reservation is *external fragmentation*. Modelling the arena (rather than assuming a
fragmentation ratio) makes that waste a measurement.

Units are token slots. Free space is kept as a sorted list of holes ``(start, size)``;
allocation scans for the first hole that fits (first fit) and freeing merges a region with
the holes on either side (coalescing). Hole counts stay small (at most one more than the
live regions), so the linear scan is cheap.
"""

from __future__ import annotations

import bisect

from kvsim.errors import KvsimError


class Arena:
    """``capacity`` contiguous token slots handed out as first-fit regions."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise KvsimError(f"arena capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity  # token slots in the arena
        self._starts: list[int] = [0]  # hole starts, ascending
        self._sizes: list[int] = [capacity]  # hole sizes, parallel to _starts
        self._regions: dict[int, int] = {}  # start -> size of each allocated region
        self.free_slots = capacity  # slots in holes

    @property
    def used_slots(self) -> int:
        return self.capacity - self.free_slots

    def holes(self) -> list[tuple[int, int]]:
        """Free holes as ``(start, size)``, by address."""
        return list(zip(self._starts, self._sizes))

    def regions(self) -> list[tuple[int, int]]:
        """Allocated regions as ``(start, size)``, by address."""
        return sorted(self._regions.items())

    @property
    def largest_hole(self) -> int:
        return max(self._sizes, default=0)

    def fits(self, size: int) -> bool:
        """Whether a region of ``size`` slots can be allocated now."""
        return any(h >= size for h in self._sizes)

    def allocate(self, size: int) -> int | None:
        """First-fit region of ``size`` slots; its start, or ``None`` if no hole is large enough."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise KvsimError(f"region size must be a positive integer, got {size!r}")
        for i, hole in enumerate(self._sizes):
            if hole >= size:
                start = self._starts[i]
                if hole == size:
                    del self._starts[i]
                    del self._sizes[i]
                else:
                    self._starts[i] = start + size
                    self._sizes[i] = hole - size
                self._regions[start] = size
                self.free_slots -= size
                return start
        return None

    def free(self, start: int) -> None:
        """Release the region starting at ``start``, merging it with neighbouring holes."""
        size = self._regions.pop(start, None)
        if size is None:
            raise KvsimError(f"no allocated region starts at slot {start!r} (never allocated or already freed)")
        self.free_slots += size
        i = bisect.bisect_left(self._starts, start)
        end = start + size
        merge_next = i < len(self._starts) and self._starts[i] == end
        merge_prev = i > 0 and self._starts[i - 1] + self._sizes[i - 1] == start
        if merge_prev and merge_next:
            self._sizes[i - 1] += size + self._sizes[i]
            del self._starts[i]
            del self._sizes[i]
        elif merge_prev:
            self._sizes[i - 1] += size
        elif merge_next:
            self._starts[i] = start
            self._sizes[i] += size
        else:
            self._starts.insert(i, start)
            self._sizes.insert(i, size)

    def unusable_slots(self, size: int) -> int:
        """Free slots in holes too small for a region of ``size`` (external fragmentation)."""
        return sum(h for h in self._sizes if h < size)

    def check_invariants(self) -> None:
        """Holes and regions tile ``[0, capacity)`` exactly, holes never touch."""
        spans = sorted([*self.holes(), *self._regions.items()])
        pos = 0
        for start, size in spans:
            assert start == pos and size > 0, "arena has a gap or overlap"
            pos += size
        assert pos == self.capacity
        for (s0, z0), (s1, _) in zip(self.holes(), self.holes()[1:]):
            assert s0 + z0 < s1, "adjacent holes not coalesced"
        assert self.free_slots == sum(self._sizes)


__all__ = ["Arena"]
