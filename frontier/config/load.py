"""Read and validate a stack: ``stacks/Pulumi.<stack>.yaml`` into typed settings.

A bad value fails here, at load time, with the file, the field path, the value and the allowed
range; no Pulumi CLI is needed. The rules that span fields come from the caller: every tool loads
a stack through :func:`frontier.targets.load_stack`, which brings those of the stack's target.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml
from frontier_settings import FieldProblem, problems_of
from pydantic import ValidationError

from frontier.config.schema import PROJECT, Settings
from frontier.errors import StackError
from frontier.project import stacks_dir


def stack_path(stack: str) -> Path:
    return stacks_dir() / f"Pulumi.{stack}.yaml"


def available_stacks() -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir().glob("Pulumi.*.yaml"))


def default_stack() -> str:
    return os.environ.get("FRONTIER_STACK") or "local"


def read_stack(
    stack: str | None = None,
    *,
    path: Path | str | None = None,
    rules: Callable[[Settings], Iterable[FieldProblem]],
) -> Settings:
    """Read ``stacks/Pulumi.<stack>.yaml`` (or ``path``) and return settings that pass ``rules``.

    Raises :class:`StackError` listing every problem as ``file: field = value: what is allowed``:
    the fields out of range, else what ``rules`` finds.
    """
    stack = stack or default_stack()
    file = Path(path) if path else stack_path(stack)
    if not file.exists():
        known = ", ".join(available_stacks()) or "none"
        raise StackError(f"{file}: no such stack file (stack {stack!r}; known stacks: {known})")
    try:
        document = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise StackError(f"{file}: not valid YAML: {exc}") from exc
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise StackError(f"{file}: expected a top-level 'config:' mapping")
    raw = _unnamespace(config, file)
    raw.update(stack=stack, source=str(file))
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        problems = list(problems_of(exc))
        if "models" in raw:
            # model and runtime are copies of models[0]'s: name each problem once, where it was written.
            problems = [p for p in problems if not p.path.startswith(("model.", "runtime."))]
        raise StackError(_describe(file, problems)) from None
    problems = list(rules(settings))
    if problems:
        raise StackError(_describe(file, problems))
    return settings


def _unnamespace(config: dict[str, object], file: Path) -> dict[str, object]:
    """``frontier:model`` → ``model``; ``aws:region`` → ``region``; other namespaces are Pulumi's."""
    raw: dict[str, object] = {}
    for key, value in config.items():
        namespace, _, name = str(key).partition(":")
        if namespace == PROJECT and name:
            raw[name] = value
        elif key == "aws:region":
            raw["region"] = value
    if "region" not in raw:
        raise StackError(f"{file}: aws:region: missing (set the AWS region of this stack)")
    return raw


def _describe(file: Path, problems: list[FieldProblem]) -> str:
    lines = [f"{file}: {len(problems)} problem(s)"]
    for p in problems:
        shown = "" if p.value is None else f" = {p.value!r}"
        lines.append(f"  {p.path}{shown}: {p.text}")
    return "\n".join(lines)
