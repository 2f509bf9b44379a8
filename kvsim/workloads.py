"""Workloads: the requests a simulation replays.

A :class:`Workload` is an ordered tuple of :class:`Request` s (arrival time, prompt and
output lengths, optional sharing) plus how its prompt blocks can be matched by a prefix
cache. Workloads come from :func:`synthetic_workload` (fixed, uniform or lognormal
lengths; all-at-once or Poisson arrivals; parallel sampling, beam search, a shared system
prompt), from the presets in :data:`PRESET_WORKLOADS`, or from real traces
(:mod:`kvsim.traces`).

The ShareGPT-like and Alpaca-like presets are *fitted stand-ins*, not the datasets: each
length is drawn from a lognormal distribution whose mean equals the one the PagedAttention
paper reports (ShareGPT: input 161.31, output 337.99 tokens; Alpaca: input 19.31, output
58.45), with a spread chosen by hand (sigma 1.0/0.8 and 0.6/0.8), and pairs whose total
exceeds the model's context (``max_len``) are redrawn, which trims the mean of the
ShareGPT-like outputs by about 1 %. Use a real trace (``kvsim.traces``) for real shapes.

Counting convention: a request with ``P`` prompt tokens and ``O`` output tokens stores at
most ``P + O - 1`` tokens (the last output token is never fed back), its *final length*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from kvsim.errors import KvsimError


@dataclass(frozen=True)
class Request:
    """One request as the scheduler sees it."""

    arrival_s: float  # seconds from the start of the workload
    prompt_tokens: int  # P >= 1
    output_tokens: int  # O >= 1, tokens generated per sequence
    num_samples: int = 1  # parallel sampling: n sequences share the prompt (fork)
    beam_width: int = 1  # beam search: k beams share the prompt and re-fork as they go
    block_hashes: tuple[int, ...] | None = None  # chained prompt block hashes (Workload.hash_block_size tokens each)
    shared_prefix_tokens: int = 0  # leading prompt tokens equal across requests of the same prefix_group
    prefix_group: int = 0  # which shared prefix (system prompt) those tokens are

    @property
    def num_seqs(self) -> int:
        """Sequences the request runs as (samples or beams)."""
        return max(self.num_samples, self.beam_width)

    @property
    def final_len(self) -> int:
        """Tokens a sequence of this request stores at the end: ``P + O - 1``."""
        return self.prompt_tokens + self.output_tokens - 1


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, and what their prompt hashes mean."""

    name: str  # label for tables and captions
    requests: tuple[Request, ...]
    timed: bool = True  # arrival times are meaningful (trace timestamps, Poisson)
    hash_block_size: int | None = None  # tokens each entry of Request.block_hashes covers
    description: str = ""  # one line: where it comes from, what it assumes

    def __post_init__(self) -> None:
        if not self.requests:
            raise KvsimError(f"workload {self.name!r} has no requests")
        last = -math.inf
        for i, r in enumerate(self.requests):
            if r.arrival_s < last:
                raise KvsimError(f"workload {self.name!r}: request {i} arrives before the one above it (times must not decrease)")
            last = r.arrival_s
            if r.prompt_tokens < 1 or r.output_tokens < 1:
                raise KvsimError(f"workload {self.name!r}: request {i} needs at least 1 prompt and 1 output token")
            if r.num_samples < 1 or r.beam_width < 1 or (r.num_samples > 1 and r.beam_width > 1):
                raise KvsimError(f"workload {self.name!r}: request {i} has a bad samples/beam setting")

    def __len__(self) -> int:
        return len(self.requests)

    def limit(self, n: int | None) -> "Workload":
        """The first ``n`` requests (all when ``n`` is None)."""
        if n is None:
            return self
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise KvsimError(f"limit must be a positive integer, got {n!r}")
        return replace(self, requests=self.requests[:n])

    def all_at_once(self) -> "Workload":
        """Every request arriving at time 0 (order kept)."""
        return replace(self, requests=tuple(replace(r, arrival_s=0.0) for r in self.requests))

    def with_poisson_arrivals(self, rate_per_s: float, seed: int = 0) -> "Workload":
        """Arrivals re-drawn as a Poisson process of ``rate_per_s`` (order kept)."""
        times = poisson_arrivals(len(self.requests), rate_per_s, seed)
        return replace(self, timed=True, requests=tuple(replace(r, arrival_s=float(t)) for r, t in zip(self.requests, times)))

    def to_frame(self) -> pd.DataFrame:
        """One row per request: arrival_s, prompt_tokens, output_tokens, num_seqs."""
        return pd.DataFrame({
            "arrival_s": [r.arrival_s for r in self.requests],
            "prompt_tokens": [r.prompt_tokens for r in self.requests],
            "output_tokens": [r.output_tokens for r in self.requests],
            "num_seqs": [r.num_seqs for r in self.requests],
        })

    def stats(self) -> dict:
        """Counts and mean lengths, for captions and the CLI."""
        p = np.array([r.prompt_tokens for r in self.requests])
        o = np.array([r.output_tokens for r in self.requests])
        return {
            "requests": len(self.requests),
            "mean_prompt_tokens": float(p.mean()),
            "mean_output_tokens": float(o.mean()),
            "max_final_len": int((p + o - 1).max()),
            "duration_s": float(self.requests[-1].arrival_s - self.requests[0].arrival_s),
        }


