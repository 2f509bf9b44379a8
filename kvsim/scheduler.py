"""Continuous-batching scheduler: replays a workload step by step through a memory strategy.

Each engine step, in this order:

1. *Arrivals*: requests that have arrived join the back of the waiting queue.
2. *Decode*: every running sequence (in admission order) stores one more token. A paged
   sequence crossing a block boundary takes a block (a shared, partly filled last block is
   copied first: copy-on-write). When no block is free, the newest running request is
   preempted by recompute: its blocks are freed and it goes back to the front of the
   queue, to be prefilled again later with its prompt plus the tokens it had generated
   (a request of several sequences restarts from its prompt).
3. *Admission* (skipped in a step that preempted): waiting requests are admitted first
   come, first served while the running sequences stay within ``max_num_seqs``, the
   step's tokens within ``max_num_batched_tokens`` (a prompt larger than that still runs
   when it is the step's only prefill) and memory allows. A request that can never fit
   (final length over ``max_len``, more memory than the whole pool, more sequences than
   ``max_num_seqs``) is dropped and reported, never waited on.
4. The step produces one output token per running sequence (prefills their first one);
   requests with all their tokens are freed. A request with ``P`` prompt and ``O``
   output tokens therefore runs ``O`` steps and stores at most ``P + O - 1`` tokens.

Parallel sampling (``n``) prefills the prompt once and forks ``n`` sequences that share
its blocks. Beam search (width ``k``) does the same, and in addition, each time the beams
cross a block boundary the last beam is replaced by a fork of the first (a stylised beam
pruning that keeps sharing beyond the prompt).

Time. Without a time model every step is one time unit: ``time_s`` is the step index and
a trace's arrival at ``t`` seconds lands at step ``floor(t / seconds_per_step)``
(``SchedulerConfig.seconds_per_step``, default 0.02 s, a typical decode step); the engine
idles through steps with nothing to do. With ``step_time_fn(batch) -> seconds`` a step
lasts what the model says, ``time_s`` is the modelled clock, a request is admitted only
once the clock has reached its arrival, and idle gaps are skipped (no rows).

Two replays give identical results: ``event_driven=False`` walks every step and every
sequence; ``event_driven=True`` touches the pool only at block boundaries, arrivals and
finishes (a heap of per-sequence events), counts tokens in between in closed form, and
fills the rows of quiet steps with numpy; a step where only block boundaries happen gets no
row either, only a note of the blocks it took (``Engine._boundary_run``). The tests compare
both on random workloads.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kvsim.arena import Arena
from kvsim.blockpool import BlockPool, external_block_keys
from kvsim.errors import KvsimError
from kvsim.strategies import PAGED, reservation_tokens
from kvsim.workloads import Request, Workload


@dataclass(frozen=True)
class SchedulerConfig:
    """Batching limits and the step-to-time mapping."""

    max_num_seqs: int = 256  # running sequences at most
    max_num_batched_tokens: int = 8192  # tokens computed per step at most (prefill + decode)
    seconds_per_step: float = 0.02  # without a time model: trace seconds per step

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise KvsimError(f"{name} must be a positive integer, got {v!r}")
        s = self.seconds_per_step
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise KvsimError(f"seconds_per_step must be a positive number, got {s!r}")


@dataclass(frozen=True)
class StepBatch:
    """What one engine step computes, for a step-time model."""

    step: int  # step index
    prefill_tokens: np.ndarray  # [num_prefills] int64: prompt tokens computed (cache hits excluded)
    prefill_cached_tokens: np.ndarray  # [num_prefills] int64: prompt tokens read from the prefix cache
    decode_context_lens: np.ndarray  # [num_decodes] int64: tokens each decode attends to (new one included)

    @property
    def num_tokens(self) -> int:
        return int(self.prefill_tokens.sum()) + len(self.decode_context_lens)


StepTimeFn = Callable[[StepBatch], float]


# ----- memory backends ------------------------------------------------------------------


class _Group:
    """A running request (internal)."""

    __slots__ = ("idx", "req", "order", "admit_step", "prompt_len", "g0", "finish_step", "sids",
                 "regions", "res", "final", "sync", "ver", "alive", "n")

    def __init__(self, idx: int, req: Request, order: int, step: int, prompt_len: int, g0: int) -> None:
        self.idx = idx  # request index in the workload
        self.req = req
        self.order = order  # admission counter: running order, newest = largest
        self.admit_step = step  # step of the prefill
        self.prompt_len = prompt_len  # tokens stored by the prefill (prompt + regenerated outputs)
        self.g0 = g0  # outputs generated before this admission
        self.finish_step = step + req.output_tokens - g0 - 1
        self.n = req.num_seqs  # sequences
        self.sids: list[int] = []  # pool sequence ids (paged)
        self.regions: list[int] = []  # arena region starts (reservation strategies)
        self.res = 0  # reserved slots per sequence (reservation strategies)
        self.final = req.final_len  # final length per sequence
        self.sync = [step] * self.n  # step up to which each sequence's tokens are in the pool
        self.ver = [-1] * self.n  # step of each sequence's pending pool event (-1: none)
        self.alive = True


class PagedMemory:
    """Paged blocks from a :class:`BlockPool`."""

    kind = PAGED

    def __init__(self, num_blocks: int, block_size: int, bytes_per_token: int, *,
                 prefix_caching: bool = False, hash_block_size: int | None = None) -> None:
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching=prefix_caching)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_token = bytes_per_token
        self.block_bytes = block_size * bytes_per_token
        self.capacity_bytes = num_blocks * self.block_bytes
        self.prefix_caching = prefix_caching
        self.hash_block_size = hash_block_size
        self._keys: dict[int, list | None] = {}
        self._next_sid = 0

    def peak_blocks(self, req: Request) -> int:
        """Blocks the request holds at most when running alone (prompt full blocks shared)."""
        B = self.block_size
        shared = req.prompt_tokens // B if req.num_seqs > 1 else 0
        return shared + req.num_seqs * (-(-req.final_len // B) - shared)

    def drop_reason(self, req: Request) -> str | None:
        need = self.peak_blocks(req)
        if need > self.pool.num_blocks:
            return f"needs {need} blocks, the pool has {self.pool.num_blocks}"
        return None

    def keys(self, idx: int, req: Request) -> list | None:
        if not self.prefix_caching:
            return None
        if idx not in self._keys:
            B = self.block_size
            if req.block_hashes is not None:
                if self.hash_block_size is None:
                    raise KvsimError("the workload has block hashes but no hash block size")
                k = external_block_keys(req.block_hashes, self.hash_block_size, B, req.prompt_tokens)
            else:
                shared = req.shared_prefix_tokens // B
                k = [("p", req.prefix_group, i) for i in range(shared)]
                k += [("r", idx, i) for i in range(shared, req.prompt_tokens // B)]
            self._keys[idx] = k
        return self._keys[idx]

    def cached_tokens(self, g_idx: int, req: Request, prompt_len: int) -> int:
        if not self.prefix_caching:
            return 0
        return self.pool.cached_prefix_blocks(prompt_len, self.keys(g_idx, req)) * self.block_size

    def admit(self, g: _Group) -> bool:
        pool = self.pool
        keys = self.keys(g.idx, g.req)
        if not pool.can_allocate(g.prompt_len, keys):
            return False
        sid = self._next_sid
        self._next_sid += g.n
        pool.allocate(sid, g.prompt_len, block_keys=keys)
        for m in range(1, g.n):
            pool.fork(sid, sid + m)
        g.sids = list(range(sid, sid + g.n))
        return True

    def admit_single(self, g: _Group) -> None:
        """:meth:`admit` of a one-sequence request without prefix caching, the caller having
        checked that ``ceil(prompt_len / B)`` blocks are free."""
        sid = self._next_sid
        self._next_sid += 1
        self.pool.allocate_uncached(sid, g.prompt_len)
        g.sids = [sid]

    def free(self, g: _Group) -> None:
        for sid in g.sids:
            self.pool.free(sid)

    def needs_cow_next(self, sid: int, stored: int) -> bool:
        """Whether the sequence's next append copies a shared, partly filled block."""
        return stored % self.block_size != 0 and self.pool.ref_count(self.pool._seqs[sid].table[-1]) > 1


