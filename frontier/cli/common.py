"""What every task shares: loading the stack and turning Frontier errors into clean exits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit

from frontier.config.load import load_stack
from frontier.config.schema import Settings
from frontier.errors import FrontierError


def settings_for(stack: str | None) -> Settings:
    """Load the stack named by --stack (or $FRONTIER_STACK, else `local`)."""
    return load_stack(stack)


def reports_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print a FrontierError as a message (no traceback) and exit non-zero."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FrontierError as exc:
            raise Exit(f"error: {exc}", code=2) from None

    return wrapper
