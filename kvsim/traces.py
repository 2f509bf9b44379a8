"""Readers for request traces: Azure LLM inference CSV, Mooncake JSONL, ShareGPT-stats CSV,
and any CSV with a column mapping (user uploads).

Formats (detected from the content, not the file name):

- ``azure``: ``TIMESTAMP,ContextTokens,GeneratedTokens``; wall-clock timestamps with 7
  fractional digits (``2023-11-16 18:15:46.6805900``); arrivals are seconds after the
  first row.
- ``mooncake``: JSON lines ``{"timestamp": ms, "input_length", "output_length",
  "hash_ids": [...]}``; ``hash_ids`` are chained hashes of 512-token prompt blocks
  (``len == ceil(input_length / 512)``), kept on each request for prefix caching.
- ``sharegpt-stats``: ``num_prefill_tokens,num_decode_tokens,...`` without timestamps
  (the workload is untimed: replay it all at once or with Poisson arrivals).
- ``csv``: any CSV, given a :class:`ColumnMapping` naming the prompt, output and
  (optionally) arrival columns.

Every problem with a file (empty, not a trace, missing columns, negative, fractional or
missing lengths, timestamps that go backwards) raises :class:`TraceError` with one line
that names the file, and the row where it applies.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.errors import KvsimError
from kvsim.workloads import Request, Workload

MOONCAKE_HASH_BLOCK = 512  # tokens per Mooncake hash id
FORMATS = ("azure", "mooncake", "sharegpt-stats", "csv")
_MAX_BYTES = 512 * 1024 * 1024


class TraceError(KvsimError):
    """A trace file that cannot be read as requests."""


@dataclass(frozen=True)
class ColumnMapping:
    """Which CSV columns hold what, for a generic trace."""

    prompt: str  # column with prompt (input) token counts
    output: str  # column with output (generated) token counts
    arrival: str | None = None  # column with arrival times (optional)
    arrival_unit: str = "s"  # "s", "ms", or "datetime" (parsed timestamps)


def _read_bytes(source: str | Path | bytes, name: str | None) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), name or "upload"
    path = Path(source)
    label = name or path.name
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise TraceError(f"{label}: file larger than {_MAX_BYTES >> 20} MiB")
        return path.read_bytes(), label
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {source}") from None
    except IsADirectoryError:
        raise TraceError(f"{source} is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"cannot read {source}: {exc.strerror or exc}") from None


def _decode(data: bytes, label: str) -> str:
    if not data.strip():
        raise TraceError(f"{label} is empty")
    if b"\x00" in data[:4096]:
        raise TraceError(f"{label} is not a trace (binary data); expected CSV or JSON lines")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceError(f"{label} is not a trace (not UTF-8 text); expected CSV or JSON lines") from None


def detect_format(text: str) -> str:
    """``azure`` | ``mooncake`` | ``sharegpt-stats`` | ``csv`` from the first line."""
    first = text.lstrip().split("\n", 1)[0].strip()
    if first.startswith("{"):
        return "mooncake"
    cols = {c.strip().strip('"') for c in first.split(",")}
    # two of a format's three (or one of two) columns is enough to name it, so a file with
    # a column missing gets "missing column X" rather than "unknown format"
    if len({"TIMESTAMP", "ContextTokens", "GeneratedTokens"} & cols) >= 2:
        return "azure"
    if {"num_prefill_tokens", "num_decode_tokens"} & cols:
        return "sharegpt-stats"
    return "csv"


def default_traces_dir() -> Path:
    """Where this repository's tests and benchmarks look for the public traces:
    ``$KVSIM_TRACES_DIR``, else ``shared/traces`` beside the repository's root."""
    env = os.environ.get("KVSIM_TRACES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def read_trace(
    source: str | Path | bytes,
    *,
    name: str | None = None,
    format: str | None = None,
    mapping: ColumnMapping | None = None,
    limit: int | None = None,
) -> Workload:
    """Read a trace file (path or uploaded bytes) into a :class:`Workload`.

    ``format`` is detected when not given; a generic CSV needs ``mapping``. ``limit``
    keeps the first N requests.
    """
    data, label = _read_bytes(source, name)
    text = _decode(data, label)
    fmt = format or detect_format(text)
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise KvsimError(f"limit must be a positive integer, got {limit!r}")
    if fmt == "mooncake":
        return _read_mooncake(text, label, limit)
    df = _read_csv(text, label, limit)
    if fmt == "azure":
        return _from_columns(df, label, "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime", "azure")
    if fmt == "sharegpt-stats":
        return _from_columns(df, label, None, "num_prefill_tokens", "num_decode_tokens", "s", "sharegpt-stats")
    if mapping is None:
        cols = ", ".join(map(str, df.columns[:8]))
        raise TraceError(
            f"{label}: not a known trace format (columns: {cols}); map its prompt/output/arrival columns"
        )
    if mapping.arrival_unit not in ("s", "ms", "datetime"):
        raise TraceError(f"arrival unit must be s, ms or datetime, got {mapping.arrival_unit!r}")
    return _from_columns(df, label, mapping.arrival, mapping.prompt, mapping.output, mapping.arrival_unit, "csv")


def _read_csv(text: str, label: str, limit: int | None) -> pd.DataFrame:
    try:
        df = pd.read_csv(io.StringIO(text), nrows=limit, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(f"{label} is not a readable CSV trace ({msg})") from None
    if df.empty:
        raise TraceError(f"{label} has a header but no requests")
    df.columns = [str(c).strip() for c in df.columns]
    return df


def _show(value: object) -> str:
    """A cell's value as a user typed it: ``'abc'``, ``1.5``, or ``empty`` for NaN/None."""
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA or value is pd.NaT:
        return "empty"
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, float) and value != value:
            return "empty"
    return repr(value)


