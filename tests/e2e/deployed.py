"""The first release on a test's private local stack: what every e2e test that serves starts from."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from frontier.config.schema import Settings
from frontier.release import weights
from frontier.release.artifact import build_wheel
from frontier.rollout.deploy import deploy
from frontier.rollout.rolling import RolloutResult
from frontier.targets import backend_for
from frontier.targets.local import cluster as local


@dataclass(frozen=True)
class FirstRelease:
    digest: str  # the runtime wheel's artifact digest
    result: RolloutResult


def up_with_first_release(settings: Settings, root: Path) -> FirstRelease:
    """The stack up (``local.up``) serving the tiny model, generated under ``root`` and pushed as the
    stack's weights, with the runtime's wheel built, stored as an artifact and deployed on every
    slot. The caller takes the stack down (``local.down``) however this ends."""
    model_dir = root / "model"
    subprocess.run(
        [sys.executable, "-m", "frontier_runtime.tiny", "--out", str(model_dir)],
        check=True,
        capture_output=True,
    )
    local.up(settings)
    backend = backend_for(settings)
    weights.push(
        backend.aws_client("s3"),
        model_dir,
        settings.model.weights_uri,
        settings.model.name,
        settings.model.version,
    )
    artifact, wheel = build_wheel()
    backend.history_store().put_artifact(artifact, wheel)
    return FirstRelease(artifact.digest, deploy(backend, artifact.digest))
