"""Fixtures for unit tests: editable copies of the real stack files."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from frontier import project

_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _steps(field: str) -> list[str | int]:
    """``runtime.batch.max_batch_size`` / ``node_groups[0].name`` → keys and list indexes."""
    return [name if name else int(index) for name, index in _STEP.findall(field)]


def _config_key(first: str) -> str:
    return "aws:region" if first == "region" else f"frontier:{first}"


def edit_stack_file(path: Path, changes: dict[str, object], delete: tuple[str, ...] = ()) -> Path:
    """Set fields (and remove those in ``delete``) of a stack file, named by their settings path."""
    document = yaml.safe_load(path.read_text())
    config = document["config"]
    for field, value in [*changes.items(), *((f, _DELETE) for f in delete)]:
        first, *rest = _steps(field)
        parent, last = (
            (config, _config_key(str(first))) if not rest else (config[_config_key(str(first))], rest[-1])
        )
        for step in rest[:-1]:
            parent = parent[step]
        if value is _DELETE:
            del parent[last]
        else:
            parent[last] = value
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


_DELETE = object()


@pytest.fixture
def stacks_copy(tmp_path: Path) -> Path:
    """A copy of stacks/ (stack files and any baselines) to change freely."""
    target = tmp_path / "stacks"
    shutil.copytree((project.root() / "stacks"), target, ignore=shutil.ignore_patterns("baselines"))
    return target


@pytest.fixture
def changed_stack(stacks_copy: Path) -> Callable[..., Path]:
    """``changed_stack("prod", {"runtime.port": 80})`` → path of a copy of prod with that change."""

    def make(stack: str, changes: dict[str, object], delete: tuple[str, ...] = ()) -> Path:
        return edit_stack_file(stacks_copy / f"Pulumi.{stack}.yaml", changes, delete)

    return make
