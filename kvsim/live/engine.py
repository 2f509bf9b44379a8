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
6. greedy next tokens; finished requests are freed and their unshared blocks poisoned;
7. (outside the timed step) the KV cache is *measured* from the tensor
   (:meth:`PagedKVCache.measure`) and the calculator predicts the same quantity from the
   running sequences' stored lengths alone; every ``check_every`` steps the attention
   outputs of up to ``check_max_seqs`` sequences are compared with a dense recompute.

Every request's last output token is never fed back, so a request of ``P`` prompt and
``O`` output tokens stores ``P + O - 1`` tokens at most (the calculator's convention).
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
    output_tokens: int = 0
    arrival_s: float = math.nan  # clock when it became eligible (start of its arrival step)
    first_token_s: float = math.nan  # clock at the end of the step that produced its first token
    finish_s: float = math.nan
    preemptions: int = 0


@dataclass
class EngineRun:
    """The result of running a workload through one engine."""

    engine: str  # "paged" or "contiguous"
    timeline: pd.DataFrame  # one row per step (kvsim.timeline columns)
    outputs: dict[int, tuple[int, ...]]  # request id -> generated tokens
    requests: list[RequestTrace]
    preemptions: int
    steps: int
    elapsed_s: float  # engine clock: sum of step times (measurement and checks excluded)
    max_abs_error: float  # largest |paged - dense| attention output over checked steps (nan: none checked)
    checked_steps: int
    batches: list[dict] = field(default_factory=list)  # per step: prefill_tokens, prefill_cached, decode_context, step_time_s
    stats: dict = field(default_factory=dict)  # engine-specific counters (prefix hits, peaks, CUDA memory)


class _Seq:
    """A running or waiting request (internal)."""

    __slots__ = ("req", "tokens", "generated", "num_stored", "order")

    def __init__(self, req: LiveRequest) -> None:
        self.req = req
        self.tokens = list(req.prompt)  # prompt + generated so far
        self.generated: list[int] = []
        self.num_stored = 0  # tokens whose K/V is in the cache
        self.order = 0  # admission counter (newest = largest)


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
        traces[seq.req.request_id].first_token_s = clock
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
    longest = max(r.final_len for r in requests)
    need = -(-longest // block_size)
    if need > num_blocks:
        raise KvsimError(
            f"the pool of {num_blocks} blocks x {block_size} tokens cannot hold a request of {longest} tokens "
            f"({need} blocks); raise the pool size or lower the lengths"
        )


class PagedEngine:
    """Runs :class:`LiveRequest` s greedily through ``model`` over a :class:`PagedKVCache`."""

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
        rid = seq.req.request_id
        table = self.pool.block_table(rid)
        self.pool.free(rid)
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
        device = self.model.device
        on_cuda = device.type == "cuda"
        pending = sorted(requests, key=lambda r: (r.arrival_step, r.request_id))
        traces = {r.request_id: RequestTrace(r.request_id, len(r.prompt)) for r in requests}
        waiting: list[_Seq] = []
        running: list[_Seq] = []
        outputs: dict[int, tuple[int, ...]] = {}
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
                waiting.append(_Seq(r))

            # 2. room for every running sequence's next token, preempting the newest if needed
            new_blocks: list[int] = []
            copies: list[tuple[int, int]] = []
            preempted_now = False
            decoding: list[_Seq] = []
            for seq in list(running):
                if seq not in running:
                    continue  # preempted while making room for an older one
                rid = seq.req.request_id
                while self.pool.append_slots_needed(rid, 1) > self.pool.num_free_blocks:
                    victim = max(running, key=lambda s: s.order)
                    self._preempt(victim, running, waiting, traces)
                    preemptions += 1
                    preempted_now = True
                    if victim is seq:
                        break
                if seq not in running:
                    continue
                before = len(self.pool.block_table(rid))
                pairs = self.pool.append_tokens(rid, 1)
                table = self.pool.block_table(rid)
                new_blocks.extend(table[before:])
                for src, dst in pairs:
                    new_blocks.append(dst)
                    copies.append((src, dst))
                decoding.append(seq)

            # 3. admission (FCFS, no skipping), only when nothing was preempted this step
            prefilling: list[tuple[_Seq, int]] = []  # (seq, cached tokens)
            while not preempted_now and waiting and len(running) < cfg.max_num_seqs:
                seq = waiting[0]
                n = len(seq.tokens)
                if not self.pool.can_allocate(n, self._keys(seq)):
                    break
                waiting.pop(0)
                alloc = self.pool.allocate(seq.req.request_id, n, token_ids=seq.tokens if cfg.enable_prefix_caching else None)
                table = self.pool.block_table(seq.req.request_id)
                new_blocks.extend(table[alloc.num_cached_blocks:])
                order += 1
                seq.order = order
                seq.num_stored = alloc.num_cached_tokens
                running.append(seq)
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
            recorded, segments = self._forward(prefilling, decoding, record=bool(check_now))

            # 6. sample, finish, free
            first_now, finished_now = take_tokens((seq, token) for seq, _, token in segments)
            for seq in finished_now:
                running.remove(seq)
                self._release(seq)
                outputs[seq.req.request_id] = tuple(seq.generated)
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
            run_reqs = [s.req for s in running]
            shared = common_shared_prefix(run_reqs) if cfg.enable_prefix_caching else 0
            lens = [s.num_stored for s in running]
            p_live, p_alloc = predicted_usage(self.spec, lens, kv_dtype=self.kv_dtype, block_size=cfg.block_size,
                                              shared_prefix_len=shared)
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
        return EngineRun("paged", make_timeline(tl.assign(source="paged")), outputs, list(traces.values()),
                         preemptions, len(rows), clock, max_err, checked, batches, stats)

    def _keys(self, seq: _Seq):
        if not self.config.enable_prefix_caching:
            return None
        return token_block_keys(seq.tokens, self.config.block_size)

    def _preempt(self, victim: _Seq, running: list[_Seq], waiting: list[_Seq], traces: dict) -> None:
        """Preemption by recompute: free the blocks, requeue at the front with the tokens so far."""
        running.remove(victim)
        self._release(victim)
        victim.num_stored = 0
        waiting.insert(0, victim)
        traces[victim.req.request_id].preemptions += 1

    def _forward(self, prefilling, decoding, *, record: bool):
        """Run the model over this step's new tokens; returns (recorded outputs, segments).

        segments: (seq, (row_lo, row_hi) in the packed batch, next token) per sequence.
        """
        cfg, B = self.config, self.config.block_size
        device = self.model.device
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        spans: list[tuple[_Seq, int, int]] = []
        for seq, cached in prefilling:
            table = self.pool.block_table(seq.req.request_id)
            lo = len(tokens)
            for p in range(cached, len(seq.tokens)):
                tokens.append(seq.tokens[p])
                positions.append(p)
                slots.append(table[p // B] * B + p % B)
            spans.append((seq, lo, len(tokens)))
        num_prefill_tokens = len(tokens)
        for seq in decoding:
            table = self.pool.block_table(seq.req.request_id)
            p = len(seq.tokens) - 1
            tokens.append(seq.tokens[p])
            positions.append(p)
            slots.append(table[p // B] * B + p % B)
            spans.append((seq, len(tokens) - 1, len(tokens)))
        if not tokens:
            return {}, []

        def tables(seqs) -> torch.Tensor:
            rows = [self.pool.block_table(s.req.request_id) for s in seqs]
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
        next_tokens = self.model.logits(hidden[last]).argmax(dim=-1).tolist()
        segments = [(seq, (lo, hi), int(t)) for (seq, lo, hi), t in zip(spans, next_tokens)]
        return recorded, segments

    def _check(self, segments, recorded: dict[int, torch.Tensor]) -> float:
        """Largest |paged - dense| attention output over the checked sequences' new tokens, all layers."""
        err = 0.0
        for seq, (lo, hi), _ in segments[: self.config.check_max_seqs]:
            stored = seq.tokens[: seq.num_stored]  # the tokens whose K/V the cache now holds
            first = seq.num_stored - (hi - lo)
            ref = self.model.dense_layer_outputs(stored)
            for layer, out in recorded.items():
                diff = (out[lo:hi].float() - ref[layer][first:].float()).abs().max().item()
                err = max(err, diff if not math.isnan(diff) else math.inf)
        return err


__all__ = ["EngineConfig", "EngineRun", "PagedEngine", "RequestTrace", "predicted_usage", "common_shared_prefix",
           "check_pool_fits"]
