"""Fixtures for the Kubernetes target: a copy of the EKS stack file to change one value in."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from frontier import project
from frontier.config.load import load_stack
from frontier.config.schema import Settings

K8S_STACK = "eks-prod"


def set_field(config: dict, field: str, value: object) -> None:
    """``kubernetes.node_pools[0].name`` → set that value under ``frontier:kubernetes``."""
    steps: list[str | int] = []
    for part in field.split("."):
        name, _, rest = part.partition("[")
        steps.append(name)
        if rest:
            steps.append(int(rest.rstrip("]")))
    first, *rest_steps = steps
    key = "aws:region" if first == "region" else f"frontier:{first}"
    if not rest_steps:
        config[key] = value
        return
    parent = config[key]
    for step in rest_steps[:-1]:
        parent = parent[step]
    parent[rest_steps[-1]] = value


@pytest.fixture
def k8s_stack(tmp_path: Path) -> Callable[[dict[str, object]], Path]:
    """``k8s_stack({"kubernetes.namespace": "Bad_Name"})`` → path of a changed copy of eks-prod."""

    def make(changes: dict[str, object]) -> Path:
        path = tmp_path / f"Pulumi.{K8S_STACK}.yaml"
        shutil.copy(project.stacks_dir() / path.name, path)
        document = yaml.safe_load(path.read_text())
        for field, value in changes.items():
            set_field(document["config"], field, value)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    return make


@pytest.fixture(scope="session")
def eks_prod() -> Settings:
    return load_stack(K8S_STACK)
