"""The paged KV block pool: physical blocks, reference counts, fork, copy-on-write and a
hash-chained prefix cache with LRU eviction.

A :class:`BlockPool` owns ``num_blocks`` physical blocks of ``block_size`` token slots.
Each sequence has a *block table*: logical block ``i`` (tokens ``[i*B, (i+1)*B)``) lives in
physical block ``table[i]``. Blocks are reference counted so that several sequences can
share one (a forked sample, a cached prompt prefix):

- :meth:`BlockPool.allocate` gives a new sequence the blocks for its prompt, reusing cached
  blocks when prefix caching is on;
- :meth:`BlockPool.append_tokens` grows a sequence, taking a new block at each block
  boundary; if the sequence's last block is partly filled *and shared*, it is first copied
  to a private block (copy-on-write) and the copy is returned as ``(src, dst)``, so an
  engine can copy the K/V slots;
- :meth:`BlockPool.fork` makes a child sequence sharing all its parent's blocks;
- :meth:`BlockPool.free` drops a sequence's references; blocks whose count reaches zero go
  back to the free queue.

Free queue. Free blocks are handed out in a fixed order: first those holding nothing worth
keeping (a stack, so the most recently freed is reused first), then free blocks that still
hold a cached prefix, least recently freed first (an ``OrderedDict`` used as an LRU list).
Popping, appending and removing a cached block from the middle of the queue (a prefix-cache
hit on a free block, which must take it out of the queue) are all O(1); a ``deque.remove``
would make that last one O(n). Keeping uncached blocks in front means a cached prefix is
evicted only when nothing else is free.

Prefix caching. A full block's key covers its tokens *and* its parent's key (a hash
chain), so equal keys mean an equal token prefix. Keys come from token ids
(:func:`token_block_keys`) or from externally supplied block hashes such as the Mooncake
traces' ``hash_ids`` (:func:`external_block_keys`). Only full blocks are cached, and the
last prompt token is always recomputed (at most ``(num_tokens - 1) // block_size`` blocks
can hit), as in vLLM: the engine needs that token's logits. A cached block stays cached
when freed until the free queue hands it out again (LRU eviction).

Mistakes (an unknown or already freed sequence, a duplicate id, asking for more blocks
than are free) raise :class:`KvsimError` subclasses; :meth:`BlockPool.check_invariants`
asserts the internal bookkeeping (free + used == total, reference counts equal block-table
references, the free queue and the cache map agree).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from kvsim.errors import KvsimError


class PoolExhausted(KvsimError):
    """The pool has fewer free blocks than an allocation or append needs."""


class UnknownSequence(KvsimError):
    """A sequence id the pool does not hold (never allocated, or already freed)."""


@dataclass(frozen=True)
class BlockInfo:
    """One physical block as a picture of the pool shows it."""

    block_id: int  # physical block index
    ref_count: int  # block-table references (0: free)
    filled: int  # token slots written (0..block_size)
    owners: tuple[int, ...]  # sequence ids whose tables point here, ascending
    cached: bool  # holds a prefix-cache key (may be free and still hit later)


@dataclass(frozen=True)
class AllocResult:
    """What :meth:`BlockPool.allocate` did for one sequence."""

    num_blocks: int  # blocks in the new table
    num_cached_blocks: int  # of those, prefix-cache hits (not recomputed)
    num_new_blocks: int  # blocks taken from the free queue
    num_cached_tokens: int  # num_cached_blocks * block_size: prompt tokens not recomputed


class _Seq:
    """A sequence's block table and length (internal)."""

    __slots__ = ("table", "num_tokens", "exclusive")

    def __init__(self, table: list[int], num_tokens: int, exclusive: bool = False) -> None:
        self.table = table  # physical block id per logical block
        self.num_tokens = num_tokens  # tokens stored
        self.exclusive = exclusive  # every block has reference count 1 and no cache key


def token_block_keys(token_ids: Sequence[int], block_size: int, parent: Hashable = None) -> list[Hashable]:
    """Hash-chained keys of the *full* blocks of ``token_ids``.

    Key ``i`` is ``hash((key[i-1], tokens of block i))``: it covers the block's tokens and,
    through its parent, every token before them.
    """
    keys: list[Hashable] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + block_size])))
        keys.append(parent)
    return keys


