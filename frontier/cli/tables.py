"""Small helpers for the tables tasks print (rich), so every task formats numbers the same way."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table


def console() -> Console:
    # Messages are never wrapped (they stay greppable); tables get 140 columns when piped.
    return Console(width=None if sys.stdout.isatty() else 140, highlight=False, soft_wrap=True)


def table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], *, numeric: Sequence[int] = ()
) -> Table:
    """A titled table; the columns whose indexes are in ``numeric`` are right-aligned."""
    t = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        t.add_column(name, justify="right" if i in numeric else "left", overflow="fold")
    for row in rows:
        t.add_row(*(str(cell) for cell in row))
    return t


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
