"""Allocation strategies: how a request claims KV memory, so the PagedAttention paper's
comparison (its Figure 2) can be replayed on any workload.

- ``reserve-max`` (Orca "Max"): each sequence reserves ``max_len`` token slots up front,
  contiguously;
- ``pow2`` (Orca "Pow2"): reserves the next power of two of its final length;
- ``oracle`` (Orca "Oracle"): reserves exactly its final length (it knows the future);
- ``paged`` (vLLM): blocks of ``block_size`` slots taken one at a time as the sequence
  grows, optionally with prefix caching.

Reservation strategies live in a contiguous first-fit :class:`~kvsim.arena.Arena`, so their
external fragmentation is measured. A sequence's *final length* is ``P + O - 1`` tokens
(see :mod:`kvsim.workloads`).

Memory split per step, in bytes (the paper's Figure 2 categories; Timeline columns):

=====================  =====================================  ================================
column                 reservation strategies                 paged
=====================  =====================================  ================================
live_bytes             tokens stored                          tokens stored (shared once)
reserved_bytes         final length - stored (still to come)  0
internal_frag_bytes    reservation - final length             empty slots of held blocks
external_frag_bytes    free holes smaller than the reservation 0
                       of the request at the head of the queue
                       (0 when nothing waits)
free_bytes             capacity - allocated - external        capacity - allocated
=====================  =====================================  ================================

``allocated_bytes = live + reserved + internal`` in both cases.
"""

from __future__ import annotations

from kvsim.errors import KvsimError

RESERVE_MAX = "reserve-max"
POW2 = "pow2"
ORACLE = "oracle"
PAGED = "paged"
STRATEGIES = (RESERVE_MAX, POW2, ORACLE, PAGED)
RESERVATION_STRATEGIES = (RESERVE_MAX, POW2, ORACLE)

#: The paper's Figure 2: average share of KV memory holding token states (OPT-13B, A100-40GB).
PAPER_TOKEN_STATE_PERCENT = {RESERVE_MAX: 20.4, POW2: 26.8, ORACLE: 38.2, PAGED: 96.3}
#: Display names the paper uses.
PAPER_NAMES = {RESERVE_MAX: "Orca (Max)", POW2: "Orca (Pow2)", ORACLE: "Orca (Oracle)", PAGED: "vLLM"}


def parse_strategy(name: str) -> tuple[str, bool]:
    """A strategy name -> (strategy, prefix caching). Accepts ``paged+prefix``."""
    key = str(name).strip().lower().replace("_", "-")
    aliases = {"max": RESERVE_MAX, "orca-max": RESERVE_MAX, "vllm": PAGED, "power-of-two": POW2}
    if key in ("paged+prefix", "paged-prefix", "paged+prefix-caching"):
        return PAGED, True
    key = aliases.get(key, key)
    if key not in STRATEGIES:
        raise KvsimError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)} (or paged+prefix)")
    return key, False


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (int(n) - 1).bit_length()


def reservation_tokens(strategy: str, final_len: int, max_len: int) -> int:
    """Token slots a reservation strategy claims for a sequence of ``final_len`` tokens."""
    if strategy == RESERVE_MAX:
        return max_len
    if strategy == POW2:
        return next_pow2(final_len)
    if strategy == ORACLE:
        return final_len
    raise KvsimError(f"{strategy!r} is not a reservation strategy")


__all__ = [
    "RESERVE_MAX", "POW2", "ORACLE", "PAGED", "STRATEGIES", "RESERVATION_STRATEGIES",
    "PAPER_TOKEN_STATE_PERCENT", "PAPER_NAMES", "parse_strategy", "next_pow2", "reservation_tokens",
]
