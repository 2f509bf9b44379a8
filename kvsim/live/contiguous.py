"""The contiguous baseline: every request reserves its own KV tensor of ``max_len`` slots.

The allocation the paged design replaces: on admission a request gets a key and a value
tensor ``[num_layers, max_len, num_kv_heads, head_dim]`` (its maximum length, reserved up
front), written in place as it grows, dropped when it finishes. Same model, same token
choice (:mod:`kvsim.live.sampling`), same FCFS admission and ``max_num_seqs`` cap as
:class:`~kvsim.live.engine.PagedEngine`;
attention is :func:`~kvsim.live.model.dense_attention` over the reservation's first
tokens (no kernels, no block tables), so its tokens are an independent reference for the
paged engine's.

Measured the same way (:meth:`ContiguousKVCache.measure`): ``measured_kv_bytes`` is the
bytes of the reservation tensors that exist, ``live_bytes`` the written slots counted from
their keys; on CUDA the reservations are real allocations, so
``torch.cuda.max_memory_allocated`` sees them too. ``capacity_bytes`` (optional) caps the
reservations' total, which makes admission wait for memory the way a reserving server does;
with ``None`` the cap is ``max_num_seqs`` alone.

Parallel sampling: after a request's prefill, each of its other samples gets its own
reservation, and the prompt's K/V are *copied* from sample 0's reservation (not
recomputed: a contiguous engine has nothing to share, the copy is what it pays); the
samples then decode with the same generators as the paged engine's. This engine never
preempts.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import pandas as pd
import torch

from kvsim.calculator import kv_usage
from kvsim.errors import KvsimError
from kvsim.live.cache import ContiguousKVCache
from kvsim.live.engine import (EngineRun, ProgressFn, RequestTrace, _Seq, check_samples_fit, close_step, pick_tokens,
                               sid_stride, take_tokens)
from kvsim.live.model import LiveModel, dense_attention
from kvsim.live.requests import LiveRequest
from kvsim.timeline import make_timeline


class ContiguousEngine:
    """Runs requests, each sample over its own ``max_len`` reservation."""

    name = "contiguous"

    def __init__(self, model: LiveModel, *, max_len: int, max_num_seqs: int = 8, kv_dtype: str = "fp32",
                 capacity_bytes: int | None = None):
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
            raise KvsimError(f"max_len must be a positive integer, got {max_len!r}")
        self.model = model
        self.max_len = max_len
        self.max_num_seqs = max_num_seqs
        self.kv_dtype = kv_dtype
        self.capacity_bytes = capacity_bytes
        self.spec = model.config.to_spec()
        c = model.config
        self.cache = ContiguousKVCache(c.num_layers, max_len, c.num_kv_heads, c.head_dim, dtype=model.dtype,
                                       device=model.device)
        self.reservation_bytes = max_len * self.cache.slot_bytes_per_layer * c.num_layers

    def run(self, requests: Sequence[LiveRequest], progress: ProgressFn | None = None) -> EngineRun:
        if not requests:
            raise KvsimError("the workload has no requests")
        longest = max(r.final_len for r in requests)
        if longest > self.max_len:
            raise KvsimError(f"a request of {longest} tokens exceeds the reservation of {self.max_len} tokens")
        n_max = max(r.num_samples for r in requests)
        if self.capacity_bytes is not None and n_max * self.reservation_bytes > self.capacity_bytes:
            raise KvsimError(f"{n_max} reservation(s) of {self.max_len} tokens do not fit the capacity")
        check_samples_fit(requests, self.max_num_seqs)
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
        clock, step, finished, total = 0.0, 0, 0, len(requests)
        cuda_peak = 0
        if on_cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)

        while finished < total:
            if not running and not waiting and pending and pending[0].arrival_step > step:
                step = pending[0].arrival_step
            t_start = time.perf_counter()
            while pending and pending[0].arrival_step <= step:
                r = pending.pop(0)
                traces[r.request_id].arrival_s = clock
                waiting.append(_Seq(r, 0, stride))
            decoding = list(running)
            prefilling: list[_Seq] = []
            num_seqs = len(running)  # sequences (reservations) once this step's admissions have forked
            while waiting and num_seqs + waiting[0].req.num_samples <= self.max_num_seqs and (
                    self.capacity_bytes is None
                    or (num_seqs + waiting[0].req.num_samples) * self.reservation_bytes <= self.capacity_bytes):
                seq = waiting.pop(0)
                self.cache.reserve(seq.sid)
                running.append(seq)
                prefilling.append(seq)
                num_seqs += seq.req.num_samples

            seqs, logits = self._forward(prefilling, decoding)
            pairs, forks = pick_tokens(seqs, logits, {id(s) for s in prefilling}, stride)
            for parent, kids in forks:  # each sample its own reservation, the prompt's K/V copied
                at = running.index(parent) + 1
                n = len(parent.tokens)
                for kid in kids:
                    self.cache.reserve(kid.sid)
                    self.cache.key[kid.sid][:, :n] = self.cache.key[parent.sid][:, :n]
                    self.cache.value[kid.sid][:, :n] = self.cache.value[parent.sid][:, :n]
                running[at:at] = kids
            first_now, finished_now = take_tokens(pairs)
            for seq in finished_now:
                running.remove(seq)
                self.cache.release(seq.sid)
                got = done_samples.setdefault(seq.req.request_id, {})
                got[seq.sample] = tuple(seq.generated)
                if len(got) == seq.req.num_samples:
                    outputs[seq.req.request_id] = got[0]
                    finished += 1
            step_time, clock = close_step(t_start, clock, device, first_now, finished_now, traces)

            m = self.cache.measure()
            lens = [s.num_stored for s in running]
            if lens:
                u = kv_usage(self.spec, lens, kv_dtype=self.kv_dtype, block_size=1, max_len=self.max_len)
                p_reserved, p_live = u.reserved_bytes, u.live_bytes
            else:
                p_reserved = p_live = 0
            if on_cuda:
                cuda_peak = max(cuda_peak, torch.cuda.max_memory_allocated(device))
            row = {
                "step": step, "time_s": clock, "step_time_s": step_time,
                "running": len(running), "waiting": len(waiting), "preemptions": 0, "finished": finished,
                "measured_kv_bytes": m.allocated_bytes, "predicted_kv_bytes": p_reserved,
                "live_bytes": m.live_bytes, "predicted_live_bytes": p_live,
            }
            if self.capacity_bytes is not None:
                row["capacity_bytes"] = self.capacity_bytes
            rows.append(row)
            step += 1
            if progress is not None:
                progress(finished / total, f"contiguous step {step}: {finished}/{total} requests finished")

        stats = {"reservation_bytes": self.reservation_bytes, "max_len": self.max_len}
        if on_cuda:
            stats["cuda_max_memory_allocated_bytes"] = int(cuda_peak)
        tl = make_timeline(pd.DataFrame(rows).assign(source="contiguous"))
        samples = {rid: tuple(got[i] for i in range(len(got))) for rid, got in sorted(done_samples.items())}
        return EngineRun("contiguous", tl, outputs, list(traces.values()), 0, len(rows), clock, math.nan, 0, [], stats,
                         samples)

    def _forward(self, prefilling: list[_Seq], decoding: list[_Seq]) -> tuple[list[_Seq], torch.Tensor]:
        """Run the model over this step's new tokens; returns the sequences and their float32
        logits at each one's last new token."""
        device = self.model.device
        tokens: list[int] = []
        positions: list[int] = []
        spans: list[tuple[_Seq, int, int, int]] = []  # seq, row_lo, row_hi, first position
        for seq in prefilling:
            lo = len(tokens)
            tokens.extend(seq.tokens)
            positions.extend(range(len(seq.tokens)))
            spans.append((seq, lo, len(tokens), 0))
        for seq in decoding:
            p = len(seq.tokens) - 1
            tokens.append(seq.tokens[p])
            positions.append(p)
            spans.append((seq, len(tokens) - 1, len(tokens), p))
        if not tokens:
            return [], torch.empty(0, self.model.config.vocab_size)

        def attend(layer: int, q, k, v):
            out = torch.empty_like(q)  # [T, num_heads, head_dim]
            for seq, lo, hi, first in spans:
                kr = self.cache.key[seq.sid][layer]  # [max_len, kv_heads, head_dim]
                vr = self.cache.value[seq.sid][layer]
                kr[first:first + hi - lo] = k[lo:hi]
                vr[first:first + hi - lo] = v[lo:hi]
                out[lo:hi] = dense_attention(q[lo:hi], kr[:first + hi - lo], vr[:first + hi - lo], first)
            return out

        ids = torch.tensor(tokens, dtype=torch.int64, device=device)
        pos = torch.tensor(positions, dtype=torch.int64, device=device)
        hidden = self.model.forward(ids, pos, attend)
        last = torch.tensor([hi - 1 for _, _, hi, _ in spans], dtype=torch.int64, device=device)
        return [seq for seq, _, _, _ in spans], self.model.logits(hidden[last])


__all__ = ["ContiguousEngine"]
