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
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.targets.base import Backend

__all__ = ["Backend", "backend_for", "load_stack", "stack_problems"]


def backend_for(settings: Settings) -> Backend:
    """The Backend of the stack's target."""
    # Each return is checked against the Backend protocol by the type checker (`make typecheck`).
    match settings.target:
        case "local":
            from frontier.targets.local.backend import LocalBackend

            return LocalBackend(settings)
        case "ec2":
            from frontier.targets.ec2.backend import Ec2Backend

            return Ec2Backend(settings)
        case "kubernetes":
            from frontier.targets.kubernetes.backend import KubernetesBackend

            return KubernetesBackend(settings)
    raise FrontierError(f"stack {settings.stack!r}: target {settings.target!r} has no backend")


def load_stack(stack: str | None = None, *, path: Path | str | None = None) -> Settings:
    """Read ``stacks/Pulumi.<stack>.yaml`` (or ``path``) into validated settings.

    Raises :class:`frontier.errors.StackError` listing every problem as
    ``file: field = value: what is allowed``: fields out of range, else :func:`stack_problems`.
    """
    return read_stack(stack, path=path, rules=stack_problems)


def stack_problems(settings: Settings) -> Iterator[FieldProblem]:
    """Every rule that spans fields: a section of another target, the target's own, those of all stacks.

    The target's come first: a candidate of ``fab plan --explore`` that breaks several is counted
    under the first (an instance type without the instance store the model cache asks for, say).
    """
    yield from _foreign_sections(settings)
    yield from backend_for(settings).stack_problems()
    yield from cross_check(settings)


def _foreign_sections(settings: Settings) -> Iterator[FieldProblem]:
    """A section that belongs to another target: the stack says one target and configures another."""
    if settings.local is not None and settings.target != "local":
        yield FieldProblem(
            "target", settings.target, "must be 'local' (or absent) in a stack with a 'local:' section"
        )
    if settings.kubernetes is not None and settings.target != "kubernetes":
        yield FieldProblem(
            "target", settings.target, "must be 'kubernetes' in a stack with a 'frontier:kubernetes' section"
        )
