"""The runtime wheel is reproducible, and image builds refuse clearly where no engine exists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from frontier.release.artifact import (
    RUNTIME_DIR,
    ArtifactError,
    build_wheel,
    container_engine,
    source_tag,
    store_wheel,
    verify,
)


def test_two_builds_of_the_same_sources_give_the_same_digest(tmp_path: Path):
    sources = tmp_path / "runtime"
    shutil.copytree(RUNTIME_DIR, sources)
    first, path = build_wheel(sources, cache_dir=tmp_path / "one")
    (sources / "frontier_runtime" / "__pycache__").mkdir(exist_ok=True)  # build leftovers do not count
    second, _ = build_wheel(sources, cache_dir=tmp_path / "two")

    assert first.digest == second.digest and first.digest.startswith("sha256:")
    assert path.name.startswith("frontier_runtime-") and path.suffix == ".whl"
    verify(path, first.digest)


def test_a_corrupted_wheel_is_detected(tmp_path: Path):
    wheel = tmp_path / "frontier_runtime-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK original")
    artifact, path = store_wheel(wheel, tmp_path / "cache")
    path.write_bytes(b"PK tampered")
    with pytest.raises(ArtifactError, match="corrupt"):
        verify(path, artifact.digest)


def test_image_builds_refuse_clearly_without_a_container_engine(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ArtifactError, match="no container engine here.*fab release.build"):
        container_engine()


def test_the_default_image_tag_follows_the_runtime_sources(tmp_path):
    sources = tmp_path / "runtime"
    shutil.copytree(RUNTIME_DIR, sources, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    first = source_tag(sources)
    assert first == source_tag(sources) and first.startswith("src-")
    (sources / "pyproject.toml").write_text((sources / "pyproject.toml").read_text() + "\n# changed\n")
    assert source_tag(sources) != first
