"""How every report writes a figure (bytes, large counts, dollars), so the planner's tables and the
tasks' own read the same way."""

from __future__ import annotations


def size(value: float) -> str:
    """Bytes in decimal units (GPU memory is sold in GB): GB from one gigabyte up, else MB or kB."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6)):
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value / 10**3:,.2f} kB"


def count(value: float) -> str:
    """Large counts the way people say them: 70.6B, 5.2M, 12.0k."""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if abs(value) >= scale:
            return f"{value / scale:,.1f}{unit}"
    return f"{value:,.0f}"


def money(value: float) -> str:
    return f"${value:,.2f}"
