"""The Timeline: one row per engine step, the one currency between the simulator, the live
engine, the engine bridge and the figures.

A Timeline is a plain :class:`pandas.DataFrame`. Only ``step`` and ``time_s`` are required;
every other column is optional, but when present it means exactly what
:data:`TIMELINE_COLUMNS` says, so one figure function draws a predicted series and a
measured one side by side. Byte columns are per tensor-parallel rank.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import pandas as pd

from kvsim.errors import KvsimError

#: Column name -> meaning. Producers add the columns they can fill; consumers check.
TIMELINE_COLUMNS: dict[str, str] = {
    "step": "engine step index, 0-based (int)",
    "time_s": "time at the end of the step, seconds: modelled or measured (float; step index when no time model)",
    "running": "sequences in the running batch after the step (int)",
    "waiting": "requests queued, arrived but not admitted (int)",
    "live_bytes": "bytes holding written K/V of tokens (token states)",
    "allocated_bytes": "bytes of the KV memory handed to requests (blocks or reservations)",
    "reserved_bytes": "bytes reserved for tokens a request will still produce",
    "internal_frag_bytes": "bytes reserved that will never hold a token (over-reservation, last-block slack)",
    "external_frag_bytes": "bytes free but unusable (holes too small for any waiting reservation)",
    "free_bytes": "bytes free and usable",
    "capacity_bytes": "total KV memory of the pool",
    "shared_saved_bytes": "bytes that prefix/fork sharing saves versus unshared storage",
    "prefix_hit_blocks": "cumulative prompt blocks served from the prefix cache",
    "prefix_query_blocks": "cumulative prompt blocks looked up in the prefix cache",
    "preemptions": "cumulative preemptions",
    "finished": "cumulative finished requests",
    "dropped": "cumulative requests dropped because they can never fit (longer than max_len or the whole pool)",
    "kv_usage_fraction": "used / total KV blocks as an engine reports it (0-1)",
    "measured_kv_bytes": "KV bytes counted from real storage (live engine) or an engine's metrics",
    "predicted_kv_bytes": "KV bytes the calculator predicts for the same sequence lengths",
    "predicted_live_bytes": "bytes of written K/V the calculator predicts for the same sequence lengths (compare with live_bytes; live engine)",
    "preemptions_per_s": "preemptions per second over the interval ending at this row (rate of a counter; NaN on the first row or after a counter reset)",
    "prefix_hit_rate": "prefix-cache hits / lookups over the interval ending at this row, 0-1 (rates of the engine's counters, or its own hit-rate gauge)",
    "step_time_s": "duration of the step, seconds",
    "source": "label of the series, e.g. 'paged', 'reserve-max', 'measured' (str)",
}

REQUIRED_COLUMNS = ("step", "time_s")


def make_timeline(rows: Iterable[Mapping[str, object]] | pd.DataFrame) -> pd.DataFrame:
    """Build a Timeline from row dicts (or check a DataFrame), rejecting unknown columns."""
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if df.empty and not len(df.columns):
        df = pd.DataFrame({c: pd.Series(dtype="int64" if c == "step" else "float64") for c in REQUIRED_COLUMNS})
    validate_timeline(df)
    return df


def validate_timeline(df: pd.DataFrame) -> None:
    """Raise :class:`KvsimError` if ``df`` is not a Timeline."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise KvsimError(f"timeline lacks column(s) {missing}")
    unknown = [c for c in df.columns if c not in TIMELINE_COLUMNS]
    if unknown:
        raise KvsimError(f"timeline has undocumented column(s) {unknown}; see kvsim.timeline.TIMELINE_COLUMNS")


def concat_timelines(named: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Stack several timelines into one long frame with a ``source`` column (for plotting)."""
    frames = []
    for name, df in named.items():
        validate_timeline(df)
        frames.append(df.assign(source=name))
    return pd.concat(frames, ignore_index=True) if frames else make_timeline([])
