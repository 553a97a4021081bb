"""One room per target, and the factory: the one place that looks at a stack's target.

``frontier.targets.local``, ``.ec2`` and ``.kubernetes`` each hold a target's :class:`Backend`,
its fleet or group, its balancer, its discovery and its own stack rules; they never import each
other or this factory. Everything else holds a Backend (:func:`backend_for`) and loads stacks
through :func:`load_stack`, which holds a stack to every rule: those of all stacks and its target's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from frontier_settings import FieldProblem

from frontier.config.checks import cross_check
from frontier.config.load import read_stack
from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.targets.base import Backend

__all__ = ["Backend", "backend_for", "load_stack", "stack_problems"]


def backend_for(settings: Settings, pool: PoolSettings | None = None) -> Backend:
    """The Backend of the stack's target, acting for ``pool``: by default a one-model stack's (or a
    one-pool view's, :meth:`Settings.for_pool`). On a stack of several models with none named, the
    backend answers what concerns the whole stack and refuses what acts for a pool."""
    if pool is None and len(settings.pools) == 1:
        (pool,) = settings.pools
    # Each return is checked against the Backend protocol by the type checker (`make typecheck`).
    match settings.target:
        case "local":
            from frontier.targets.local.backend import LocalBackend

            return LocalBackend(settings, pool)
        case "ec2":
            from frontier.targets.ec2.backend import Ec2Backend

            return Ec2Backend(settings, pool)
        case "kubernetes":
            from frontier.targets.kubernetes.backend import KubernetesBackend

            return KubernetesBackend(settings, pool)
    raise FrontierError(f"stack {settings.stack!r}: target {settings.target!r} has no backend")


def load_stack(stack: str | None = None, *, path: Path | str | None = None) -> Settings:
    """Read ``stacks/Pulumi.<stack>.yaml`` (or ``path``) into validated settings.

    Raises :class:`frontier.errors.StackError` listing every problem as
    ``file: field = value: what is allowed``: fields out of range, else :func:`stack_problems`.
    """
    return read_stack(stack, path=path, rules=stack_problems)


def stack_problems(settings: Settings) -> Iterator[FieldProblem]:
    """Every rule that spans fields: the target's own, those of all stacks (a section of another
    target is refused as the file is read: :class:`Settings` types one section, its target's).

    The target's come first: a candidate of ``fab plan --explore`` that breaks several is counted
    under the first (an instance type without the instance store the model cache asks for, say).
    """
    yield from backend_for(settings).stack_problems()
    yield from cross_check(settings)