def external_block_keys(
    hash_ids: Sequence[int], hash_block_size: int, block_size: int, num_tokens: int
) -> list[Hashable]:
    """Keys of the full ``block_size`` blocks of a prompt described by chained block hashes.

    ``hash_ids[j]`` covers tokens ``[j*H, (j+1)*H)`` and everything before (Mooncake's
    ``hash_ids``, ``H = 512``). When ``block_size`` divides ``H``, sub-block ``k`` of hash
    block ``j`` is keyed ``(hash_ids[j], k)`` (equal keys imply an equal prefix; a prefix
    that diverges inside hash block ``j`` is conservatively missed). When ``block_size`` is
    a multiple of ``H``, block ``i`` is keyed by the last hash id it covers. Other block
    sizes cannot be mapped and raise :class:`KvsimError`.
    """
    B, H = block_size, hash_block_size
    num_full = num_tokens // B
    if B <= H:
        if H % B:
            raise KvsimError(f"block size {B} does not divide the trace's {H}-token hash blocks")
        per = H // B
        keys = []
        for i in range(num_full):
            j = i // per
            if j >= len(hash_ids):
                break
            keys.append((hash_ids[j], i % per) if per > 1 else hash_ids[j])
        return keys
    if B % H:
        raise KvsimError(f"block size {B} is not a multiple of the trace's {H}-token hash blocks")
    per = B // H
    return [hash_ids[(i + 1) * per - 1] for i in range(num_full) if (i + 1) * per - 1 < len(hash_ids)]


