"""Small helpers for the tables tasks print (rich); figures in them are written by
:mod:`frontier.figures`."""

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
