"""Byte units and formatting shared by the CLI, the figures and the pages."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def fmt_bytes(n: int | float) -> str:
    """Bytes with a binary unit: ``819200 -> '800.0 KiB'``, ``100 -> '100 B'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(value) < 1024 or unit == "EiB":
            return f"{value:,.0f} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
