"""What every task shares: loading the stack and turning Frontier errors into clean exits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit

from frontier.config.schema import Settings
from frontier.errors import FrontierError, StackError
from frontier.targets import load_stack


def settings_for(stack: str | None) -> Settings:
    """Load the stack named by --stack (or $FRONTIER_STACK, else `local`)."""
    return load_stack(stack)


def pool_settings(stack: str | None, model: str | None) -> Settings:
    """The stack, or the view of one of its model pools (``--model``): its hosts, runtime and history.

    A stack that serves several models rolls one pool at a time, so it needs ``--model``.
    """
    settings = load_stack(stack)
    if model is None:
        if len(settings.pools) > 1:
            raise StackError(
                f"stack {settings.stack!r} serves {len(settings.pools)} models ({settings.model_names()}): "
                "name the pool to roll with --model"
            )
        return settings
    try:
        return settings.for_pool(model)
    except KeyError as exc:
        raise StackError(f"--model: {exc.args[0]}") from None


def reports_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print a FrontierError as a message (no traceback) and exit non-zero."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FrontierError as exc:
            raise Exit(f"error: {exc}", code=2) from None

    return wrapper