def _lengths(col: pd.Series, label: str, what: str, rows_offset: int = 2) -> np.ndarray:
    values = pd.to_numeric(col, errors="coerce")
    bad = values.isna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise TraceError(f"{label}: row {i + rows_offset}: {what} is missing or not a number ({_show(col.iloc[i])})")
    arr = values.to_numpy(dtype=float)
    if not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise TraceError(f"{label}: row {i + rows_offset}: {what} is not finite ({_show(arr[i])})")
    if (arr != np.floor(arr)).any():
        i = int(np.flatnonzero(arr != np.floor(arr))[0])
        raise TraceError(f"{label}: row {i + rows_offset}: {what} must be a whole number, got {_show(arr[i])}")
    if (arr < 1).any():
        i = int(np.flatnonzero(arr < 1)[0])
        raise TraceError(f"{label}: row {i + rows_offset}: {what} must be at least 1, got {int(arr[i])}")
    return arr.astype(np.int64)


def _arrivals(col: pd.Series, label: str, unit: str) -> np.ndarray:
    if unit == "datetime":
        ts = pd.to_datetime(col, errors="coerce", format="ISO8601")
        if ts.isna().any():
            i = int(np.flatnonzero(ts.isna().to_numpy())[0])
            raise TraceError(f"{label}: row {i + 2}: timestamp {_show(col.iloc[i])} is not a date-time")
        secs = (ts - ts.iloc[0]).dt.total_seconds().to_numpy()
    else:
        raw = pd.to_numeric(col, errors="coerce")
        if raw.isna().any() or not np.isfinite(raw.to_numpy(dtype=float)).all():
            i = int(np.flatnonzero((raw.isna() | ~np.isfinite(raw.fillna(0).to_numpy(dtype=float))).to_numpy())[0])
            raise TraceError(f"{label}: row {i + 2}: arrival time {_show(col.iloc[i])} is not a number")
        secs = raw.to_numpy(dtype=float) / (1000.0 if unit == "ms" else 1.0)
        secs = secs - secs[0]
    back = np.flatnonzero(np.diff(secs) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise TraceError(f"{label}: row {i + 2}: timestamps are not sorted (this request arrives before the one above it)")
    return secs


def _from_columns(df, label, arrival, prompt, output, unit, kind) -> Workload:
    need = [c for c in (arrival, prompt, output) if c is not None]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise TraceError(f"{label}: missing column(s) {', '.join(missing)} (found: {', '.join(map(str, df.columns[:8]))})")
    p = _lengths(df[prompt], label, "prompt tokens")
    o = _lengths(df[output], label, "output tokens")
    t = _arrivals(df[arrival], label, unit) if arrival is not None else np.zeros(len(df))
    reqs = tuple(Request(a, b, c) for a, b, c in zip(t.tolist(), p.tolist(), o.tolist()))
    timed = arrival is not None
    desc = f"{label} ({kind} trace, {len(reqs):,} requests{'' if timed else ', no timestamps'})"
    return Workload(label, reqs, timed=timed, description=desc)


def _read_mooncake(text: str, label: str, limit: int | None) -> Workload:
    reqs: list[Request] = []
    last = -math.inf
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if limit is not None and len(reqs) >= limit:
            break
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise TraceError(f"{label}: line {lineno} is not JSON; expected Mooncake JSON lines") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{label}: line {lineno} is not a JSON object")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in rec]
        if missing:
            raise TraceError(f"{label}: line {lineno}: missing field(s) {', '.join(missing)}")
        ts, p, o = rec["timestamp"], rec["input_length"], rec["output_length"]
        for what, v in (("timestamp", ts), ("input_length", p), ("output_length", o)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TraceError(f"{label}: line {lineno}: {what} must be a number, got {v!r}")
        for what, v in (("input_length", p), ("output_length", o)):
            if v < 1 or v != int(v):
                raise TraceError(f"{label}: line {lineno}: {what} must be a whole number >= 1, got {v!r}")
        if ts < last:
            raise TraceError(f"{label}: line {lineno}: timestamps are not sorted (this request arrives before the one above it)")
        last = ts
        hashes = rec.get("hash_ids")
        if hashes is not None:
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
                raise TraceError(f"{label}: line {lineno}: hash_ids must be a list of integers")
            if len(hashes) != -(-int(p) // MOONCAKE_HASH_BLOCK):
                raise TraceError(
                    f"{label}: line {lineno}: {len(hashes)} hash_ids for {int(p)} tokens "
                    f"(expected ceil({int(p)}/{MOONCAKE_HASH_BLOCK}))"
                )
            hashes = tuple(hashes)
        reqs.append(Request(float(ts) / 1000.0, int(p), int(o), block_hashes=hashes))
    if not reqs:
        raise TraceError(f"{label} has no requests")
    t0 = reqs[0].arrival_s
    if t0:
        reqs = [Request(r.arrival_s - t0, r.prompt_tokens, r.output_tokens, block_hashes=r.block_hashes) for r in reqs]
    desc = f"{label} (Mooncake trace, {len(reqs):,} requests, {MOONCAKE_HASH_BLOCK}-token prompt block hashes)"
    return Workload(label, tuple(reqs), timed=True, hash_block_size=MOONCAKE_HASH_BLOCK, description=desc)


__all__ = ["read_trace", "detect_format", "ColumnMapping", "TraceError", "FORMATS", "MOONCAKE_HASH_BLOCK"]
