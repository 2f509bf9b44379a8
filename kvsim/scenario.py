"""A small block-table scenario, stepped event by event, for a picture of paged KV memory.

:func:`seed_scenario` returns the list of :class:`PoolSnapshot` s of a fixed story on a
16-block pool with 16-token blocks: it opens on the seed's picture (request A, 33 tokens,
logical blocks 0, 1, 2 in physical blocks 7, 2, 11), then B arrives sharing A's 32-token
system prompt through the prefix cache, A grows, forks a second sample that diverges by
copy-on-write, B crosses a block boundary, and everything finishes (cached blocks stay
cached, free).

A page steps through it with a slider: ``snaps = seed_scenario(); snap = snaps[i]``; each
snapshot has ``caption``, ``blocks`` (per physical block: owners by name, ref count,
filled slots, cached flag), ``tables`` (sequence name -> physical block per logical
block), ``tokens`` (sequence name -> tokens stored) and ``copies`` (copy-on-write
``(src, dst)`` pairs the event made).

:class:`ScenarioRecorder` builds other stories the same way: each of ``allocate``,
``append``, ``fork`` and ``free`` runs the operation on a real :class:`BlockPool` and
returns the snapshot after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvsim.blockpool import BlockPool
from kvsim.errors import KvsimError


@dataclass(frozen=True)
class BlockCell:
    """One physical block in a snapshot."""

    block_id: int
    owners: tuple[str, ...]  # sequence names whose tables point here
    ref_count: int
    filled: int  # token slots written (a free cached block counts as full)
    cached: bool  # holds a prefix-cache key


@dataclass(frozen=True)
class PoolSnapshot:
    """The pool after one scenario event."""

    index: int  # event number, 0-based
    caption: str  # what happened, one line
    num_blocks: int
    block_size: int
    blocks: tuple[BlockCell, ...]  # one per physical block, by id
    tables: dict[str, tuple[int, ...]]  # sequence -> physical block of each logical block
    tokens: dict[str, int]  # sequence -> tokens stored
    copies: tuple[tuple[int, int], ...]  # copy-on-write (src, dst) made by this event
    num_free_blocks: int

    @property
    def shared_blocks(self) -> list[int]:
        """Blocks referenced by more than one table."""
        return [c.block_id for c in self.blocks if c.ref_count > 1]


class ScenarioRecorder:
    """Runs named sequences on a :class:`BlockPool` and snapshots it after each event."""

    def __init__(self, num_blocks: int = 16, block_size: int = 16, *, prefix_caching: bool = True,
                 initial_free_order: Sequence[int] | None = None) -> None:
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching=prefix_caching,
                              initial_free_order=initial_free_order)
        self._ids: dict[str, int] = {}
        self._next = 0
        self.snapshots: list[PoolSnapshot] = []

    def _id(self, name: str, new: bool = False) -> int:
        if new:
            if name in self._ids:
                raise KvsimError(f"sequence {name!r} already exists")
            self._ids[name] = self._next
            self._next += 1
        if name not in self._ids:
            raise KvsimError(f"no sequence named {name!r}")
        return self._ids[name]

    def snapshot(self, caption: str, copies: Sequence[tuple[int, int]] = ()) -> PoolSnapshot:
        pool = self.pool
        names = {v: k for k, v in self._ids.items()}
        cells = tuple(
            BlockCell(b.block_id, tuple(names[o] for o in b.owners), b.ref_count, b.filled, b.cached)
            for b in pool.blocks()
        )
        live = [n for n, i in self._ids.items() if i in pool]
        snap = PoolSnapshot(
            index=len(self.snapshots), caption=caption, num_blocks=pool.num_blocks, block_size=pool.block_size,
            blocks=cells, tables={n: pool.block_table(self._ids[n]) for n in live},
            tokens={n: pool.num_tokens(self._ids[n]) for n in live}, copies=tuple(copies),
            num_free_blocks=pool.num_free_blocks,
        )
        self.snapshots.append(snap)
        return snap

    def allocate(self, name: str, token_ids: Sequence[int], caption: str) -> PoolSnapshot:
        sid = self._id(name, new=True)
        self.pool.allocate(sid, len(token_ids), token_ids=list(token_ids))
        return self.snapshot(caption)

    def append(self, name: str, num_tokens: int, caption: str) -> PoolSnapshot:
        copies = self.pool.append_tokens(self._id(name), num_tokens)
        return self.snapshot(caption, copies)

    def fork(self, parent: str, child: str, caption: str) -> PoolSnapshot:
        pid = self._id(parent)
        self.pool.fork(pid, self._id(child, new=True))
        return self.snapshot(caption)

    def free(self, name: str, caption: str) -> PoolSnapshot:
        self.pool.free(self._id(name))
        return self.snapshot(caption)


#: Physical blocks handed out first, so the scenario opens on the seed's picture.
SEED_FREE_ORDER = (7, 2, 11, 4, 14, 0, 9, 5, 12, 1, 15, 3, 8, 13, 6, 10)


def seed_scenario() -> list[PoolSnapshot]:
    """The fixed story described in the module docstring (16 blocks of 16 tokens)."""
    rec = ScenarioRecorder(16, 16, prefix_caching=True, initial_free_order=SEED_FREE_ORDER)
    system = list(range(32))  # a 32-token system prompt: two full blocks
    rec.allocate("A", system + [1000],
                 "A arrives with 33 tokens: logical blocks 0, 1, 2 map to physical 7, 2, 11 (15 slots of 11 empty)")
    rec.allocate("B", system + [2000, 2001, 2002, 2003, 2004],
                 "B arrives with the same 32-token system prompt: its blocks 0, 1 are prefix-cache hits (7, 2 now shared)")
    rec.append("A", 7, "A generates 7 tokens: they fill slots of its last block 11, no new block")
    rec.fork("A", "A2", "A forks a second sample A2: it shares all of A's blocks (reference counts go up)")
    rec.append("A2", 1, "A2 writes its first own token: block 11 is shared and partly filled, so it is copied (copy-on-write)")
    rec.append("A", 1, "A writes in place: it is now the only owner of block 11")
    rec.append("B", 12, "B grows past 48 tokens and takes a new block")
    rec.free("A", "A finishes: blocks only A held are freed; shared ones stay with A2 and B")
    rec.free("A2", "A2 finishes")
    rec.free("B", "B finishes: all blocks are free; the system prompt's blocks stay cached for the next request")
    return rec.snapshots


__all__ = ["BlockCell", "PoolSnapshot", "ScenarioRecorder", "seed_scenario", "SEED_FREE_ORDER"]