class BlockPool:
    """Physical KV blocks shared by reference-counted block tables.

    ``initial_free_order`` (a permutation of the block ids) sets which blocks are handed
    out first; by default ascending ids.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = False,
        initial_free_order: Sequence[int] | None = None,
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise KvsimError(f"number of blocks must be a positive integer, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise KvsimError(f"block size must be a positive integer, got {block_size!r}")
        self.num_blocks = num_blocks  # physical blocks in the pool
        self.block_size = block_size  # token slots per block
        self.enable_prefix_caching = bool(enable_prefix_caching)
        n = num_blocks
        self._ref = [0] * n  # reference count per block (0: in the free queue)
        self._key: list[Hashable] = [None] * n  # prefix-cache key held by the block, or None
        self._cached: dict[Hashable, int] = {}  # key -> block holding it
        self._seqs: dict[int, _Seq] = {}
        # Free queue, in two parts (see the module docstring): a stack of blocks holding
        # nothing worth keeping (top = next handed out) and an LRU of cached blocks.
        order = list(range(n)) if initial_free_order is None else [int(b) for b in initial_free_order]
        if sorted(order) != list(range(n)):
            raise KvsimError("initial_free_order must be a permutation of the block ids")
        self._free_plain: list[int] = order[::-1]
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # first = least recently freed
        self.num_free_blocks = n  # blocks in the free queue (cached or not)
        self.num_live_tokens = 0  # written slots summed over used blocks (each block once)
        self.num_table_refs = 0  # block-table entries summed over sequences
        self.prefix_query_blocks = 0  # prompt blocks looked up in the prefix cache
        self.prefix_hit_blocks = 0  # of those, served from the cache
        self.num_cow_copies = 0  # copy-on-write copies made

    # ----- free queue (O(1) per block) ---------------------------------------------------

    def _unlink(self, b: int) -> None:
        """Remove a free cached block from the middle of the LRU (a prefix-cache hit)."""
        del self._free_cached[b]
        self.num_free_blocks -= 1

    def _take(self, k: int) -> list[int]:
        """Pop ``k`` free blocks, uncached ones first, then least recently used cached ones
        (evicting their keys); each gets reference count 1."""
        assert k <= self.num_free_blocks, "free queue too short"
        plain = self._free_plain
        if k <= len(plain):
            out = plain[-k:] if k else []
            del plain[len(plain) - k:]
            out.reverse()
        else:
            out = plain[::-1]
            plain.clear()
            lru, key, cached = self._free_cached, self._key, self._cached
            for _ in range(k - len(out)):
                b = lru.popitem(last=False)[0]
                del cached[key[b]]
                key[b] = None
                out.append(b)
        ref = self._ref
        for b in out:  # a plain loop: faster than map(ref.__setitem__, ...) on CPython 3.11+
            ref[b] = 1
        self.num_free_blocks -= k
        return out

    def free_queue(self) -> list[int]:
        """Free block ids in the order they will be handed out."""
        return self._free_plain[::-1] + list(self._free_cached)

    # ----- queries ---------------------------------------------------------------------

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def _get(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise UnknownSequence(f"sequence {seq_id!r} is not in the pool (never allocated or already freed)") from None

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Physical block of each logical block of ``seq_id``."""
        return tuple(self._get(seq_id).table)

    def num_tokens(self, seq_id: int) -> int:
        return self._get(seq_id).num_tokens

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _filled_by_tables(self) -> tuple[list[int], list[list[int]]]:
        """Written slots and owners of every block, derived from the block tables."""
        B = self.block_size
        filled = [0] * self.num_blocks
        owners: list[list[int]] = [[] for _ in range(self.num_blocks)]
        for sid in sorted(self._seqs):
            s = self._seqs[sid]
            last = len(s.table) - 1
            for i, b in enumerate(s.table):
                f = B if i < last else s.num_tokens - i * B
                assert not owners[b] or filled[b] == f, f"owners of block {b} disagree on its fill"
                filled[b] = f
                if not owners[b] or owners[b][-1] != sid:
                    owners[b].append(sid)
        return filled, owners

    def blocks(self) -> list[BlockInfo]:
        """Every physical block with its owners, for a picture of the pool (O(total)).

        A free block shows 0 slots filled unless it still holds a cached prefix (full).
        """
        filled, owners = self._filled_by_tables()
        return [
            BlockInfo(b, self._ref[b], filled[b] if self._ref[b] else (self.block_size if self._key[b] is not None else 0),
                      tuple(owners[b]), self._key[b] is not None)
            for b in range(self.num_blocks)
        ]

    # ----- prefix cache ----------------------------------------------------------------

    def _count_hits(self, num_tokens: int, keys: Sequence[Hashable] | None) -> int:
        if not self.enable_prefix_caching or not keys:
            return 0
        limit = min(len(keys), max(0, num_tokens - 1) // self.block_size)
        hits = 0
        cached = self._cached
        while hits < limit and keys[hits] in cached:
            hits += 1
        return hits

    def cached_prefix_blocks(self, num_tokens: int, block_keys: Sequence[Hashable] | None) -> int:
        """Leading blocks of a prompt that :meth:`allocate` would take from the cache now."""
        return self._count_hits(num_tokens, block_keys)

    def can_allocate(self, num_tokens: int, block_keys: Sequence[Hashable] | None = None) -> bool:
        """Whether :meth:`allocate` would succeed now (prefix hits counted)."""
        hits = self._count_hits(num_tokens, block_keys)
        hit_free = sum(1 for i in range(hits) if self._ref[self._cached[block_keys[i]]] == 0)
        return self.blocks_needed(num_tokens) - hits + hit_free <= self.num_free_blocks

    # ----- operations ------------------------------------------------------------------

    def allocate(
        self,
        seq_id: int,
        num_tokens: int,
        *,
        block_keys: Sequence[Hashable] | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> AllocResult:
        """Give a new sequence the blocks for its first ``num_tokens`` tokens (a prompt).

        With prefix caching on, leading full blocks whose keys are cached are shared
        instead of allocated (never the block holding the last token), and the new full
        blocks are registered under their keys. Keys come from ``block_keys`` (one per
        full block, e.g. :func:`external_block_keys`) or are computed from ``token_ids``.
        Prompt blocks count as queries (``ceil(num_tokens / B)``) and hits in
        ``prefix_query_blocks`` / ``prefix_hit_blocks``.
        """
        if seq_id in self._seqs:
            raise KvsimError(f"sequence {seq_id!r} is already in the pool")
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise KvsimError(f"number of tokens must be a non-negative integer, got {num_tokens!r}")
        if token_ids is not None:
            if len(token_ids) != num_tokens:
                raise KvsimError(f"{len(token_ids)} token ids given for {num_tokens} tokens")
            if block_keys is None and self.enable_prefix_caching:
                block_keys = token_block_keys(token_ids, self.block_size)
        B = self.block_size
        total = -(-num_tokens // B)
        hits = self._count_hits(num_tokens, block_keys)
        hit_blocks = [self._cached[block_keys[i]] for i in range(hits)]  # type: ignore[index]
        hit_free = sum(1 for b in hit_blocks if self._ref[b] == 0)
        new = total - hits
        if new + hit_free > self.num_free_blocks:
            raise PoolExhausted(
                f"sequence {seq_id!r} needs {new + hit_free} free blocks, the pool has {self.num_free_blocks}"
            )
        ref = self._ref
        for b in hit_blocks:
            if ref[b] == 0:
                self._unlink(b)
                self.num_live_tokens += B  # a cached block is full
            ref[b] += 1
        table = hit_blocks + self._take(new) if new else hit_blocks
        self.num_live_tokens += num_tokens - hits * B
        if self.enable_prefix_caching:
            self.prefix_query_blocks += total
            self.prefix_hit_blocks += hits
            if block_keys:
                for i in range(hits, min(num_tokens // B, len(block_keys))):
                    key = block_keys[i]
                    if key not in self._cached:
                        self._cached[key] = table[i]
                        self._key[table[i]] = key
        self._seqs[seq_id] = _Seq(table, num_tokens, exclusive=not self.enable_prefix_caching)
        self.num_table_refs += total
        return AllocResult(total, hits, new, hits * B)

    def allocate_uncached(self, seq_id: int, num_tokens: int) -> None:
        """:meth:`allocate` without prefix caching, for the simulator's hot loop: the same
        blocks, table and counters, but no :class:`AllocResult` and fewer checks (the pool
        must have prefix caching off; ``num_tokens`` is a non-negative int)."""
        if self.enable_prefix_caching:
            raise KvsimError("allocate_uncached needs a pool without prefix caching")
        if seq_id in self._seqs:
            raise KvsimError(f"sequence {seq_id!r} is already in the pool")
        total = -(-num_tokens // self.block_size)
        if total > self.num_free_blocks:
            raise PoolExhausted(f"sequence {seq_id!r} needs {total} free blocks, the pool has {self.num_free_blocks}")
        self._seqs[seq_id] = _Seq(self._take(total) if total else [], num_tokens, exclusive=True)
        self.num_live_tokens += num_tokens
        self.num_table_refs += total

    def append_slots_needed(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks :meth:`append_tokens` would take (new blocks plus a copy-on-write)."""
        s = self._get(seq_id)
        B = self.block_size
        partial = s.num_tokens % B
        room = B - partial if partial else 0
        need = -(-max(0, num_tokens - room) // B)
        if partial and num_tokens > 0 and self._ref[s.table[-1]] > 1:
            need += 1
        return need

    def append_tokens(self, seq_id: int, num_tokens: int = 1) -> list[tuple[int, int]]:
        """Store ``num_tokens`` more tokens of ``seq_id``; return copy-on-write copies.

        A partly filled last block shared with another sequence is first copied to a
        private block: the return value lists ``(src, dst)`` block pairs to copy. Raises
        :class:`PoolExhausted` (changing nothing) when the free blocks do not suffice.
        """
        if num_tokens.__class__ is not int or num_tokens < 0:
            raise KvsimError(f"number of tokens must be a non-negative integer, got {num_tokens!r}")
        s = self._seqs.get(seq_id)
        if s is None:
            self._get(seq_id)  # raises UnknownSequence
        B = self.block_size
        partial = s.num_tokens % B
        cow = partial and num_tokens > 0 and self._ref[s.table[-1]] > 1
        remaining = num_tokens - (B - partial) if partial else num_tokens
        new = -(-remaining // B) if remaining > 0 else 0
        if new + cow > self.num_free_blocks:
            raise PoolExhausted(
                f"sequence {seq_id!r} needs {new + cow} free blocks to grow by {num_tokens} tokens, "
                f"the pool has {self.num_free_blocks}"
            )
        copies: list[tuple[int, int]] = []
        if cow:  # the partly filled last block is shared: copy it first
            last = s.table[-1]
            dst = self._take(1)[0]
            self.num_live_tokens += partial
            self._ref[last] -= 1
            s.table[-1] = dst
            copies.append((last, dst))
            self.num_cow_copies += 1
        if new:
            s.table.extend(self._take(new) if new > 1 else self._take1())
            self.num_table_refs += new
        self.num_live_tokens += num_tokens
        s.num_tokens += num_tokens
        return copies

    def grow_into_new_block(self, seq_id: int, num_tokens: int) -> None:
        """Fast path of :meth:`append_tokens` for the simulator's hot loop: the sequence's
        last block is full or privately owned and ``num_tokens`` fill it and start exactly
        one new block (the caller knows this from the block arithmetic)."""
        s = self._seqs[seq_id]
        if not self.num_free_blocks:
            raise PoolExhausted(f"sequence {seq_id!r} needs 1 free block, the pool has none")
        if self._free_plain:
            b = self._free_plain.pop()
            self._ref[b] = 1
            self.num_free_blocks -= 1
        else:
            b = self._take(1)[0]
        s.table.append(b)
        self.num_table_refs += 1
        self.num_live_tokens += num_tokens
        s.num_tokens += num_tokens

    def grow_many_into_new_blocks(self, seq_ids: Sequence[int], num_tokens: Sequence[int]) -> None:
        """:meth:`grow_into_new_block` for several sequences at once (one new block each), in
        order; the caller has checked that enough blocks are free."""
        if len(seq_ids) > self.num_free_blocks:
            raise PoolExhausted(f"{len(seq_ids)} sequences need a block each, the pool has {self.num_free_blocks}")
        seqs, plain, ref = self._seqs, self._free_plain, self._ref
        for sid, k in zip(seq_ids, num_tokens):
            s = seqs[sid]
            if plain:
                b = plain.pop()
                ref[b] = 1
            else:
                self.num_free_blocks += 1  # _take counts it
                b = self._take(1)[0]
            s.table.append(b)
            s.num_tokens += k
        n = len(seq_ids)
        self.num_free_blocks -= n
        self.num_table_refs += n
        self.num_live_tokens += sum(num_tokens)

    def _take1(self) -> list[int]:
        """:meth:`_take` of one block, the common case of a sequence crossing a boundary."""
        if self._free_plain:
            b = self._free_plain.pop()
            self._ref[b] = 1
            self.num_free_blocks -= 1
            return [b]
        return self._take(1)

    def fork(self, parent_id: int, child_id: int) -> None:
        """Make ``child_id`` share every block of ``parent_id`` (parallel sampling, beams)."""
        parent = self._get(parent_id)
        if child_id in self._seqs:
            raise KvsimError(f"sequence {child_id!r} is already in the pool")
        for b in parent.table:
            self._ref[b] += 1
        self.num_table_refs += len(parent.table)
        parent.exclusive = False
        self._seqs[child_id] = _Seq(list(parent.table), parent.num_tokens)

    def free(self, seq_id: int) -> None:
        """Drop ``seq_id``'s references; blocks no longer referenced become free.

        Blocks are released tail first. A released block holding a cached key goes to the
        tail of the free queue (evicted last-recently-used first); others go to the head.
        """
        s = self._seqs.pop(seq_id, None)
        if s is None:
            raise UnknownSequence(f"cannot free sequence {seq_id!r}: not in the pool (never allocated or already freed)")
        ref, key = self._ref, self._key
        B = self.block_size
        table = s.table
        if s.exclusive:  # fast path: every block is released, none is cached
            for b in table:
                ref[b] = 0
            self._free_plain.extend(reversed(table))
            self.num_free_blocks += len(table)
            self.num_live_tokens -= s.num_tokens
            self.num_table_refs -= len(table)
            return
        to_head: list[int] = []
        to_tail: list[int] = []
        table = s.table
        for b in reversed(table):
            ref[b] -= 1
            if ref[b] == 0:
                (to_tail if key[b] is not None else to_head).append(b)
        released = len(to_head) + len(to_tail)
        if released:
            live = released * B
            partial = s.num_tokens % B
            if partial and ref[table[-1]] == 0:
                live -= B - partial
            self.num_live_tokens -= live
            self._free_plain.extend(to_head)  # the sequence's first block ends on top
            if to_tail:
                self._free_cached.update(dict.fromkeys(to_tail))
            self.num_free_blocks += released
        self.num_table_refs -= len(table)

    def reset_prefix_stats(self) -> None:
        self.prefix_query_blocks = 0
        self.prefix_hit_blocks = 0

    # ----- invariants ------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert the bookkeeping from scratch (tests call this after every operation)."""
        n, B = self.num_blocks, self.block_size
        refs = [0] * n
        for s in self._seqs.values():
            assert len(s.table) == -(-s.num_tokens // B), "table length != ceil(tokens / B)"
            for b in s.table:
                refs[b] += 1
        assert refs == self._ref, "reference counts differ from block-table references"
        filled, _ = self._filled_by_tables()
        free = self.free_queue()
        assert len(free) == len(set(free)) == self.num_free_blocks, "free queue corrupt"
        assert set(free) == {b for b in range(n) if refs[b] == 0}, "free queue != unreferenced blocks"
        assert all(self._key[b] is None for b in self._free_plain), "a cached block in the plain free stack"
        assert all(self._key[b] is not None for b in self._free_cached), "an uncached block in the LRU"
        assert self.num_free_blocks + sum(1 for r in refs if r) == n, "free + used != total"
        assert self.num_table_refs == sum(refs)
        assert self.num_live_tokens == sum(filled[b] for b in range(n) if refs[b]), "live token count drifted"
        for key, b in self._cached.items():
            assert self._key[b] == key, "cache map and block keys disagree"
            assert refs[b] == 0 or filled[b] == B, "a cached block is not full"
        assert sum(1 for k in self._key if k is not None) == len(self._cached)


__all__ = [
    "BlockPool", "BlockInfo", "AllocResult", "PoolExhausted", "UnknownSequence",
    "token_block_keys", "external_block_keys",
]