# ----- length distributions -----------------------------------------------------------


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: ``fixed``, ``uniform`` (inclusive) or ``lognormal``.

    ``lognormal`` takes the *mean* in tokens and the sigma of the underlying normal, so
    that presets can be stated in the units papers report.
    """

    kind: str  # "fixed" | "uniform" | "lognormal"
    a: float  # fixed value, uniform low, or lognormal mean
    b: float = 0.0  # uniform high, or lognormal sigma

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise KvsimError(f"unknown length distribution {self.kind!r}; use fixed, uniform or lognormal")
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise KvsimError("length distribution parameters must be finite")
        if self.kind == "fixed" and (self.a < 1 or self.a != int(self.a)):
            raise KvsimError(f"fixed length must be a positive integer, got {self.a:g}")
        if self.kind == "uniform" and not (1 <= self.a <= self.b):
            raise KvsimError(f"uniform lengths need 1 <= low <= high, got {self.a:g}..{self.b:g}")
        if self.kind == "lognormal" and not (self.a >= 1 and self.b >= 0):
            raise KvsimError(f"lognormal lengths need mean >= 1 and sigma >= 0, got {self.a:g}, {self.b:g}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, int(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b) + 1, size=n, dtype=np.int64)
        mu = math.log(self.a) - self.b ** 2 / 2
        return np.maximum(1, np.rint(rng.lognormal(mu, self.b, size=n))).astype(np.int64)

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return float(self.a)


def parse_length_dist(text: str) -> LengthDist:
    """``"512"`` or ``"fixed:512"``, ``"uniform:LOW:HIGH"``, ``"lognormal:MEAN:SIGMA"``."""
    parts = str(text).strip().lower().split(":")
    try:
        if len(parts) == 1:
            return LengthDist("fixed", float(parts[0]))
        if parts[0] == "fixed" and len(parts) == 2:
            return LengthDist("fixed", float(parts[1]))
        if parts[0] in ("uniform", "lognormal") and len(parts) == 3:
            return LengthDist(parts[0], float(parts[1]), float(parts[2]))
    except ValueError:
        pass
    raise KvsimError(f"bad length spec {text!r}; use N, fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA")


def poisson_arrivals(n: int, rate_per_s: float, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process: cumulative exponential gaps of mean 1/rate."""
    if not (isinstance(rate_per_s, (int, float)) and math.isfinite(rate_per_s) and rate_per_s > 0):
        raise KvsimError(f"arrival rate must be a positive number, got {rate_per_s!r}")
    rng = np.random.default_rng(seed + 7919)
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))


def parse_arrivals(text: str) -> tuple[str, float | None]:
    """``trace`` | ``all-at-once`` | ``poisson:RATE`` -> (kind, rate)."""
    t = str(text).strip().lower()
    if t in ("trace", "all-at-once"):
        return t, None
    if t.startswith("poisson:"):
        try:
            rate = float(t.split(":", 1)[1])
        except ValueError:
            rate = float("nan")
        if not (math.isfinite(rate) and rate > 0):
            raise KvsimError(f"bad arrival rate in {text!r}; use poisson:RATE with RATE > 0 requests/s")
        return "poisson", rate
    raise KvsimError(f"bad arrivals {text!r}; use trace, all-at-once or poisson:RATE")


