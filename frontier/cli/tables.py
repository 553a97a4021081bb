"""Small helpers for the tables tasks print (rich): the console, and :func:`frontier.tables.table`;
figures in them are written by :mod:`frontier.figures`."""

from __future__ import annotations

import sys

from rich.console import Console

from frontier.tables import table as table


def console() -> Console:
    # Messages are never wrapped (they stay greppable); tables get 140 columns when piped.
    return Console(width=None if sys.stdout.isatty() else 140, highlight=False, soft_wrap=True)