class ArenaMemory:
    """Contiguous reservations from a first-fit :class:`Arena`."""

    def __init__(self, strategy: str, capacity_tokens: int, bytes_per_token: int, max_len: int) -> None:
        self.kind = strategy
        self.arena = Arena(capacity_tokens)
        self.bytes_per_token = bytes_per_token
        self.capacity_bytes = capacity_tokens * bytes_per_token
        self.max_len = max_len
        self.reserved_slots = 0  # sum of reservations
        self.final_slots = 0  # sum of final lengths of running sequences

    def reservation(self, req: Request) -> int:
        return reservation_tokens(self.kind, req.final_len, self.max_len)

    def drop_reason(self, req: Request) -> str | None:
        need = self.reservation(req) * req.num_seqs
        if need > self.arena.capacity:
            return f"reserves {need} token slots, the arena has {self.arena.capacity}"
        return None

    def admit(self, g: _Group) -> bool:
        R = self.reservation(g.req)
        starts = []
        for _ in range(g.n):
            s = self.arena.allocate(R)
            if s is None:
                for s2 in reversed(starts):
                    self.arena.free(s2)
                return False
            starts.append(s)
        g.regions = starts
        g.res = R
        self.reserved_slots += R * g.n
        self.final_slots += g.final * g.n
        return True

    def free(self, g: _Group) -> None:
        for s in g.regions:
            self.arena.free(s)
        self.reserved_slots -= g.res * g.n
        self.final_slots -= g.final * g.n


