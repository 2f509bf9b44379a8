"""Turning a :class:`~kvsim.workloads.Workload` (lengths and arrival times) into token
prompts the live model can run.

- Lengths are *scaled to fit*: when some request's final length ``P + O - 1`` exceeds
  ``max_len``, every prompt, output and shared prefix is multiplied by the same factor
  ``max_len / longest`` (rounded down, at least 1 token), so the distribution's shape is
  kept; a request still too long after rounding is trimmed.
- Token ids are drawn from a seeded generator. Requests of the same ``prefix_group`` start
  with the same ``shared_prefix_tokens`` ids (a system prompt), so a prefix cache can hit
  them; with Mooncake-style ``block_hashes``, each hash block's ids are drawn from a
  generator seeded by the hash id, so equal hash chains give equal token prefixes.
- Arrivals become engine steps: a request may be admitted from step
  ``floor(arrival_s * steps_per_s)`` on (deterministic, so two engines see the same
  arrivals; wall-clock arrivals would make admission depend on machine speed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsim.errors import KvsimError
from kvsim.workloads import PRESET_WORKLOADS, Workload, preset_workload, synthetic_workload

#: Workload sources besides a trace file path.
WORKLOAD_KINDS = ("synthetic", *PRESET_WORKLOADS)


@dataclass(frozen=True)
class LiveRequest:
    """One request as the live engines run it."""

    request_id: int  # index in the workload
    arrival_step: int  # first engine step at which it may be admitted
    prompt: tuple[int, ...]  # token ids
    max_new_tokens: int  # tokens each sample generates (no end-of-sequence token)
    shared_prefix_tokens: int = 0  # leading prompt tokens shared with its prefix group
    prefix_group: int = 0
    num_samples: int = 1  # parallel sampling: sequences forked from the prompt after its prefill
    sample_seed: int = 0  # seeds the generators of samples 1.. (kvsim.live.sampling)

    def peak_blocks_for(self, block_size: int) -> int:
        """Blocks the request holds at its final length when running alone: the prompt's full
        blocks once (shared by its samples), every sample's other blocks its own."""
        shared = len(self.prompt) // block_size if self.num_samples > 1 else 0
        return shared + self.num_samples * (-(-self.final_len // block_size) - shared)

    @property
    def final_len(self) -> int:
        """Tokens stored at the end: prompt + output - 1 (the last token is never fed back)."""
        return len(self.prompt) + self.max_new_tokens - 1


@dataclass(frozen=True)
class PreparedWorkload:
    """The live requests and how they were made from the workload."""

    requests: tuple[LiveRequest, ...]
    scale: float  # length scale factor applied (1.0: lengths as given)
    max_len: int  # the longest final length allowed
    description: str  # the workload's own description
    name: str

    def length_stats(self) -> dict:
        """Prompt/output length distribution after scaling (for the run record)."""
        p = np.array([len(r.prompt) for r in self.requests])
        o = np.array([r.max_new_tokens for r in self.requests])

        def dist(a: np.ndarray) -> dict:
            return {"mean": float(a.mean()), "min": int(a.min()), "p50": float(np.percentile(a, 50)),
                    "p99": float(np.percentile(a, 99)), "max": int(a.max())}

        return {"requests": len(self.requests), "prompt_tokens": dist(p), "output_tokens": dist(o),
                "samples_per_request": max(r.num_samples for r in self.requests),
                "shared_prefix_tokens": max((r.shared_prefix_tokens for r in self.requests), default=0),
                "arrival_steps": [int(min(r.arrival_step for r in self.requests)),
                                  int(max(r.arrival_step for r in self.requests))]}


def prepare_requests(workload: Workload, *, max_len: int, vocab_size: int, seed: int = 0,
                     steps_per_s: float = 10.0) -> PreparedWorkload:
    """Scale ``workload``'s lengths to ``max_len`` and draw token ids (see the module docstring)."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise KvsimError(f"max_len must be an integer >= 2, got {max_len!r}")
    if not (isinstance(steps_per_s, (int, float)) and math.isfinite(steps_per_s) and steps_per_s > 0):
        raise KvsimError(f"steps per second must be a positive number, got {steps_per_s!r}")
    if any(r.beam_width > 1 for r in workload.requests):
        raise KvsimError("live mode runs parallel sampling, not beam search")
    longest = max(r.final_len for r in workload.requests)
    scale = min(1.0, max_len / longest)
    t0 = workload.requests[0].arrival_s if workload.timed else 0.0
    out = []
    for i, r in enumerate(workload.requests):
        p = max(1, int(r.prompt_tokens * scale))
        o = max(1, int(r.output_tokens * scale))
        shared = min(p, int(r.shared_prefix_tokens * scale))
        if p + o - 1 > max_len:  # rounding left it too long: trim the output, then the prompt
            o = max(1, max_len - p + 1)
            p = min(p, max_len - o + 1)
            shared = min(shared, p)
        prompt = _prompt_ids(r, i, p, shared, scale, workload.hash_block_size, vocab_size, seed)
        step = int(math.floor((r.arrival_s - t0) * steps_per_s)) if workload.timed else 0
        out.append(LiveRequest(i, max(0, step), prompt, o, shared, r.prefix_group, r.num_samples, seed))
    return PreparedWorkload(tuple(out), scale, max_len, workload.description, workload.name)


def _prompt_ids(r, index: int, length: int, shared: int, scale: float, hash_block: int | None,
                vocab: int, seed: int) -> tuple[int, ...]:
    ids: list[int] = []
    if r.block_hashes and hash_block:
        per = max(1, int(hash_block * scale))
        for h in r.block_hashes:
            if len(ids) >= length:
                break
            rng = np.random.default_rng([seed, 1, int(h) & 0xFFFFFFFF, int(h) >> 32 & 0xFFFFFFFF])
            ids.extend(rng.integers(0, vocab, size=per).tolist())
        ids = ids[:length]
    elif shared:
        rng = np.random.default_rng([seed, 2, int(r.prefix_group)])
        ids = rng.integers(0, vocab, size=shared).tolist()
    rest = length - len(ids)
    if rest > 0:
        rng = np.random.default_rng([seed, 3, index])
        ids.extend(rng.integers(0, vocab, size=rest).tolist())
    return tuple(int(t) for t in ids)


def make_workload(kind: str = "synthetic", *, num_requests: int = 16, prompt: str = "uniform:16:64",
                  output: str = "uniform:16:64", arrivals: str = "all-at-once", shared_prefix: int = 0,
                  seed: int = 0, num_samples: int = 1) -> Workload:
    """A workload by name: ``synthetic`` (``prompt``/``output`` length specs), a preset
    (``sharegpt-like``, ``alpaca-like``) or a trace file path (first ``num_requests`` rows;
    ``arrivals`` ``trace`` keeps its times). ``shared_prefix`` prepends a system prompt of
    that many tokens to every prompt (synthetic and presets only). ``num_samples`` is the
    parallel samples of every request (any workload)."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise KvsimError(f"samples per request must be a positive integer, got {num_samples!r}")
    key = str(kind).strip()
    if key.lower() == "synthetic":
        return synthetic_workload(num_requests, prompt, output, arrivals=arrivals, seed=seed,
                                  system_prompt_tokens=shared_prefix, num_samples=num_samples)
    if key.lower() in PRESET_WORKLOADS:
        return preset_workload(key.lower(), num_requests, arrivals=arrivals, seed=seed,
                               system_prompt_tokens=shared_prefix, num_samples=num_samples)
    from pathlib import Path

    from kvsim.traces import read_trace

    if not Path(key).exists():
        raise KvsimError(f"unknown workload {kind!r}; use {', '.join(WORKLOAD_KINDS)} or a trace file path")
    if shared_prefix:
        raise KvsimError("--shared-prefix applies to synthetic and preset workloads, not to traces")
    w = read_trace(key, limit=num_requests)
    if num_samples > 1:
        from dataclasses import replace

        w = replace(w, requests=tuple(replace(r, num_samples=num_samples) for r in w.requests))
    if arrivals == "all-at-once":
        return w.all_at_once()
    if arrivals.startswith("poisson:"):
        from kvsim.workloads import parse_arrivals

        return w.with_poisson_arrivals(parse_arrivals(arrivals)[1], seed)
    return w


__all__ = ["LiveRequest", "PreparedWorkload", "prepare_requests", "make_workload", "WORKLOAD_KINDS"]
