"""How every report lays out a table (rich): the Fabric tasks' and the library's own, such as the
usage table ``fab usage`` and the demo print."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.table import Table


def table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], *, numeric: Iterable[int] = ()
) -> Table:
    """A titled table; the columns whose indexes are in ``numeric`` are right-aligned."""
    right = set(numeric)
    t = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        t.add_column(name, justify="right" if i in right else "left", overflow="fold")
    for row in rows:
        t.add_row(*(str(cell) for cell in row))
    return t