# ----- the engine -------------------------------------------------------------------------


@dataclass
class ReplayLog:
    """Raw output of a replay: per-step columns and per-request outcomes."""

    rows: dict[str, list]  # Timeline columns, one entry per step
    first_step: np.ndarray  # [num_requests] step of the first prefill (-1: never)
    finish_step: np.ndarray  # [num_requests] step the request finished (-1: never)
    preempted: np.ndarray  # [num_requests] times the request was preempted
    drop_reasons: dict[int, str] = field(default_factory=dict)  # request index -> why dropped
    step_end_s: np.ndarray | None = None  # [steps] modelled clock at the end of each step (time model)
    step_time_s: np.ndarray | None = None  # [steps] modelled duration of each step, idle gaps excluded


_ORDER_MASK = (1 << 36) - 1
_ROW_KEYS = ("step", "running", "waiting", "live_tokens", "allocated_bytes", "reserved_bytes",
             "internal_frag_bytes", "external_frag_bytes", "free_bytes", "shared_saved_bytes",
             "prefix_hit_blocks", "prefix_query_blocks", "preemptions", "finished", "dropped", "slope")


class Engine:
    """One replay of a workload through a memory backend (:func:`kvsim.simulate.simulate` drives it)."""

    def __init__(self, workload: Workload, memory, config: SchedulerConfig, max_len: int,
                 step_time_fn: StepTimeFn | None, progress: Callable[[float], None] | None) -> None:
        self.w = workload
        self.reqs = workload.requests
        self.mem = memory
        self.paged = isinstance(memory, PagedMemory)
        self.cfg = config
        self.max_len = max_len
        self.fn = step_time_fn
        self.progress = progress
        n = len(self.reqs)
        self.arrival_s = np.array([r.arrival_s for r in self.reqs], dtype=float)
        if step_time_fn is None:
            steps = np.floor(self.arrival_s / config.seconds_per_step + 1e-9).astype(np.int64)
            self.arrival_step = steps.tolist()
        self.first_step = np.full(n, -1, dtype=np.int64)
        self.finish_step = np.full(n, -1, dtype=np.int64)
        self.preempted = np.zeros(n, dtype=np.int64)
        self.drop_reasons: dict[int, str] = {}
        self.waiting: deque = deque()  # (request index, outputs already generated)
        self.running: list[_Group] = []  # admission order
        self.num_running_seqs = 0
        self.order = 0
        self.a_ptr = 0
        self.preemptions = 0
        self.finished = 0
        self.dropped = 0
        self._rows: list[tuple] = []  # one tuple per recorded step, fields as _ROW_KEYS
        self._cross_steps: list[int] = []  # one entry per block taken in _boundary_run (not rows)
        self.times: list[float] = []
        self.durations: list[float] = []  # modelled seconds of each step (idle gaps not included)
        self.clock = 0.0
        # lazy token accounting: stored tokens = synced (pool or arena counter) + M * t - S
        self.M = 0  # running sequences
        self.S = 0  # sum over running sequences of their sync step
        self.synced_tokens = 0  # arena: tokens counted at sync steps
        self._last_progress = -1.0
        self._events = False  # event-driven replay schedules heap entries on admission
        self._multi = 0  # running requests with several sequences
        self._ctx_dirty = True

    # ----- shared pieces ---------------------------------------------------------------

    def _drop_reason(self, req: Request) -> str | None:
        if req.final_len > self.max_len:
            return f"final length {req.final_len} exceeds max_len {self.max_len}"
        if req.num_seqs > self.cfg.max_num_seqs:
            return f"{req.num_seqs} sequences exceed max_num_seqs {self.cfg.max_num_seqs}"
        return self.mem.drop_reason(req)

    def _arrivals(self, t: int) -> bool:
        """Move arrived requests to the waiting queue; whether any arrived."""
        moved = False
        n = len(self.reqs)
        if self.fn is None:
            while self.a_ptr < n and self.arrival_step[self.a_ptr] <= t:
                self.waiting.append((self.a_ptr, 0))
                self.a_ptr += 1
                moved = True
        else:
            while self.a_ptr < n and self.arrival_s[self.a_ptr] <= self.clock:
                self.waiting.append((self.a_ptr, 0))
                self.a_ptr += 1
                moved = True
        return moved

    def _preempt_newest(self, t: int) -> _Group:
        g = self.running.pop()
        g.alive = False
        self.mem.free(g)
        self._remove_counts(g)
        self.num_running_seqs -= g.n
        self.preemptions += 1
        self.preempted[g.idx] += 1
        # outputs generated so far: g0 + 1 at the prefill step, one more per step since
        done = g.g0 + (t - g.admit_step)
        self.waiting.appendleft((g.idx, done if g.n == 1 else 0))
        return g

    def _remove_counts(self, g: _Group) -> None:
        if g.n > 1:
            self._multi -= 1
        if not self.paged:
            self.synced_tokens -= sum(g.prompt_len + (s - g.admit_step) for s in g.sync)
        self.M -= g.n
        self.S -= sum(g.sync)

    def _admit(self, t: int, budget: int, prefills: list, cached_list: list) -> tuple[bool, bool]:
        """Admission phase; returns (admitted any, dropped any).

        A one-sequence request on a paged pool without prefix caching (every request of a
        plain trace replay) takes a shorter path with the same decisions: it is dropped
        only for its final length (over ``max_len``, or more than ``ceil(final / B)``
        blocks in the whole pool), it never exceeds ``max_num_seqs`` alone, it has no
        cache hit, and it fits when ``ceil(prompt_len / B)`` blocks are free.
        """
        admitted = dropped = False
        cfg = self.cfg
        waiting, reqs, mem = self.waiting, self.reqs, self.mem
        simple = self.paged and not mem.prefix_caching
        if simple:
            pool, B, max_len = mem.pool, mem.block_size, self.max_len
        while waiting:
            idx, done = waiting[0]
            req = reqs[idx]
            single = simple and req.num_samples == 1 and req.beam_width == 1
            if single:
                final = req.prompt_tokens + req.output_tokens - 1
                ok = final <= max_len and -(-final // B) <= pool.num_blocks
                reason = None if ok else self._drop_reason(req)
            else:
                reason = self._drop_reason(req)
            if reason is not None:
                waiting.popleft()
                self.drop_reasons[idx] = reason
                self.dropped += 1
                dropped = True
                continue
            n = 1 if single else req.num_seqs
            if self.num_running_seqs + n > cfg.max_num_seqs:
                break
            prompt_len = req.prompt_tokens + done
            cached = mem.cached_tokens(idx, req, prompt_len) if self.paged and not single else 0
            compute = prompt_len - cached
            if prefills and compute > budget:
                break
            if single:
                if -(-prompt_len // B) > pool.num_free_blocks:
                    break
                g = _Group(idx, req, self.order, t, prompt_len, done)
                mem.admit_single(g)
            else:
                g = _Group(idx, req, self.order, t, prompt_len, done)
                if not mem.admit(g):
                    break
            self.order += 1
            waiting.popleft()
            self.running.append(g)
            self.num_running_seqs += n
            if n > 1:
                self._multi += 1
            self.M += n
            self.S += t * n
            if not self.paged:
                self.synced_tokens += prompt_len * n
            budget -= compute
            prefills.append(compute)
            cached_list.append(cached)
            if self.first_step[idx] < 0:
                self.first_step[idx] = t
            admitted = True
            self._on_admit(g, t)
        return admitted, dropped

    def _finish(self, g: _Group, t: int) -> None:
        g.alive = False
        self.mem.free(g)
        self._remove_counts(g)
        self.num_running_seqs -= g.n
        self.finished += 1
        self.finish_step[g.idx] = t

    def _record(self, t: int) -> None:
        mem = self.mem
        bpt = mem.bytes_per_token
        if self.paged:
            pool = mem.pool
            live = pool.num_live_tokens + self.M * t - self.S
            used = mem.num_blocks - pool.num_free_blocks
            alloc = used * mem.block_bytes
            self._rows.append((
                t, self.num_running_seqs, len(self.waiting), live, alloc, 0, alloc - live * bpt, 0,
                mem.capacity_bytes - alloc, (pool.num_table_refs - used) * mem.block_bytes,
                pool.prefix_hit_blocks, pool.prefix_query_blocks, self.preemptions, self.finished,
                self.dropped, self.M,
            ))
            return
        live = self.synced_tokens + self.M * t - self.S
        alloc = mem.reserved_slots * bpt
        if self.waiting:
            head = self.reqs[self.waiting[0][0]]
            external = mem.arena.unusable_slots(mem.reservation(head)) * bpt
        else:
            external = 0
        self._rows.append((
            t, self.num_running_seqs, len(self.waiting), live, alloc, (mem.final_slots - live) * bpt,
            (mem.reserved_slots - mem.final_slots) * bpt, external, mem.capacity_bytes - alloc - external,
            0, 0, 0, self.preemptions, self.finished, self.dropped, self.M,
        ))

    def _step_time(self, t: int, prefills: list, cached: list, decode_ctx) -> None:
        if self.fn is None:
            return
        batch = StepBatch(t, np.asarray(prefills, dtype=np.int64), np.asarray(cached, dtype=np.int64),
                          np.asarray(decode_ctx, dtype=np.int64))
        dt = self.fn(batch)
        try:
            dt = float(dt)
        except (TypeError, ValueError):
            raise KvsimError(f"step_time_fn returned {dt!r}, not a number of seconds") from None
        if not math.isfinite(dt) or dt < 0:
            raise KvsimError(f"step_time_fn returned {dt!r}; a step time must be finite and >= 0")
        self.clock += dt
        self.times.append(self.clock)
        self.durations.append(dt)

    def _report(self, t: int) -> None:
        if self.progress is None:
            return
        frac = (self.finished + self.dropped) / len(self.reqs)
        if frac - self._last_progress >= 0.01 or frac >= 1.0:
            self._last_progress = frac
            self.progress(min(1.0, frac))

    @property
    def visited_steps(self) -> int:
        """Steps the replay processed itself (the event-driven one fills the others in)."""
        return len(self._rows) + len(set(self._cross_steps))

    def _done(self) -> bool:
        return not self.running and not self.waiting and self.a_ptr >= len(self.reqs)

    def _idle_jump(self, t: int) -> int | None:
        """Nothing to run: the step (or clock) of the next arrival; None when all done."""
        if self.a_ptr >= len(self.reqs):
            return None
        if self.fn is None:
            return self.arrival_step[self.a_ptr]
        self.clock = max(self.clock, float(self.arrival_s[self.a_ptr]))
        return t

    # ----- plain replay: every step, every sequence ------------------------------------

    def run_steps(self) -> ReplayLog:
        t = 0
        mem = self.mem
        while True:
            self._arrivals(t)
            if not self.running and not self.waiting:
                nxt = self._idle_jump(t)
                if nxt is None:
                    break
                if self.fn is None:
                    while t < nxt:  # the engine ticks with nothing to do
                        self._record(t)
                        t += 1
                continue
            preempted = False
            decode: list[tuple[_Group, int]] = []
            i = 0
            while i < len(self.running):
                g = self.running[i]
                gone = False
                crossed = False
                for m in range(g.n):
                    if self.paged:
                        sid = g.sids[m]
                        pool = mem.pool
                        need = pool.append_slots_needed(sid, 1)
                        while need > pool.num_free_blocks:
                            victim = self._preempt_newest(t)
                            preempted = True
                            if victim is g:
                                gone = True
                                break
                        if gone:
                            break
                        if pool.num_tokens(sid) % mem.block_size == 0:
                            crossed = True
                        pool.append_tokens(sid, 1)
                        self.S += 1  # synced one more step
                        g.sync[m] = t
                    else:
                        self.synced_tokens += 1
                        self.S += 1
                        g.sync[m] = t
                    decode.append((g, g.prompt_len + t - g.admit_step))
                if gone:
                    break  # g was the newest: nothing after it
                if crossed and g.req.beam_width > 1:
                    self._refork(g)
                i += 1
            decode_ctx = [c for gg, c in decode if gg.alive]
            prefills: list[int] = []
            cached: list[int] = []
            admitted = dropped = False
            if not preempted:
                budget = self.cfg.max_num_batched_tokens - len(decode_ctx)
                admitted, dropped = self._admit(t, budget, prefills, cached)
            self._step_time(t, prefills, cached, decode_ctx)
            for g in [g for g in self.running if g.finish_step == t]:
                self.running.remove(g)
                self._finish(g, t)
            self._record(t)
            self._report(t)
            t += 1
        return self._log()

    def _refork(self, g: _Group) -> None:
        """Beam search: the last beam becomes a copy of the first (all blocks shared)."""
        pool = self.mem.pool
        last = g.sids[-1]
        pool.free(last)
        pool.fork(g.sids[0], last)

    # ----- event-driven replay ---------------------------------------------------------

    def run_events(self) -> ReplayLog:
        self._heap: list[int] = []  # a paged sequence's next pool operation (see _schedule)
        self._fin: list[tuple[int, int]] = []  # (step, order): a request's last step
        self._groups: dict[int, _Group] = {}  # running requests by admission order
        self._events = True
        if self.fn is None:
            self._run_events_untimed()
        else:
            self._run_events_timed()
        return self._log()

    def _run_events_untimed(self) -> None:
        """Visit only the steps where something happens; the rows between are filled later."""
        heap, fin, groups = self._heap, self._fin, self._groups
        arrival_step = self.arrival_step
        n_req = len(self.reqs)
        waiting, running = self.waiting, self.running
        heappop = heapq.heappop
        max_tokens = self.cfg.max_num_batched_tokens
        t = 0
        forced: int | None = 0  # step 0 is always recorded
        quiet_ok = self.paged
        while True:
            if quiet_ok and forced is None and not waiting and not self._multi and heap:
                limit = fin[0][0] if fin else 1 << 62
                if self.a_ptr < n_req and arrival_step[self.a_ptr] < limit:
                    limit = arrival_step[self.a_ptr]
                t = self._boundary_run(t, limit)
            # the next step where anything can happen
            nxt = forced
            if heap:
                top = self._top_step()
                if top is not None and (nxt is None or top < nxt):
                    nxt = top
            if fin and (nxt is None or fin[0][0] < nxt):
                nxt = fin[0][0]
            if self.a_ptr < n_req and (nxt is None or arrival_step[self.a_ptr] < nxt):
                nxt = arrival_step[self.a_ptr]
            if nxt is None:
                break
            if nxt > t:
                t = nxt
            forced = None
            if self.a_ptr < n_req and arrival_step[self.a_ptr] <= t:
                self._arrivals(t)
            if not running and not waiting:
                if self.a_ptr >= n_req:
                    break
                self._record(t)  # an idle step; the quiet ones after it are filled in later
                t += 1
                continue
            preempted = admitted = dropped = finished_any = False
            if heap and heap[0] >> 48 <= t:
                preempted = self._event_decode(t)
            if waiting and not preempted:
                admitted, dropped = self._admit(t, max_tokens - self.M, [], [])
            while fin and fin[0][0] <= t:
                order = heappop(fin)[1]
                g = groups.pop(order, None)
                if g is None:
                    continue
                running.remove(g)
                self._finish(g, t)
                finished_any = True
            if waiting and (admitted or preempted or finished_any or dropped):
                forced = t + 1
            self._record(t)
            if self.progress is not None and finished_any:
                self._report(t)
            t += 1
            if not running and not waiting and self.a_ptr >= n_req:
                break

    def _boundary_run(self, t: int, limit: int, record: bool = True) -> int:
        """Process the steps before ``limit`` at which only block boundaries happen, without
        recording a row for them; returns the step after the last one processed.

        Preconditions (checked by the caller): nothing waits, nothing arrives or finishes
        before ``limit`` (it is the next arrival or finish step), and every running request
        is a single sequence, so each current heap entry is one sequence filling its last
        block and taking exactly one new block, B steps after the previous one. The window
        is cut before the first step at which fewer blocks are free than sequences run
        (there a crossing could preempt, which the general path handles).

        Fast path. Entries are popped in heap order, i.e. by (step, admission order), the
        order in which the step-by-step replay takes blocks; each crossing takes the next
        block of the free queue and is rescheduled B steps on with one ``heapreplace``.
        Rows: at such a step only the allocation changes (live tokens grow by ``M`` a
        step as in a quiet step, the shared bytes and every counter are unchanged), so
        instead of a row per step the crossing steps are appended to ``_cross_steps`` and
        :meth:`_log` adds the blocks they took to the quiet-step fill of the previous row.
        ``record=False`` is for an event step (``limit = t + 1``), whose row :meth:`_record`
        takes from the pool afterwards.
        """
        heap, groups, pool = self._heap, self._groups, self.mem.pool
        B = self.mem.block_size
        M = self.M
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        cross = self._cross_steps.append if record else [].append
        # The pool's internals are used directly here (this is the hottest loop of a replay);
        # BlockPool.grow_many_into_new_blocks is the checked equivalent.
        seqs, plain, ref = pool._seqs, pool._free_plain, pool._ref
        free = pool.num_free_blocks  # blocks free before the step being processed
        if free < M:
            return t
        step = -1  # step of the entries being popped
        last = -1  # last step with a crossing
        grown = synced = 0
        while heap:
            key = heap[0]
            ts = key >> 48
            if ts != step:
                # a new step: stop at limit, or when its crossings might not all find a block
                if ts >= limit or free < M:
                    break
                step = ts
            g = groups.get((key >> 12) & _ORDER_MASK)
            if g is None or g.ver[0] != ts:
                heappop(heap)  # stale: its request finished or was preempted
                continue
            assert ts >= t, "a current pool event was skipped"
            if plain:
                b = plain.pop()
                ref[b] = 1
                pool.num_free_blocks -= 1
            else:
                b = pool._take(1)[0]  # evicts the least recently used cached block
            free -= 1
            k = ts - g.sync[0]  # tokens since the last sync, this step's included
            sq = seqs[g.sids[0]]
            sq.table.append(b)
            sq.num_tokens += k
            g.sync[0] = ts
            synced += k
            grown += 1
            cross(ts)
            last = ts
            nxt = ts + B
            if nxt <= g.finish_step:
                g.ver[0] = nxt
                heapreplace(heap, key + (B << 48))  # same heap contents as pop then push
            else:
                g.ver[0] = -1
                heappop(heap)
        if not grown:
            return t
        assert pool.num_free_blocks == free
        pool.num_table_refs += grown
        pool.num_live_tokens += synced
        self.S += synced
        return last + 1

    def _run_events_timed(self) -> None:
        """Every step is visited (its duration needs the batch), but the pool is touched only
        at events and the decode contexts come from one numpy add."""
        heap, fin, groups = self._heap, self._fin, self._groups
        n_req = len(self.reqs)
        t = 0
        forced: int | None = None
        self._ctx_dirty = True
        ctx_base = np.zeros(0, dtype=np.int64)
        while True:
            arrived = self._arrivals(t)
            if not self.running and not self.waiting:
                if self.a_ptr >= n_req:
                    break
                self._idle_jump(t)
                continue
            is_event = arrived or forced == t or bool(heap and heap[0] >> 48 <= t) or bool(fin and fin[0][0] <= t)
            forced = None
            prefills: list[int] = []
            cached: list[int] = []
            preempted = admitted = dropped = finished_any = False
            if is_event:
                preempted = self._event_decode(t)
                if not preempted:
                    budget = self.cfg.max_num_batched_tokens - self.M
                    admitted, dropped = self._admit(t, budget, prefills, cached)
            if self._ctx_dirty:
                ctx_base = self._build_ctx_base(t)
                self._ctx_dirty = False
            self._step_time(t, prefills, cached, ctx_base + t)
            if admitted:
                self._ctx_dirty = True  # the new requests decode from the next step
            while fin and fin[0][0] <= t:
                _, order = heapq.heappop(fin)
                g = groups.pop(order, None)
                if g is None:
                    continue
                self.running.remove(g)
                self._finish(g, t)
                finished_any = True
                self._ctx_dirty = True
            if self.waiting and (admitted or preempted or finished_any or dropped):
                forced = t + 1
            self._record(t)
            self._report(t)
            t += 1
            if self._done():
                break

    # Heap entries are single ints, (step << 48) | (order << 12) | member, so the heap compares
    # ints, not tuples; an entry is current when the group still runs and still expects
    # that member at that step (group.ver holds the step scheduled for each member).

    def _top_step(self) -> int | None:
        """Step of the earliest current pool event (stale entries are dropped)."""
        heap, groups = self._heap, self._groups
        while heap:
            key = heap[0]
            g = groups.get((key >> 12) & _ORDER_MASK)
            if g is not None and g.ver[key & 4095] == key >> 48:
                return key >> 48
            heapq.heappop(heap)
        return None

    def _on_admit(self, g: _Group, t: int) -> None:
        if not self._events:
            return
        self._groups[g.order] = g
        heapq.heappush(self._fin, (g.finish_step, g.order))
        if self.paged:
            for m in range(g.n):
                self._schedule(g, m, t)

    def _schedule(self, g: _Group, m: int, t: int) -> None:
        """Push the next step at which sequence ``m`` of ``g`` touches the pool."""
        stored = g.prompt_len + (t - g.admit_step)
        mem = self.mem
        if g.n > 1 and mem.needs_cow_next(g.sids[m], stored):
            nxt = t + 1
        else:
            nxt = t + 1 + ((-stored) % mem.block_size)
        if nxt <= g.finish_step:
            if g.ver[m] != nxt:
                g.ver[m] = nxt
                heapq.heappush(self._heap, (nxt << 48) | (g.order << 12) | m)
        else:
            g.ver[m] = -1

    def _event_decode(self, t: int) -> bool:
        """Pool operations of the sequences due at step ``t``; whether anything was preempted."""
        if not self.paged:
            return False
        heap, groups = self._heap, self._groups
        pool = self.mem.pool
        B = self.mem.block_size
        preempted = False
        heappop, heappush = heapq.heappop, heapq.heappush
        grow = pool.grow_into_new_block
        synced = 0
        # Fastest path: every running request is single and a block is free for each running
        # sequence (at most M are due): the boundary loop, for this one step. Entries before
        # t are stale (the replay never skips a current one), so limit t + 1 takes only t's.
        if not self._multi and pool.num_free_blocks >= self.M:
            self._boundary_run(t, t + 1, record=False)
            return False
        # Fast path: single sequences crossing a boundary, with a free block for each (no
        # preemption possible), are grown in one pool call, in heap order.
        due: list[tuple[int, _Group]] = []
        while heap and heap[0] >> 48 <= t:
            key = heappop(heap)
            g = groups.get((key >> 12) & _ORDER_MASK)
            if g is None or g.ver[key & 4095] != t:
                continue
            due.append((key, g))
        if not due:
            return False
        if len(due) <= pool.num_free_blocks and (not self._multi or all(g.n == 1 for _, g in due)):
            sids, ks = [], []
            for key, g in due:
                k = t - g.sync[0]
                sids.append(g.sids[0])
                ks.append(k)
                synced += k
                g.sync[0] = t
                nxt = t + B
                if nxt <= g.finish_step:
                    g.ver[0] = nxt
                    heappush(heap, key + (B << 48))
                else:
                    g.ver[0] = -1
            pool.grow_many_into_new_blocks(sids, ks)
            self.S += synced
            return False
        for key in reversed([key for key, _ in due]):
            heappush(heap, key)  # the general path below pops them again in order
        while heap and heap[0] >> 48 <= t:
            key = heappop(heap)
            g = groups.get((key >> 12) & _ORDER_MASK)
            m = key & 4095
            if g is None or g.ver[m] != t:
                continue
            sid = g.sids[m]
            k = t - g.sync[m]  # tokens since the last sync, this step's included
            if pool.num_free_blocks < 2:
                need = pool.append_slots_needed(sid, k)
                gone = False
                while need > pool.num_free_blocks:
                    victim = self._preempt_newest(t)
                    groups.pop(victim.order, None)
                    preempted = True
                    if victim is g:
                        gone = True
                        break
                if gone:
                    continue
            g.sync[m] = t
            synced += k
            if g.n == 1:
                # a single sequence's events are its block boundaries: one new block each,
                # and the next boundary is B steps on
                grow(sid, k)
                nxt = t + B
                if nxt <= g.finish_step:
                    g.ver[m] = nxt
                    heappush(heap, key + (B << 48))
                else:
                    g.ver[m] = -1
                continue
            stored_before = g.prompt_len + (t - 1 - g.admit_step)
            pool.append_tokens(sid, k)
            self._schedule(g, m, t)
            if g.req.beam_width > 1 and m == g.n - 1 and stored_before % B == 0:
                self._refork(g)  # every beam crossed at this step; the first is synced already
                self._schedule(g, 0, t)
                self._schedule(g, m, t)
        self.S += synced
        if preempted:
            self._ctx_dirty = True
        return preempted

    def _build_ctx_base(self, t: int) -> np.ndarray:
        """Per decoding sequence, in batch order: context length minus the step index."""
        base: list[int] = []
        for g in self.running:
            if g.admit_step < t:
                base.extend([g.prompt_len - g.admit_step] * g.n)
        return np.asarray(base, dtype=np.int64)

    def _log(self) -> ReplayLog:
        arr = np.array(self._rows, dtype=np.int64).reshape(-1, len(_ROW_KEYS))
        rows = {k: arr[:, i] for i, k in enumerate(_ROW_KEYS)}
        steps = rows["step"]
        cross = np.asarray(self._cross_steps, dtype=np.int64)
        n = int(max(steps[-1], cross[-1] if cross.size else 0)) + 1 if steps.size else 0
        if steps.size and n != steps.size:
            # event-driven without a time model: fill the steps between recorded ones. In a
            # quiet step nothing changes except that every running sequence stores one token;
            # a boundary step (see _boundary_run) also takes the blocks counted in cross.
            gaps = np.diff(np.append(steps, n))
            src = np.repeat(np.arange(steps.size), gaps)
            full = np.arange(n)
            off = full - steps[src]
            grow = rows["slope"][src] * off
            rows = {k: v[src] for k, v in rows.items()}
            rows["step"] = full
            rows["live_tokens"] = rows["live_tokens"] + grow
            bpt = self.mem.bytes_per_token
            if self.paged:
                rows["internal_frag_bytes"] = rows["internal_frag_bytes"] - grow * bpt
                if cross.size:
                    # blocks taken by boundary crossings since the step's source row (a
                    # recorded row's pool state already includes all crossings before it)
                    taken = np.cumsum(np.bincount(cross, minlength=n))
                    extra = (taken - taken[steps[src]]) * self.mem.block_bytes
                    rows["allocated_bytes"] = rows["allocated_bytes"] + extra
                    rows["internal_frag_bytes"] = rows["internal_frag_bytes"] + extra
                    rows["free_bytes"] = rows["free_bytes"] - extra
            else:
                rows["reserved_bytes"] = rows["reserved_bytes"] - grow * bpt
        assert steps.size == 0 or steps[0] == 0
        return ReplayLog(
            rows=rows, first_step=self.first_step, finish_step=self.finish_step,
            preempted=self.preempted, drop_reasons=self.drop_reasons,
            step_end_s=np.asarray(self.times, dtype=float) if self.fn is not None else None,
            step_time_s=np.asarray(self.durations, dtype=float) if self.fn is not None else None,
        )
