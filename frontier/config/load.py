"""Read and validate a stack: ``stacks/Pulumi.<stack>.yaml`` into typed settings.

A bad value fails here, at load time, with the file, the field path, the value and the allowed
range; no Pulumi CLI is needed. The rules that span fields come from the caller: every tool loads
a stack through :func:`frontier.targets.load_stack`, which brings those of the stack's target.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml
from frontier_settings import FieldProblem, problems_of
from pydantic import ValidationError

from frontier.config.schema import PROJECT, PoolSettings, Settings
from frontier.errors import StackError
from frontier.project import stacks_dir


def stack_path(stack: str) -> Path:
    return stacks_dir() / f"Pulumi.{stack}.yaml"


def available_stacks() -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir().glob("Pulumi.*.yaml"))


def default_stack() -> str:
    return os.environ.get("FRONTIER_STACK") or "local"


def chosen_pool(settings: Settings, model: str | None = None) -> PoolSettings:
    """The pool an entry point (a task, the demo) acts for, chosen once as the stack is loaded: the
    one serving ``model`` (an operator's ``--model``), or, with none named, a one-model stack's only
    pool. A stack of several models refuses naming them rather than answering with its first; what
    the entry calls is handed the pool it chose."""
    if model is not None:
        try:
            return settings.pool(model)
        except KeyError as exc:
            raise StackError(f"--model: {exc.args[0]}") from None
    return settings.only_pool


def acting_pool(settings: Settings, pool: PoolSettings | None) -> PoolSettings:
    """The pool a backend was built for; refused, naming the models, where it was built for a whole
    stack of several (what acts for a pool needs ``--model``)."""
    if pool is None:
        raise settings.several_models("name the pool to act for (--model)")
    return pool


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
    listed = _lists_models(raw, file)
    raw = _with_pools(raw, listed)
    raw.update(stack=stack, source=str(file))
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        # A pool's group and hosts are copies of node_groups and inventory.hosts entries: each
        # problem of theirs is named once, where it was written.
        problems = [p for p in problems_of(exc) if not _COPIED.match(p.path)]
        raise StackError(_describe(file, problems, listed)) from None
    problems = list(rules(settings))
    if problems:
        raise StackError(_describe(file, problems, listed))
    return settings


# The two shapes of a stack file's pools: one model (``frontier:model`` + ``frontier:runtime``) or
# a list (``frontier:models``, each entry a model, a runtime, its node group, replicas and hosts).
_ONE_POOL = ("model", "runtime", "disaggregation")
_COPIED = re.compile(r"^pools\[\d+\]\.(group|hosts\[\d+\])\.")
_POOL_PATH = re.compile(r"\bpools\[(\d+)\](\.?)")
# A target's section is typed as ``platform`` under its tag; the file writes it under its own key.
_SECTION_PATH = re.compile(r"\bplatform\.(local|kubernetes)\b")


def _lists_models(raw: dict[str, object], file: Path) -> bool:
    """Whether the file lists its models; a file that also writes a top-level one is refused."""
    if "models" not in raw:
        return False
    mixed = [f"{PROJECT}:{key}" for key in _ONE_POOL if key in raw]
    if mixed:
        raise StackError(
            f"{file}: {PROJECT}:models and {' and '.join(mixed)}: a stack lists its models under "
            f"{PROJECT}:models, or writes its one model as {PROJECT}:model and {PROJECT}:runtime, not both"
        )
    return True


def _with_pools(raw: dict[str, object], listed: bool) -> dict[str, object]:
    """The file's models as ``pools``, the one shape :class:`Settings` has."""
    if listed:
        pools = raw.pop("models")
    else:
        pools = [{key: raw.pop(key) for key in _ONE_POOL if key in raw}]
    return {**raw, "pools": pools, "listed_models": listed}


def _as_written(text: str, listed: bool) -> str:
    """A problem's field paths as the file writes them: ``pools[1].runtime`` is ``models[1].runtime``
    in a file that lists its models, ``pools[0].runtime`` is ``runtime`` in a one-model file, and
    ``platform.kubernetes.namespace`` is ``kubernetes.namespace``."""

    def written(match: re.Match[str]) -> str:
        if listed:
            return f"models[{match.group(1)}]{match.group(2)}"
        return "" if match.group(2) else "model"

    return _POOL_PATH.sub(written, _SECTION_PATH.sub(r"\1", text))


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


def _describe(file: Path, problems: list[FieldProblem], listed: bool) -> str:
    lines = [f"{file}: {len(problems)} problem(s)"]
    for p in problems:
        shown = "" if p.value is None else f" = {p.value!r}"
        lines.append(_as_written(f"  {p.path}{shown}: {p.text}", listed))
    return "\n".join(lines)
