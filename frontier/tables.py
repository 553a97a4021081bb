"""Small helpers for the tables tasks print (rich), so every task formats numbers the same way."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table

GB = 10**9


def console() -> Console:
    # Wide enough for the plan's notes when output is piped (CI logs, tests), no colour codes then.
    return Console(width=140, highlight=False, soft_wrap=False)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False)
    for i, name in enumerate(columns):
        t.add_column(name, justify="right" if i == 1 and len(columns) > 2 else "left", overflow="fold")
    for row in rows:
        t.add_row(*(str(cell) for cell in row))
    return t


def gb(value: float) -> str:
    """Bytes as decimal gigabytes, the unit GPU memory is sold in."""
    return f"{value / GB:,.2f} GB"


def count(value: float) -> str:
    return f"{value:,.0f}"


def money(value: float) -> str:
    return f"${value:,.2f}"