def synthetic_workload(
    num_requests: int,
    prompt: LengthDist | str,
    output: LengthDist | str,
    *,
    arrivals: str = "all-at-once",
    seed: int = 0,
    num_samples: int = 1,
    beam_width: int = 1,
    system_prompt_tokens: int = 0,
    max_len: int | None = None,
    name: str = "synthetic",
) -> Workload:
    """``num_requests`` requests with lengths drawn from ``prompt`` / ``output``.

    ``system_prompt_tokens`` are prepended to every prompt and shared by all requests
    (a prefix cache can hit them). With ``max_len``, pairs whose final length
    ``P + O - 1`` (system prompt included) exceeds it are redrawn.
    """
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests <= 0:
        raise KvsimError(f"number of requests must be a positive integer, got {num_requests!r}")
    for label, v in (("samples", num_samples), ("beam width", beam_width)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KvsimError(f"{label} must be a positive integer, got {v!r}")
    if num_samples > 1 and beam_width > 1:
        raise KvsimError("choose parallel sampling or beam search, not both")
    if isinstance(system_prompt_tokens, bool) or not isinstance(system_prompt_tokens, int) or system_prompt_tokens < 0:
        raise KvsimError(f"system prompt must be a non-negative integer, got {system_prompt_tokens!r}")
    pdist = parse_length_dist(prompt) if isinstance(prompt, str) else prompt
    odist = parse_length_dist(output) if isinstance(output, str) else output
    rng = np.random.default_rng(seed)
    p = pdist.sample(rng, num_requests) + system_prompt_tokens
    o = odist.sample(rng, num_requests)
    if max_len is not None:
        if system_prompt_tokens + 1 > max_len:
            raise KvsimError(f"system prompt of {system_prompt_tokens} tokens leaves no room under max_len {max_len}")
        for _ in range(1000):
            bad = p + o - 1 > max_len
            if not bad.any():
                break
            k = int(bad.sum())
            p[bad] = pdist.sample(rng, k) + system_prompt_tokens
            o[bad] = odist.sample(rng, k)
        else:
            raise KvsimError(f"cannot draw lengths that fit max_len {max_len}; lower the lengths")
    kind, rate = parse_arrivals(arrivals)
    if kind == "trace":
        raise KvsimError("a synthetic workload has no trace times; use all-at-once or poisson:RATE")
    times = np.zeros(num_requests) if kind == "all-at-once" else poisson_arrivals(num_requests, rate, seed)
    reqs = tuple(
        Request(float(t), int(pi), int(oi), num_samples, beam_width,
                shared_prefix_tokens=system_prompt_tokens, prefix_group=0)
        for t, pi, oi in zip(times.tolist(), p.tolist(), o.tolist())
    )
    desc = f"{num_requests} requests, prompt {_dist_text(pdist)}, output {_dist_text(odist)}, arrivals {arrivals}"
    if system_prompt_tokens:
        desc += f", shared system prompt {system_prompt_tokens} tokens"
    if num_samples > 1:
        desc += f", parallel sampling n={num_samples}"
    if beam_width > 1:
        desc += f", beam search k={beam_width}"
    return Workload(name, reqs, timed=kind == "poisson", description=desc)


def _dist_text(d: LengthDist) -> str:
    if d.kind == "fixed":
        return f"{int(d.a)}"
    if d.kind == "uniform":
        return f"uniform {int(d.a)}-{int(d.b)}"
    return f"lognormal mean {d.a:g} sigma {d.b:g}"


@dataclass(frozen=True)
class WorkloadPreset:
    """A named synthetic workload with the paper's mean lengths."""

    name: str
    prompt: LengthDist
    output: LengthDist
    note: str = field(default="")


#: Fitted stand-ins for the datasets the PagedAttention paper replays (means from its Fig. 11).
PRESET_WORKLOADS: dict[str, WorkloadPreset] = {
    "sharegpt-like": WorkloadPreset(
        "ShareGPT-like", LengthDist("lognormal", 161.31, 1.0), LengthDist("lognormal", 337.99, 0.8),
        "fitted stand-in: lognormal lengths with the paper's ShareGPT means (input 161.31, output 337.99)",
    ),
    "alpaca-like": WorkloadPreset(
        "Alpaca-like", LengthDist("lognormal", 19.31, 0.6), LengthDist("lognormal", 58.45, 0.8),
        "fitted stand-in: lognormal lengths with the paper's Alpaca means (input 19.31, output 58.45)",
    ),
}


def preset_workload(
    preset: str,
    num_requests: int,
    *,
    arrivals: str = "all-at-once",
    seed: int = 0,
    max_len: int | None = None,
    num_samples: int = 1,
    beam_width: int = 1,
    system_prompt_tokens: int = 0,
) -> Workload:
    """A :data:`PRESET_WORKLOADS` entry with ``num_requests`` requests."""
    key = str(preset).strip().lower()
    if key not in PRESET_WORKLOADS:
        raise KvsimError(f"unknown workload preset {preset!r}; choose one of {', '.join(PRESET_WORKLOADS)}")
    p = PRESET_WORKLOADS[key]
    w = synthetic_workload(
        num_requests, p.prompt, p.output, arrivals=arrivals, seed=seed, max_len=max_len,
        num_samples=num_samples, beam_width=beam_width, system_prompt_tokens=system_prompt_tokens, name=p.name,
    )
    return replace(w, description=f"{p.note}; {w.description}")


def workload_from_lengths(
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    arrival_s: Sequence[float] | None = None,
    *,
    name: str = "requests",
) -> Workload:
    """A workload from plain lists (tests, small scenarios)."""
    n = len(prompt_tokens)
    if len(output_tokens) != n or (arrival_s is not None and len(arrival_s) != n):
        raise KvsimError("prompt, output and arrival lists must have the same length")
    times = [0.0] * n if arrival_s is None else [float(t) for t in arrival_s]
    reqs = tuple(Request(t, int(p), int(o)) for t, p, o in zip(times, prompt_tokens, output_tokens))
    return Workload(name, reqs, timed=arrival_s is not None)


__all__ = [
    "Request", "Workload", "LengthDist", "parse_length_dist", "parse_arrivals", "poisson_arrivals",
    "synthetic_workload", "preset_workload", "PRESET_WORKLOADS", "WorkloadPreset", "workload_from_lengths",
]
