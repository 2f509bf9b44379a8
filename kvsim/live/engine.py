"""The paged live engine: a real model decoding through a real paged KV cache.

One engine step, in order (a small continuous-batching loop over :class:`~kvsim.blockpool.BlockPool`;
the simulator's scheduler works on simulated lengths, so the live engine keeps its own
loop and follows the same policy):

1. requests whose arrival step has come join the waiting queue (FCFS);
2. every running sequence gets the slot for the token it feeds this step
   (``BlockPool.append_tokens``); when the pool has no block for it, the *newest* running
   request is preempted by recompute (its blocks freed, its prompt and generated tokens
   queued again at the front of the waiting queue) until it fits;
3. if nothing was preempted, waiting requests are admitted in order while fewer than
   ``max_num_seqs`` run and ``BlockPool.can_allocate`` says their prompt fits (prefix-cache
   hits counted); ``BlockPool.allocate`` gives the block table and the hits;
4. blocks the pool just handed out are poisoned, copy-on-write pairs are copied with
   ``kernels.copy_blocks``;
5. one forward pass over the packed new tokens: per layer ``kernels.write_kv`` stores
   K/V at the slots the block tables give, ``kernels.paged_prefill`` attends for
   prefilling sequences (over their cached context: prefix hits are not recomputed) and
   ``kernels.paged_attention`` for decoding ones;
6. next tokens (:mod:`kvsim.live.sampling`: greedy for sample 0, seeded sampling for the
   others); a request of ``n > 1`` samples that has just been prefilled is forked ``n - 1``
   times (``BlockPool.fork``: every prompt block shared); finished requests are freed and
   their unshared blocks poisoned;
7. (outside the timed step) the KV cache is *measured* from the tensor
   (:meth:`PagedKVCache.measure`) and the calculator predicts the same quantity from the
   running sequences' stored lengths and the sharing structure alone
   (:func:`predicted_group_usage`); every ``check_every`` steps the attention outputs of up
   to ``check_max_seqs`` sequences are compared with a dense recompute.

Every request's last output token is never fed back, so a request of ``P`` prompt and
``O`` output tokens stores ``P + O - 1`` tokens at most (the calculator's convention).

Parallel sampling. The samples of a request count against ``max_num_seqs`` together (a
request is admitted only if all fit) and decode in lockstep; the first append of each
sample into the shared, partly filled last prompt block copies it (copy-on-write: the
pool returns ``(src, dst)``, the engine copies with ``kernels.copy_blocks``; the last
sample to append keeps the original). A request of several samples is preempted as a
whole and restarts from its prompt (its generated tokens are dropped and recomputed, the
samples' generators re-seeded), as the simulator's scheduler does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import pandas as pd
import torch

import kernels
from kvsim.blockpool import BlockPool, token_block_keys
from kvsim.calculator import kv_usage
from kvsim.errors import KvsimError
from kvsim.live.cache import PagedKVCache
from kvsim.live.model import LiveModel
from kvsim.live.requests import LiveRequest
from kvsim.live.sampling import choose_tokens, sample_generator
from kvsim.timeline import make_timeline

#: progress(fraction_done, message) - called after every step.
ProgressFn = Callable[[float, str], None]


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling and cache settings of a live run."""

    block_size: int = 16  # token slots per block (a power of two)
    num_blocks: int = 256  # blocks in the pool
    max_num_seqs: int = 8  # most sequences running at once
    enable_prefix_caching: bool = True  # share full prompt blocks by content (hash chain)
    backend: str = "auto"  # kernels backend: auto, torch or triton
    check_every: int = 4  # compare with a dense recompute every N steps (0: never)
    check_max_seqs: int = 4  # sequences checked per sampled step
    validate: bool = True  # let the kernels check block ids (a device sync on CUDA)

    def __post_init__(self) -> None:
        B = self.block_size
        if isinstance(B, bool) or not isinstance(B, int) or B < 1 or B & (B - 1) or B > 256:
            raise KvsimError(f"block size must be a power of two from 1 to 256, got {B!r}")
        for name in ("num_blocks", "max_num_seqs", "check_max_seqs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise KvsimError(f"{name.replace('_', ' ')} must be a positive integer, got {v!r}")
        if isinstance(self.check_every, bool) or not isinstance(self.check_every, int) or self.check_every < 0:
            raise KvsimError(f"check every must be a non-negative integer, got {self.check_every!r}")
        if self.backend not in kernels._backend.BACKENDS:
            raise KvsimError(f"backend must be one of {', '.join(kernels._backend.BACKENDS)}, got {self.backend!r}")


@dataclass
class RequestTrace:
    """What happened to one request (engine-clock seconds)."""

    request_id: int
    prompt_tokens: int
    output_tokens: int = 0  # per sample
    samples: int = 1  # sequences the request decodes as (parallel sampling)
    arrival_s: float = math.nan  # clock when it became eligible (start of its arrival step)
    first_token_s: float = math.nan  # clock at the end of the step that produced its first token
    finish_s: float = math.nan
    preemptions: int = 0


@dataclass
class EngineRun:
    """The result of running a workload through one engine."""

    engine: str  # "paged" or "contiguous"
    timeline: pd.DataFrame  # one row per step (kvsim.timeline columns)
    outputs: dict[int, tuple[int, ...]]  # request id -> generated tokens (of sample 0)
    requests: list[RequestTrace]
    preemptions: int
    steps: int
    elapsed_s: float  # engine clock: sum of step times (measurement and checks excluded)
    max_abs_error: float  # largest |paged - dense| attention output over checked steps (nan: none checked)
    checked_steps: int
    batches: list[dict] = field(default_factory=list)  # per step: prefill_tokens, prefill_cached, decode_context, step_time_s
    stats: dict = field(default_factory=dict)  # engine-specific counters (prefix hits, peaks, CUDA memory)
    samples: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)  # request id -> every sample's tokens


