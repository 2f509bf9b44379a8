"""The live engine's KV storage, poisoned so that what it holds can be *counted from the tensor*.

Two stores, measured the same way:

- :class:`PagedKVCache`: one key and one value tensor per layer in the kernels' layout
  ``[num_blocks, block_size, num_kv_heads, head_dim]`` (allocated once, as a serving
  engine's pool is);
- :class:`ContiguousKVCache`: per request, a key and a value tensor of ``max_len`` token
  slots ``[num_layers, max_len, num_kv_heads, head_dim]``, allocated on admission and
  dropped on finish (the max-length reservation).

Poison. Every K and V slot that holds no token is NaN: the whole pool at creation, a
block when the engine takes it from the free queue (it may hold a stale evicted prefix)
and when it returns to the free queue, a reservation when it is created. Any read of a
slot inside a sequence's visible range that was never written gives a NaN output; the
kernels never touch slots outside that range (``tests/kernels/test_poisoned_slots.py``).

What is measured (:meth:`PagedKVCache.measure`), per layer, from the key tensor alone:

- a *written slot* is a token slot whose key has no NaN element;
- ``live_bytes`` = sum over layers of written slots x ``2 * num_kv_heads * head_dim *
  element_size`` (K and V of one token in one layer) - the calculator's *live* bytes;
- ``allocated_bytes`` = sum over layers of blocks holding at least one written slot x
  ``block_size`` x the same - the calculator's *allocated* bytes (a block taken but not yet
  written counts as empty: measurement happens between steps, when none is);
- ``layers_agree``: every layer has the same written slots (each step writes all layers).

Nothing here reads the block pool's counters. The only allocator state the measurement
may take is a set of blocks to leave out: free blocks the prefix cache keeps (their K/V
stays, to be hit later; a serving engine counts them as free), see ``exclude_blocks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """fp32 / fp16 / bf16 -> the torch dtype the cache and model use."""
    from kvsim.errors import KvsimError

    key = str(name).strip().lower()
    if key not in _DTYPES:
        raise KvsimError(f"live mode runs fp32, fp16 or bf16, got {name!r}")
    return _DTYPES[key]


def value_poison(dtype: torch.dtype) -> float:
    """What unwritten V slots hold: NaN, like unwritten K slots."""
    return float("nan")



@dataclass(frozen=True)
class CacheMeasurement:
    """KV usage counted from the storage at one instant."""

    written_slots: int  # token slots with written K/V, summed over layers
    written_blocks: int  # blocks holding at least one written slot, summed over layers
    live_bytes: int  # written_slots x per-layer slot bytes
    allocated_bytes: int  # written_blocks x block_size x per-layer slot bytes (paged) or reserved bytes (contiguous)
    layers_agree: bool  # every layer has the same written slots


class PagedKVCache:
    """Per-layer key/value pools ``[num_blocks, block_size, num_kv_heads, head_dim]``."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        # One allocation per tensor; layer l's cache is the contiguous view key[l].
        self.key = torch.full(shape, float("nan"), dtype=dtype, device=self.device)
        self.value = torch.full(shape, value_poison(dtype), dtype=dtype, device=self.device)
        self.poisoned_blocks = 0  # blocks poisoned since creation (on allocation and on free)

    @property
    def slot_bytes_per_layer(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.key.element_size()

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.slot_bytes_per_layer

    @property
    def pool_bytes(self) -> int:
        """Bytes of the whole pool (both tensors)."""
        return self.key.nbytes + self.value.nbytes

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_dim]."""
        return self.key[i], self.value[i]

    def poison(self, block_ids: Iterable[int]) -> None:
        """Mark blocks as holding nothing, in every layer."""
        ids = sorted(set(int(b) for b in block_ids))
        if not ids:
            return
        idx = torch.tensor(ids, dtype=torch.int64, device=self.device)
        self.key[:, idx] = float("nan")
        self.value[:, idx] = value_poison(self.dtype)
        self.poisoned_blocks += len(ids)

    def written_mask(self) -> torch.Tensor:
        """bool [num_layers, num_blocks, block_size]: slot holds a written key."""
        return ~torch.isnan(self.key).any(dim=-1).any(dim=-1)

    def measure(self, exclude_blocks: Iterable[int] = ()) -> CacheMeasurement:
        """Count written slots and blocks from the key tensor (see the module docstring)."""
        written = self.written_mask()  # [L, num_blocks, B]
        excluded = sorted(set(int(b) for b in exclude_blocks))
        if excluded:
            written[:, torch.tensor(excluded, dtype=torch.int64, device=self.device)] = False
        slots = int(written.sum())
        blocks = int(written.any(dim=-1).sum())
        agree = bool((written == written[0:1]).all()) if self.num_layers > 1 else True
        per = self.slot_bytes_per_layer
        return CacheMeasurement(slots, blocks, slots * per, blocks * self.block_size * per, agree)


class ContiguousKVCache:
    """One ``[num_layers, max_len, num_kv_heads, head_dim]`` key and value tensor per request."""

    def __init__(self, num_layers: int, max_len: int, num_kv_heads: int, head_dim: int,
                 *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.num_layers = num_layers
        self.max_len = max_len
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.key: dict[int, torch.Tensor] = {}  # request id -> [L, max_len, kvh, d]
        self.value: dict[int, torch.Tensor] = {}

    @property
    def slot_bytes_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    def reserve(self, request_id: int) -> None:
        """Allocate (poisoned) max_len slots for a request."""
        shape = (self.num_layers, self.max_len, self.num_kv_heads, self.head_dim)
        self.key[request_id] = torch.full(shape, float("nan"), dtype=self.dtype, device=self.device)
        self.value[request_id] = torch.full(shape, value_poison(self.dtype), dtype=self.dtype, device=self.device)

    def release(self, request_id: int) -> None:
        """Drop a request's reservation (the memory goes back to the allocator)."""
        del self.key[request_id]
        del self.value[request_id]

    def measure(self) -> CacheMeasurement:
        """Written slots counted from each reservation's key tensor; allocated = bytes of the tensors."""
        slots = blocks = 0
        reserved = 0
        agree = True
        for rid, k in self.key.items():
            written = ~torch.isnan(k).any(dim=-1).any(dim=-1)  # [L, max_len]
            slots += int(written.sum())
            agree = agree and bool((written == written[0:1]).all())
            reserved += k.nbytes + self.value[rid].nbytes
            blocks += self.num_layers  # one reservation per layer
        return CacheMeasurement(slots, blocks, slots * self.slot_bytes_per_layer, reserved, agree)


__all__ = ["PagedKVCache", "ContiguousKVCache", "CacheMeasurement", "torch_dtype", "value_poison"]
