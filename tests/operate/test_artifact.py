"""The runtime wheel is reproducible and carries the names it imports, and image builds refuse
clearly where no engine exists."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import frontier_hostside
import frontier_settings
import pytest

from frontier.release.artifact import (
    HOSTSIDE_DIR,
    IMAGE_LOCK,
    LOCKS_DIR,
    RUNTIME_DIR,
    ArtifactError,
    build_wheel,
    container_engine,
    source_tag,
    store_wheel,
    verify,
)

frontier_settings_init = Path(frontier_settings.__file__)


def test_two_builds_of_the_same_sources_give_the_same_digest(tmp_path: Path):
    sources = tmp_path / "runtime"
    shutil.copytree(RUNTIME_DIR, sources)
    first, path = build_wheel(sources, cache_dir=tmp_path / "one")
    (sources / "frontier_runtime" / "__pycache__").mkdir(exist_ok=True)  # build leftovers do not count
    second, _ = build_wheel(sources, cache_dir=tmp_path / "two")

    assert first.digest == second.digest and first.digest.startswith("sha256:")
    assert path.name.startswith("frontier_runtime-") and path.suffix == ".whl"
    verify(path, first.digest)


def test_the_wheel_carries_the_hostside_names_the_runtime_imports(tmp_path: Path):
    # Hosts install the release's wheel with --no-deps: the names the runtime was built with travel
    # inside it, and a rollback brings the older ones back.
    _, path = build_wheel(RUNTIME_DIR, cache_dir=tmp_path)
    with zipfile.ZipFile(path) as wheel:
        for name, data in frontier_hostside.package_files().items():
            assert wheel.read(name) == data, name


def test_the_wheel_carries_the_settings_reader_its_config_needs(tmp_path: Path):
    # The runtime reads runtime.yaml with frontier_settings; a host has only what the wheel brings.
    _, path = build_wheel(RUNTIME_DIR, cache_dir=tmp_path)
    with zipfile.ZipFile(path) as wheel:
        assert wheel.read("frontier_settings/__init__.py") == frontier_settings_init.read_bytes()


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


def _engine(directory: Path, name: str, answers: bool) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{'echo 4.3.1' if answers else 'echo down >&2; exit 1'}\n")
    path.chmod(0o755)
    return path


def test_image_builds_take_podman_where_docker_is_absent(monkeypatch, tmp_path: Path):
    podman = _engine(tmp_path, "podman", answers=True)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert container_engine() == str(podman)


def test_image_builds_take_podman_where_docker_does_not_answer(monkeypatch, tmp_path: Path):
    _engine(tmp_path, "docker", answers=False)
    podman = _engine(tmp_path, "podman", answers=True)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert container_engine() == str(podman)


def test_an_engine_that_does_not_answer_is_named(monkeypatch, tmp_path: Path):
    _engine(tmp_path, "docker", answers=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ArtifactError, match="docker is installed but does not answer: down"):
        container_engine()


def test_the_default_image_tag_follows_the_runtime_sources(tmp_path):
    sources = tmp_path / "runtime"
    shutil.copytree(RUNTIME_DIR, sources, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    first = source_tag(sources)
    assert first == source_tag(sources) and first.startswith("src-")
    (sources / "pyproject.toml").write_text((sources / "pyproject.toml").read_text() + "\n# changed\n")
    assert source_tag(sources) != first


def test_the_default_image_tag_follows_the_hostside_sources_too(tmp_path):
    # The image installs the hostside wheel beside the runtime's.
    hostside = tmp_path / "hostside"
    shutil.copytree(HOSTSIDE_DIR, hostside, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    first = source_tag(RUNTIME_DIR, hostside)
    names = hostside / "frontier_hostside" / "names.py"
    names.write_text(names.read_text() + "\n# changed\n")
    assert source_tag(RUNTIME_DIR, hostside) != first


def test_the_default_image_tag_follows_the_image_lock_too(tmp_path):
    # Every third-party wheel of the image comes from it: a new lock is a new image.
    lock = tmp_path / "image.txt"
    shutil.copyfile(LOCKS_DIR / IMAGE_LOCK, lock)
    first = source_tag(RUNTIME_DIR, HOSTSIDE_DIR, lock)
    assert first == source_tag()
    lock.write_text(lock.read_text().replace("torch==2.13.0 ", "torch==2.13.1 "))
    assert source_tag(RUNTIME_DIR, HOSTSIDE_DIR, lock) != first
