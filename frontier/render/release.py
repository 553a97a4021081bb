"""A release built for a stack: this stack's files rendered for one runtime artifact.

Rendering sits above :mod:`frontier.release`: a release holds rendered files and never renders
them, so history and hosts can handle stored releases without the templates.
"""

from __future__ import annotations

from frontier.config.schema import PoolSettings, Settings
from frontier.release.artifact import Artifact, check_digest
from frontier.release.release import Release
from frontier.render.host import render_release_files


def build_release(settings: Settings, pool: PoolSettings, artifact: Artifact) -> Release:
    """Render ``pool``'s files of this stack for the artifact (the digest was checked: tags never
    get here)."""
    check_digest(artifact.digest)
    return Release(
        artifact=artifact, files=dict(sorted(render_release_files(settings, pool, artifact.digest).items()))
    )
