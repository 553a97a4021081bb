"""The lock files (`make lock`, scripts/lock.sh): every entry pinned with its hashes, nothing declared
left out of them. Read as text: no resolver runs here."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
OURS = {"frontier", "frontier-runtime", "frontier-gateway", "frontier-hostside"}


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    hashes: tuple[str, ...]
    marker: str


def entries(lock: str) -> dict[str, Entry]:
    """A lock file's entries by canonical name (continuation lines joined)."""
    text = (LOCKS / f"{lock}.txt").read_text()
    logical = re.sub(r"\\\n\s*", " ", text)
    found: dict[str, Entry] = {}
    for line in logical.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, rest = line.partition(" --hash")
        requirement = Requirement(spec.strip())
        pins = [s for s in requirement.specifier if s.operator == "=="]
        assert len(pins) == 1, f"{lock}.txt: {spec!r} is not pinned with =="
        found[canonicalize_name(requirement.name)] = Entry(
            name=canonicalize_name(requirement.name),
            version=pins[0].version,
            hashes=tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", line)),
            marker=str(requirement.marker or ""),
        )
    return found


def declared(pyproject: str, *extras: str) -> list[Requirement]:
    data = tomllib.loads((ROOT / pyproject).read_text())["project"]
    found = [Requirement(r) for r in data.get("dependencies", [])]
    for extra in extras:
        found += [Requirement(r) for r in data["optional-dependencies"][extra]]
    return [r for r in found if canonicalize_name(r.name) not in OURS]


ALL_PYPROJECTS = (
    ("pyproject.toml", ("dev",)),
    ("runtime/pyproject.toml", ()),
    ("gateway/pyproject.toml", ()),
    ("hostside/pyproject.toml", ()),
)
WHAT_EACH_LOCK_COVERS = {
    "toolkit": ALL_PYPROJECTS,
    "runtime": (("runtime/pyproject.toml", ()), ("hostside/pyproject.toml", ())),
    "gateway": (("gateway/pyproject.toml", ()), ("hostside/pyproject.toml", ())),
    "image": (("runtime/pyproject.toml", ()), ("hostside/pyproject.toml", ())),
    "image-cpu": (("runtime/pyproject.toml", ()), ("hostside/pyproject.toml", ())),
}


@pytest.mark.parametrize("lock", sorted(p.stem for p in LOCKS.glob("*.txt")))
def test_every_lock_entry_is_pinned_with_a_sha256_hash(lock):
    found = entries(lock)
    assert found, f"{lock}.txt locks nothing"
    assert [e.name for e in found.values() if not e.hashes] == []


@pytest.mark.parametrize("lock", sorted(WHAT_EACH_LOCK_COVERS))
def test_every_declared_dependency_is_in_the_lock_at_a_version_it_allows(lock):
    found = entries(lock)
    missing, outside = [], []
    for pyproject, extras in WHAT_EACH_LOCK_COVERS[lock]:
        for requirement in declared(pyproject, *extras):
            name = canonicalize_name(requirement.name)
            if name not in found:
                missing.append(f"{pyproject}: {requirement}")
                continue
            version = Version(found[name].version)
            if not requirement.specifier.contains(version, prereleases=True):
                outside.append(f"{pyproject}: {requirement} locked at {version}")
    assert missing == [], "declared but not locked (run `make lock`)"
    assert outside == [], "locked outside the declared range (run `make lock`)"


def test_none_of_our_own_distributions_is_locked():
    for lock in WHAT_EACH_LOCK_COVERS:
        assert OURS.isdisjoint(entries(lock)), lock


def test_the_toolkit_runtime_and_cpu_image_locks_take_torchs_cpu_wheel():
    for lock in ("toolkit", "runtime", "image-cpu"):
        assert entries(lock)["torch"].version == "2.13.0+cpu"


def test_the_image_lock_takes_pypis_cuda_torch_with_its_cuda_libraries_pinned():
    found = entries("image")
    assert found["torch"].version == "2.13.0"
    cuda = [name for name in found if name.startswith("nvidia-")]
    assert "nvidia-cuda-runtime" in cuda and "nvidia-nccl-cu13" in cuda and "nvidia-cudnn-cu13" in cuda
    assert all(found[name].hashes for name in cuda)


def test_the_image_locks_hold_the_build_stages_setuptools_and_wheel():
    for lock in ("image", "image-cpu"):
        assert {"setuptools", "wheel"} <= set(entries(lock)), lock
