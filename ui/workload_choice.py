"""What the Strategies page replays: a workload choice as a hashable value, and the upload
handling as plain functions of the file's bytes (so tests drive them without a browser).

:class:`WorkloadChoice` holds everything that determines a workload (a preset, a synthetic
generator's settings, or an uploaded trace's name, content hash, column mapping and
limit); it is frozen and hashable, so it keys ``st.cache_data`` and tells the page
whether its inputs changed since the last run. :func:`build_workload` turns it (plus the
upload's bytes) into a :class:`~kvsim.workloads.Workload`; every problem with the input
is a :class:`~kvsim.errors.KvsimError` with one line.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass

from kvsim.errors import KvsimError
from kvsim.traces import ColumnMapping, TraceError, detect_format, read_trace
from kvsim.workloads import Workload, parse_arrivals, preset_workload, synthetic_workload

PRESET, SYNTHETIC, UPLOAD = "preset", "synthetic", "upload"
ARRIVAL_MODES = ("all-at-once", "poisson", "trace")


@dataclass(frozen=True)
class WorkloadChoice:
    """A workload, described by value."""

    source: str  # "preset" | "synthetic" | "upload"
    preset: str = "sharegpt-like"  # PRESET_WORKLOADS key (preset)
    prompt_len: str = "uniform:16:512"  # length spec (synthetic): N, uniform:LO:HI, lognormal:MEAN:SIGMA
    output_len: str = "uniform:16:512"  # length spec (synthetic)
    num_requests: int = 200  # requests drawn (preset, synthetic)
    seed: int = 0  # random seed of lengths and Poisson arrivals
    num_samples: int = 1  # parallel samples per request (preset, synthetic)
    beam_width: int = 1  # beam width (preset, synthetic)
    system_prompt_tokens: int = 0  # tokens of a system prompt every request shares (preset, synthetic)
    arrivals: str = "all-at-once"  # "all-at-once" | "poisson" | "trace" (uploads with timestamps)
    rate_per_s: float = 2.0  # Poisson arrival rate, requests per second
    upload_name: str = ""  # file name (upload)
    upload_sha256: str = ""  # content hash of the upload: the cache key, never the bytes
    mapping: tuple[str, str, str, str] | None = None  # prompt, output, arrival ("" = none), unit (generic CSV)
    limit: int | None = None  # keep the first N requests of a trace

    def describe(self) -> str:
        """One line for captions."""
        if self.source == UPLOAD:
            what = f"uploaded trace {self.upload_name}" + (f" (first {self.limit:,} requests)" if self.limit else "")
        elif self.source == PRESET:
            what = f"{self.preset} preset, {self.num_requests:,} requests, seed {self.seed}"
        else:
            what = f"synthetic: prompt {self.prompt_len}, output {self.output_len}, {self.num_requests:,} requests"
        extras = []
        if self.source != UPLOAD:
            if self.system_prompt_tokens:
                extras.append(f"shared system prompt {self.system_prompt_tokens} tokens")
            if self.num_samples > 1:
                extras.append(f"parallel sampling n={self.num_samples}")
            if self.beam_width > 1:
                extras.append(f"beam width {self.beam_width}")
        arrivals = f"Poisson {self.rate_per_s:g} req/s" if self.arrivals == "poisson" else self.arrivals
        return "; ".join([what] + extras + [f"arrivals {arrivals}"])


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_columns(data: bytes) -> list[str] | None:
    """The header of an uploaded CSV that is not a known trace format (it needs a column
    mapping), else None (a known format, JSON lines, or unreadable: read_trace says why)."""
    try:
        text = data[:65536].decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    if not text.strip() or "\x00" in text or detect_format(text) != "csv":
        return None
    first = text.lstrip().split("\n", 1)[0]
    try:
        header = next(csv.reader(io.StringIO(first)))
    except (csv.Error, StopIteration):
        return None
    cols = [c.strip() for c in header if c.strip()]
    return cols if len(cols) >= 2 else None


def read_upload(data: bytes, name: str, mapping: tuple[str, str, str, str] | None = None,
                limit: int | None = None) -> Workload:
    """An uploaded trace's bytes -> Workload (format detected; a generic CSV needs ``mapping``)."""
    cm = None
    if mapping is not None:
        prompt, output, arrival, unit = mapping
        if not prompt or not output:
            raise TraceError(f"{name}: choose the prompt and output columns")
        if prompt == output:
            raise TraceError(f"{name}: the prompt and output columns must differ")
        cm = ColumnMapping(prompt, output, arrival or None, unit)
    return read_trace(data, name=name, mapping=cm, limit=limit)


def build_workload(choice: WorkloadChoice, data: bytes | None = None, *, max_len: int | None = None) -> Workload:
    """The workload ``choice`` describes (``data``: the upload's bytes)."""
    if choice.arrivals not in ARRIVAL_MODES:
        raise KvsimError(f"arrivals must be one of {', '.join(ARRIVAL_MODES)}, got {choice.arrivals!r}")
    mode = f"poisson:{choice.rate_per_s}" if choice.arrivals == "poisson" else choice.arrivals
    parse_arrivals(mode)  # checks the rate
    if choice.source == UPLOAD:
        if data is None:
            raise KvsimError("upload a trace file first (CSV or JSON lines)")
        if sha256_of(data) != choice.upload_sha256:
            raise KvsimError("the uploaded file changed; run again")
        wl = read_upload(data, choice.upload_name, choice.mapping, choice.limit)
        if choice.arrivals == "trace":
            if not wl.timed:
                raise KvsimError(f"{choice.upload_name} has no timestamps; use all-at-once or Poisson arrivals")
            return wl
        if choice.arrivals == "all-at-once":
            return wl.all_at_once()
        return wl.with_poisson_arrivals(choice.rate_per_s, seed=choice.seed)
    if choice.arrivals == "trace":
        raise KvsimError("a synthetic workload has no trace times; use all-at-once or Poisson arrivals")
    common = dict(arrivals=mode, seed=choice.seed, max_len=max_len, num_samples=choice.num_samples,
                  beam_width=choice.beam_width, system_prompt_tokens=choice.system_prompt_tokens)
    if choice.source == PRESET:
        return preset_workload(choice.preset, choice.num_requests, **common)
    if choice.source == SYNTHETIC:
        return synthetic_workload(choice.num_requests, choice.prompt_len, choice.output_len, **common)
    raise KvsimError(f"unknown workload source {choice.source!r}")


__all__ = ["WorkloadChoice", "build_workload", "read_upload", "upload_columns", "sha256_of",
           "PRESET", "SYNTHETIC", "UPLOAD", "ARRIVAL_MODES"]
