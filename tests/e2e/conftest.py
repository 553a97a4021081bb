"""A private local stack with the runtime deployed on it, shared by the rollout-under-load tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from frontier.config.schema import Settings
from frontier.targets import load_stack
from frontier.targets.local import cluster as local
from tests.e2e.deployed import up_with_first_release
from tests.e2e.stackcopy import write_local_stack


@dataclass
class Cluster:
    settings: Settings
    digest: str
    release_a: str
    deploy_a_s: float


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    """Two host slots on 127.0.2.2-3 over real sshd, HAProxy and moto; release A deployed on both.

    Module-scoped: its stacks folder ($FRONTIER_STACKS_DIR) and processes end with the module, so
    no other test module sees them.
    """
    root = tmp_path_factory.mktemp("cluster")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRONTIER_STACKS_DIR", str(write_local_stack(root, hosts=2)))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        settings = load_stack("local")
        try:
            first = up_with_first_release(settings, root)
            yield Cluster(settings, first.digest, first.result.release, first.result.duration_s)
        finally:
            local.down(settings)


def stack_variant(settings: Settings, name: str, section: str, **values: object) -> Settings:
    """The stack file with ``section``'s values changed, loaded as the same stack by the same loader."""
    import yaml

    document = yaml.safe_load(Path(settings.source).read_text())
    target = document["config"][f"frontier:{section.split('.')[0]}"]
    for part in section.split(".")[1:]:
        target = target[part]
    target.update(values)
    path = Path(settings.source).parent / "variants" / name / Path(settings.source).name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack(settings.stack, path=path)
