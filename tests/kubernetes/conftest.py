"""Fixtures for the Kubernetes target: a copy of the EKS stack file to change one value in."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kube_stack_edit import set_field

from frontier import project
from frontier.config.schema import Settings
from frontier.targets import load_stack

K8S_STACK = "eks-prod"
GATEWAY_STACK = "eks-gateway"


@pytest.fixture
def k8s_stack(tmp_path: Path) -> Callable[[dict[str, object]], Path]:
    """``k8s_stack({"kubernetes.namespace": "Bad_Name"})`` → path of a changed copy of eks-prod."""

    return _editor(tmp_path, K8S_STACK)


@pytest.fixture
def gateway_stack(tmp_path: Path) -> Callable[[dict[str, object]], Path]:
    """``gateway_stack({"gateway.port": 0})`` → path of a changed copy of eks-gateway."""
    return _editor(tmp_path, GATEWAY_STACK)


def _editor(tmp_path: Path, stack: str) -> Callable[[dict[str, object]], Path]:
    def make(changes: dict[str, object]) -> Path:
        path = tmp_path / f"Pulumi.{stack}.yaml"
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


@pytest.fixture(scope="session")
def eks_gateway() -> Settings:
    return load_stack(GATEWAY_STACK)


MULTINODE_STACK = "eks-multinode"


@pytest.fixture
def multinode_stack(tmp_path: Path) -> Callable[[dict[str, object]], Path]:
    """``multinode_stack({"kubernetes.autoscaling.max_replicas": 5})`` → path of a changed copy of eks-multinode."""
    return _editor(tmp_path, MULTINODE_STACK)