class _Seq:
    """One sample of a running or waiting request (internal). A waiting request is its
    sample 0; the other samples exist from the fork after the prefill to the finish."""

    __slots__ = ("req", "tokens", "generated", "num_stored", "order", "sample", "sid", "gen", "group")

    def __init__(self, req: LiveRequest, sample: int = 0, stride: int = 1) -> None:
        self.req = req
        self.tokens = list(req.prompt)  # prompt + generated so far
        self.generated: list[int] = []
        self.num_stored = 0  # tokens whose K/V is in the cache
        self.order = 0  # admission counter (newest = largest); the request's samples share it
        self.sample = sample  # index among the request's samples (0: greedy)
        self.sid = req.request_id * stride + sample  # block-pool / reservation id (request id when n = 1)
        self.gen = sample_generator(req.sample_seed, req.request_id, sample)
        self.group: list[_Seq] = [self]  # the request's samples, sample 0 first (shared list)

    def restart(self) -> None:
        """Back to the waiting queue after a preemption. One sample: recompute its prompt and
        the tokens generated so far. Several: drop the samples, restart from the prompt."""
        self.num_stored = 0
        if self.req.num_samples > 1:
            self.tokens = list(self.req.prompt)
            self.generated = []
            self.group = [self]


def sid_stride(requests: Sequence[LiveRequest]) -> int:
    """Pool ids are ``request_id * stride + sample``: the request id itself when every n is 1."""
    return max(r.num_samples for r in requests)


def pick_tokens(seqs: Sequence[_Seq], logits: torch.Tensor, prefilled: set[int], stride: int
                ) -> tuple[list[tuple[_Seq, int]], list[tuple[_Seq, list[_Seq]]]]:
    """Next tokens for ``seqs`` (row ``j`` of ``logits`` is ``seqs[j]``'s). A request of
    several samples whose sample 0 was just prefilled (``id`` in ``prefilled``) is forked:
    its other samples are made here (same tokens so far, fresh generators) and take their
    first tokens from the same logits. Returns ((seq, token) pairs, (parent, new samples))."""
    rows: list[int] = []
    owners: list[_Seq] = []
    forks: list[tuple[_Seq, list[_Seq]]] = []
    for j, seq in enumerate(seqs):
        rows.append(j)
        owners.append(seq)
        n = seq.req.num_samples
        if n > 1 and id(seq) in prefilled:
            kids = []
            for i in range(1, n):
                kid = _Seq(seq.req, i, stride)
                kid.tokens = list(seq.tokens)
                kid.num_stored = seq.num_stored
                kid.order = seq.order
                kids.append(kid)
            seq.group = [seq, *kids]
            for kid in kids:
                kid.group = seq.group
                rows.append(j)
                owners.append(kid)
            forks.append((seq, kids))
    tokens = choose_tokens(logits, rows, [s.gen for s in owners])
    return list(zip(owners, tokens)), forks


def take_tokens(pairs: Iterable[tuple[_Seq, int]]) -> tuple[list[_Seq], list[_Seq]]:
    """Append each sequence's sampled token (its K/V is now stored up to the token before);
    returns (sequences that produced their first token, sequences now finished)."""
    first_now: list[_Seq] = []
    finished_now: list[_Seq] = []
    for seq, token in pairs:
        seq.num_stored = len(seq.tokens)
        seq.generated.append(token)
        seq.tokens.append(token)
        if len(seq.generated) == 1:
            first_now.append(seq)
        if len(seq.generated) >= seq.req.max_new_tokens:
            finished_now.append(seq)
    return first_now, finished_now


def close_step(t_start: float, clock: float, device: torch.device, first_now: list[_Seq], finished_now: list[_Seq],
               traces: dict[int, "RequestTrace"]) -> tuple[float, float]:
    """End a step's timing (after the device has finished its work) and stamp first-token
    and finish times on the requests' traces; returns (step_time_s, clock_s)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    step_time = time.perf_counter() - t_start
    clock += step_time
    for seq in first_now:
        tr = traces[seq.req.request_id]
        if math.isnan(tr.first_token_s):  # a restarted request of several samples keeps its first
            tr.first_token_s = clock
    for seq in finished_now:
        tr = traces[seq.req.request_id]
        tr.finish_s = clock
        tr.output_tokens = len(seq.generated)
    return step_time, clock


def predicted_usage(spec, lens: Sequence[int], *, kv_dtype: str, block_size: int, shared_prefix_len: int = 0) -> tuple[int, int]:
    """(live, allocated) bytes the calculator predicts for sequences of ``lens`` stored tokens."""
    if not lens:
        return 0, 0
    shared = shared_prefix_len if len(lens) > 1 else 0
    u = kv_usage(spec, list(lens), kv_dtype=kv_dtype, block_size=block_size, shared_prefix_len=shared)
    return u.live_bytes, u.allocated_bytes


def predicted_group_usage(spec, groups: Sequence[tuple[int, Sequence[int]]], *, kv_dtype: str, block_size: int,
                          shared_prefix_len: int = 0) -> tuple[int, int]:
    """(live, allocated) bytes the calculator predicts for running requests given as
    ``(fork length, stored lengths of its samples)``, from the lengths and the sharing
    structure alone:

    - a request's samples share the ``fork length`` prompt: its full blocks are stored once
      and a sample that has stored more has its own copy of the partial block (the
      calculator's ``shared_prefix_len``: "full blocks stored once, partial block copied");
      samples still at the fork length have written nothing of their own, so they are one
      sequence physically (the partial block not yet copied);
    - requests that all start with the same ``shared_prefix_len`` tokens (a system prompt
      the prefix cache shares) store its full blocks once across requests.

    One-sample requests reduce to ``kv_usage(lens, shared_prefix_len=...)``.
    """
    if not groups:
        return 0, 0
    live = alloc = 0
    singles: list[int] = []
    for fork_len, lens in groups:
        physical = ([fork_len] if fork_len in lens else []) + [n for n in lens if n != fork_len]
        if len(physical) == 1:
            singles.append(physical[0])
            continue
        u = kv_usage(spec, physical, kv_dtype=kv_dtype, block_size=block_size, shared_prefix_len=fork_len)
        live += u.live_bytes
        alloc += u.allocated_bytes
    if singles:
        u = kv_usage(spec, singles, kv_dtype=kv_dtype, block_size=block_size)
        live += u.live_bytes
        alloc += u.allocated_bytes
    if shared_prefix_len and len(groups) > 1:
        saved = kv_usage(spec, [shared_prefix_len] * len(groups), kv_dtype=kv_dtype, block_size=block_size,
                         shared_prefix_len=shared_prefix_len).sharing_saved_bytes
        live -= saved
        alloc -= saved
    return live, alloc


def running_groups(running: Sequence[_Seq]) -> list[tuple[int, list[int]]]:
    """(fork length, stored lengths) per running request, in running order."""
    return [(len(s.req.prompt), [k.num_stored for k in s.group]) for s in running if s.sample == 0]


def common_shared_prefix(reqs: Sequence[LiveRequest]) -> int:
    """The prefix all ``reqs`` share by construction (one prefix group), else 0."""
    if len(reqs) < 2:
        return 0
    groups = {(r.prefix_group, r.shared_prefix_tokens) for r in reqs}
    if len(groups) != 1:
        return 0
    return next(iter(groups))[1]


def check_pool_fits(requests: Sequence[LiveRequest], num_blocks: int, block_size: int) -> None:
    """Every request must fit the pool on its own, or it could never finish."""
    worst = max(requests, key=lambda r: r.peak_blocks_for(block_size))
    need = worst.peak_blocks_for(block_size)
    if need > num_blocks:
        what = f"a request of {worst.final_len} tokens" + (
            f" x {worst.num_samples} samples" if worst.num_samples > 1 else "")
        raise KvsimError(
            f"the pool of {num_blocks} blocks x {block_size} tokens cannot hold {what} "
            f"({need} blocks); raise the pool size or lower the lengths"
        )


def check_samples_fit(requests: Sequence[LiveRequest], max_num_seqs: int) -> None:
    """A request's samples run together, so they must fit ``max_num_seqs``."""
    n = max(r.num_samples for r in requests)
    if n > max_num_seqs:
        raise KvsimError(
            f"a request of {n} samples needs {n} running sequences; max running sequences is {max_num_seqs}"
        )


class PagedEngine:
    """Runs :class:`LiveRequest` s through ``model`` over a :class:`PagedKVCache` (sample 0 greedy)."""

    name = "paged"

    def __init__(self, model: LiveModel, config: EngineConfig, *, kv_dtype: str = "fp32"):
        self.model = model
        self.config = config
        self.kv_dtype = kv_dtype
        self.spec = model.config.to_spec()
        c = model.config
        self.cache = PagedKVCache(c.num_layers, config.num_blocks, config.block_size, c.num_kv_heads, c.head_dim,
                                  dtype=model.dtype, device=model.device)
        self.pool = BlockPool(config.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching)
        self.backend = kernels._backend.resolve(config.backend, model.device)
        self.backend_mode = kernels.triton_mode() if self.backend == "triton" else "torch"

    # ----- pool operations with poisoning -------------------------------------------------

    def _release(self, seq: _Seq) -> None:
        """Free a sequence's blocks; poison those no longer referenced nor kept by the prefix cache."""
        table = self.pool.block_table(seq.sid)
        self.pool.free(seq.sid)
        freed = [b for b in set(table) if self.pool.ref_count(b) == 0]
        self.cache.poison(set(freed) - self._cached_blocks(freed))

    def _cached_blocks(self, candidates: Sequence[int]) -> set[int]:
        if not self.config.enable_prefix_caching or not candidates:
            return set()
        return {b.block_id for b in self.pool.blocks() if b.cached}

    def _retained_blocks(self) -> list[int]:
        """Free blocks whose K/V the prefix cache keeps for later hits (left out of the measurement)."""
        if not self.config.enable_prefix_caching:
            return []
        return [b.block_id for b in self.pool.blocks() if b.ref_count == 0 and b.cached]

    # ----- the loop ------------------------------------------------------------------------

    def run(self, requests: Sequence[LiveRequest], progress: ProgressFn | None = None) -> EngineRun:
        cfg = self.config
        if not requests:
            raise KvsimError("the workload has no requests")
        check_pool_fits(requests, cfg.num_blocks, cfg.block_size)
        check_samples_fit(requests, cfg.max_num_seqs)
        stride = sid_stride(requests)
        device = self.model.device
        on_cuda = device.type == "cuda"
        pending = sorted(requests, key=lambda r: (r.arrival_step, r.request_id))
        traces = {r.request_id: RequestTrace(r.request_id, len(r.prompt), samples=r.num_samples) for r in requests}
        waiting: list[_Seq] = []
        running: list[_Seq] = []
        outputs: dict[int, tuple[int, ...]] = {}
        done_samples: dict[int, dict[int, tuple[int, ...]]] = {}
        rows: list[dict] = []
        batches: list[dict] = []
        clock = 0.0
        step = 0
        preemptions = 0
        order = 0
        finished = 0
        max_err = math.nan
        checked = 0
        peak_retained = 0
        total = len(requests)
        cuda_peak = 0
        if on_cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)

        while finished < total:
            if not running and not waiting and pending and pending[0].arrival_step > step:
                step = pending[0].arrival_step  # idle: jump to the next arrival
            t_start = time.perf_counter()
            while pending and pending[0].arrival_step <= step:
                r = pending.pop(0)
                traces[r.request_id].arrival_s = clock
                waiting.append(_Seq(r, 0, stride))

            # 2. room for every running sequence's next token, preempting the newest request
            #    (all its samples) if needed
            grown: list[tuple[_Seq, list[int], list[tuple[int, int]]]] = []
            preempted_now = False
            for seq in list(running):
                if seq not in running:
                    continue  # preempted while making room for an older one
                sid = seq.sid
                while self.pool.append_slots_needed(sid, 1) > self.pool.num_free_blocks:
                    victim = max(running, key=lambda s: s.order)
                    self._preempt(victim, running, waiting, traces)
                    preemptions += 1
                    preempted_now = True
                    if seq not in running:
                        break
                if seq not in running:
                    continue
                before = len(self.pool.block_table(sid))
                pairs = self.pool.append_tokens(sid, 1)
                table = self.pool.block_table(sid)
                grown.append((seq, list(table[before:]) + [dst for _, dst in pairs], pairs))
            # a request preempting itself drops the samples it had already grown this step
            grown = [g for g in grown if g[0] in running]
            decoding = [g[0] for g in grown]
            new_blocks = [b for g in grown for b in g[1]]
            copies = [pair for g in grown for pair in g[2]]

            # 3. admission (FCFS, no skipping), only when nothing was preempted this step
            prefilling: list[tuple[_Seq, int]] = []  # (seq, cached tokens)
            num_seqs = len(running)  # sequences once this step's admissions have forked
            while not preempted_now and waiting and num_seqs + waiting[0].req.num_samples <= cfg.max_num_seqs:
                seq = waiting[0]
                n = len(seq.tokens)
                if not self.pool.can_allocate(n, self._keys(seq)):
                    break
                waiting.pop(0)
                alloc = self.pool.allocate(seq.sid, n, token_ids=seq.tokens if cfg.enable_prefix_caching else None)
                table = self.pool.block_table(seq.sid)
                new_blocks.extend(table[alloc.num_cached_blocks:])
                order += 1
                seq.order = order
                seq.num_stored = alloc.num_cached_tokens
                running.append(seq)
                num_seqs += seq.req.num_samples
                prefilling.append((seq, alloc.num_cached_tokens))
            if not running and waiting and not preempted_now:
                raise KvsimError(  # cannot happen after check_pool_fits; a clear message if it does
                    f"request {waiting[0].req.request_id} does not fit the empty pool of {cfg.num_blocks} blocks"
                )

            # 4. poison what the pool just handed out, then copy-on-write
            self.cache.poison(new_blocks)
            if copies:
                for layer in range(self.model.config.num_layers):
                    kc, vc = self.cache.layer(layer)
                    kernels.copy_blocks(kc, vc, copies, backend=self.backend, validate=cfg.validate)

            # 5. one forward over the packed new tokens
            check_now = cfg.check_every > 0 and step % cfg.check_every == 0 and (prefilling or decoding)
            recorded, segments, logits = self._forward(prefilling, decoding, record=bool(check_now))

            # 6. sample, fork the requests of several samples just prefilled, finish, free
            pairs, forks = pick_tokens([seq for seq, _ in segments], logits, {id(s) for s, _ in prefilling}, stride)
            for parent, kids in forks:
                at = running.index(parent) + 1
                for kid in kids:
                    self.pool.fork(parent.sid, kid.sid)
                running[at:at] = kids
            first_now, finished_now = take_tokens(pairs)
            for seq in finished_now:
                running.remove(seq)
                self._release(seq)
                got = done_samples.setdefault(seq.req.request_id, {})
                got[seq.sample] = tuple(seq.generated)
                if len(got) == seq.req.num_samples:
                    outputs[seq.req.request_id] = got[0]
                    finished += 1
            step_time, clock = close_step(t_start, clock, device, first_now, finished_now, traces)

            # 7. measure (not timed)
            if check_now and recorded:
                err = self._check(segments, recorded)
                max_err = err if math.isnan(max_err) else max(max_err, err)
                checked += 1
            retained = self._retained_blocks()
            m = self.cache.measure(exclude_blocks=retained)
            if retained:
                peak_retained = max(peak_retained, self.cache.measure().allocated_bytes - m.allocated_bytes)
            run_reqs = [s.req for s in running if s.sample == 0]
            shared = common_shared_prefix(run_reqs) if cfg.enable_prefix_caching else 0
            lens = [s.num_stored for s in running]
            p_live, p_alloc = predicted_group_usage(self.spec, running_groups(running), kv_dtype=self.kv_dtype,
                                                    block_size=cfg.block_size, shared_prefix_len=shared)
            unshared_alloc = predicted_usage(self.spec, lens, kv_dtype=self.kv_dtype, block_size=cfg.block_size)[1]
            if on_cuda:
                cuda_peak = max(cuda_peak, torch.cuda.max_memory_allocated(device))
            rows.append({
                "step": step, "time_s": clock, "step_time_s": step_time,
                "running": len(running), "waiting": len(waiting),
                "preemptions": preemptions, "finished": finished,
                "measured_kv_bytes": m.allocated_bytes, "predicted_kv_bytes": p_alloc,
                "live_bytes": m.live_bytes, "predicted_live_bytes": p_live,
                "shared_saved_bytes": unshared_alloc - p_alloc,
                "capacity_bytes": cfg.num_blocks * cfg.block_size * self.cache.bytes_per_token,
                "prefix_hit_blocks": self.pool.prefix_hit_blocks, "prefix_query_blocks": self.pool.prefix_query_blocks,
                "layers_agree": m.layers_agree,
            })
            batches.append({
                "step": step, "step_time_s": step_time,
                "prefill_tokens": [len(s.tokens) - 1 - c for s, c in prefilling],
                "prefill_cached": [c for _, c in prefilling],
                "decode_context": [s.num_stored for s in decoding],
            })
            step += 1
            if progress is not None:
                progress(finished / total, f"step {step}: {finished}/{total} requests finished, {len(running)} running")

        tl = pd.DataFrame(rows)
        layers_agree = bool(tl.pop("layers_agree").all())
        stats = {
            "layers_agree": layers_agree,
            "prefix_hit_blocks": self.pool.prefix_hit_blocks,
            "prefix_query_blocks": self.pool.prefix_query_blocks,
            "cow_copies": self.pool.num_cow_copies,
            "poisoned_blocks": self.cache.poisoned_blocks,
            "peak_retained_prefix_bytes": peak_retained,
            "pool_bytes": self.cache.pool_bytes,
        }
        if on_cuda:
            stats["cuda_memory_allocated_bytes"] = int(torch.cuda.memory_allocated(device))
            stats["cuda_max_memory_allocated_bytes"] = int(cuda_peak)
        samples = {rid: tuple(got[i] for i in range(len(got))) for rid, got in sorted(done_samples.items())}
        return EngineRun("paged", make_timeline(tl.assign(source="paged")), outputs, list(traces.values()),
                         preemptions, len(rows), clock, max_err, checked, batches, stats, samples)

    def _keys(self, seq: _Seq):
        if not self.config.enable_prefix_caching:
            return None
        return token_block_keys(seq.tokens, self.config.block_size)

    def _preempt(self, victim: _Seq, running: list[_Seq], waiting: list[_Seq], traces: dict) -> None:
        """Preemption by recompute of the victim's whole request: free every sample's blocks,
        requeue it at the front (see :meth:`_Seq.restart`)."""
        group = list(victim.group)
        for seq in group:
            running.remove(seq)
            self._release(seq)
        head = group[0]
        head.restart()
        waiting.insert(0, head)
        traces[head.req.request_id].preemptions += 1

    def _forward(self, prefilling, decoding, *, record: bool):
        """Run the model over this step's new tokens; returns (recorded outputs, segments, logits).

        segments: (seq, (row_lo, row_hi) in the packed batch) per sequence; logits: float32
        ``[len(segments), vocab]`` at each sequence's last new token.
        """
        cfg, B = self.config, self.config.block_size
        device = self.model.device
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        spans: list[tuple[_Seq, int, int]] = []
        for seq, cached in prefilling:
            table = self.pool.block_table(seq.sid)
            lo = len(tokens)
            for p in range(cached, len(seq.tokens)):
                tokens.append(seq.tokens[p])
                positions.append(p)
                slots.append(table[p // B] * B + p % B)
            spans.append((seq, lo, len(tokens)))
        num_prefill_tokens = len(tokens)
        for seq in decoding:
            table = self.pool.block_table(seq.sid)
            p = len(seq.tokens) - 1
            tokens.append(seq.tokens[p])
            positions.append(p)
            slots.append(table[p // B] * B + p % B)
            spans.append((seq, len(tokens) - 1, len(tokens)))
        if not tokens:
            return {}, [], torch.empty(0, self.model.config.vocab_size)

        def tables(seqs) -> torch.Tensor:
            rows = [self.pool.block_table(s.sid) for s in seqs]
            width = max(len(r) for r in rows)
            return torch.tensor([list(r) + [-1] * (width - len(r)) for r in rows], dtype=torch.int32, device=device)

        i32 = dict(dtype=torch.int32, device=device)
        slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
        pre = [s for s, _ in prefilling]
        if pre:
            bt_pre = tables(pre)
            ctx = torch.tensor([c for _, c in prefilling], **i32)
            qsl = torch.tensor([0] + [hi for _, _, hi in spans[:len(pre)]], **i32)
        if decoding:
            bt_dec = tables(decoding)
            dec_lens = torch.tensor([len(s.tokens) for s in decoding], **i32)
        recorded: dict[int, torch.Tensor] = {}
        backend, validate = self.backend, cfg.validate
        n_pre = num_prefill_tokens

        def attend(layer: int, q, k, v):
            kc, vc = self.cache.layer(layer)
            kernels.write_kv(k, v, kc, vc, slot_mapping, backend=backend, validate=validate)
            out = torch.empty_like(q)  # [T, num_heads, head_dim]
            if n_pre:
                out[:n_pre] = kernels.paged_prefill(q[:n_pre], kc, vc, bt_pre, ctx, qsl, backend=backend, validate=validate)
            if decoding:
                out[n_pre:] = kernels.paged_attention(q[n_pre:], kc, vc, bt_dec, dec_lens, backend=backend, validate=validate)
            if record:
                recorded[layer] = out.detach().clone()
            return out

        ids = torch.tensor(tokens, dtype=torch.int64, device=device)
        pos = torch.tensor(positions, dtype=torch.int64, device=device)
        hidden = self.model.forward(ids, pos, attend)  # [T, hidden]
        last = torch.tensor([hi - 1 for _, _, hi in spans], dtype=torch.int64, device=device)
        logits = self.model.logits(hidden[last])
        segments = [(seq, (lo, hi)) for seq, lo, hi in spans]
        return recorded, segments, logits

    def _check(self, segments, recorded: dict[int, torch.Tensor]) -> float:
        """Largest |paged - dense| attention output over the checked sequences' new tokens, all layers."""
        err = 0.0
        for seq, (lo, hi) in segments[: self.config.check_max_seqs]:
            stored = seq.tokens[: seq.num_stored]  # the tokens whose K/V the cache now holds
            first = seq.num_stored - (hi - lo)
            ref = self.model.dense_layer_outputs(stored)
            for layer, out in recorded.items():
                diff = (out[lo:hi].float() - ref[layer][first:].float()).abs().max().item()
                err = max(err, diff if not math.isnan(diff) else math.inf)
        return err


__all__ = ["EngineConfig", "EngineRun", "PagedEngine", "RequestTrace", "predicted_usage", "predicted_group_usage",
           "common_shared_prefix", "check_pool_fits", "check_samples_fit"]
