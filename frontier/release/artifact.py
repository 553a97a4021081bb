"""The runtime artifact: a reproducible wheel (no container engine) or an OCI image (docker or podman, + ECR).

A wheel is built from a clean copy of ``runtime/`` with fixed file times, modes and
``SOURCE_DATE_EPOCH``, so the same sources always give the same bytes and the same digest
(``sha256:<hex>`` of the wheel file). The wheel carries the part of ``frontier_hostside`` the
runtime imports (its names, and ``frontier_settings`` that reads its config), copied beside
``frontier_runtime``: a host installs the wheel with
``--no-deps``, so a release brings the names its runtime was built with, and a rollback brings the
older ones back. Built artifacts are kept in a local cache by digest and
registered in the stack's history bucket (:mod:`frontier.release.history`), from which any operator's
``deploy`` and ``rollback`` fetch them byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import frontier_hostside
from frontier_hostside.names import DIGEST_PATTERN, PLACEHOLDER_DIGEST

from frontier import project
from frontier.errors import FrontierError

RUNTIME_DIR = project.runtime_dir()
HOSTSIDE_DIR = project.hostside_dir()
# The lock files (`make lock`): the image's build context named requirements, whose IMAGE_LOCK
# (runtime/Dockerfile; image.txt by default) both stages install with --require-hashes.
LOCKS_DIR = project.root() / "requirements"
IMAGE_LOCK = "image.txt"
SETTINGS_DIR = HOSTSIDE_DIR / "frontier_settings"
CACHE_DIR = project.state_dir() / "artifacts"
# 1980-01-01, the earliest time a zip entry can carry: a constant, so the digest depends on content only.
SOURCE_DATE_EPOCH = 315532800
_SKIP = {"__pycache__", "build", "dist"}


class ArtifactError(FrontierError):
    """An artifact that cannot be built, found or verified."""


def check_digest(digest: str) -> str:
    """An immutable image/artifact digest, ``sha256:`` + 64 lowercase hex. Tags are refused."""
    if not isinstance(digest, str) or not DIGEST_PATTERN.match(digest):
        raise FrontierError(
            f"digest {digest!r} is not an immutable digest: expected 'sha256:' followed by 64 lowercase "
            "hex characters (mutable tags such as ':latest' are refused)"
        )
    return digest


def is_placeholder(digest: str) -> bool:
    """The all-zero digest ``fab render`` names when no artifact is given: not deployable."""
    return digest == PLACEHOLDER_DIGEST


@dataclass(frozen=True)
class Artifact:
    digest: str
    kind: str  # "wheel" or "image"
    filename: str = ""  # the wheel's file name
    size: int = 0
    image: str = ""  # repository@digest for images
    #: The digest of its CycloneDX SBOM (frontier.release.sbom), "" where none was made; part of
    #: every release's release.json, so under its signature.
    sbom: str = ""

    def to_json(self) -> str:
        data = asdict(self)
        if not self.sbom:
            del data["sbom"]  # an artifact without one reads as it did before SBOMs existed
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Artifact:
        data = json.loads(text)
        return cls(
            **{k: data[k] for k in ("digest", "kind", "filename", "size", "image", "sbom") if k in data}
        )


def sha256_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def build_wheel(source_dir: Path = RUNTIME_DIR, cache_dir: Path = CACHE_DIR) -> tuple[Artifact, Path]:
    """Build the runtime wheel reproducibly; return it and its path in the local cache."""
    source_dir = Path(source_dir)
    if not (source_dir / "pyproject.toml").exists():
        raise ArtifactError(f"{source_dir}: no pyproject.toml; not a Python distribution to build")
    with tempfile.TemporaryDirectory(prefix="frontier-wheel-") as tmp:
        clean = Path(tmp) / "src"
        _clean_copy(source_dir, clean)
        _copy_hostside_names(clean)
        _build_missing_kernels(clean)
        out = Path(tmp) / "out"
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH), PYTHONHASHSEED="0")
        command = [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
            "--disable-pip-version-check", "--quiet", "--wheel-dir", str(out), str(clean),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp)
        if result.returncode != 0:
            raise ArtifactError(f"building the runtime wheel failed:\n{result.stderr.strip()[-3000:]}")
        wheels = sorted(out.glob("*.whl"))
        if len(wheels) != 1:
            raise ArtifactError(f"expected one wheel from {source_dir}, got {[w.name for w in wheels]}")
        return store_wheel(wheels[0], cache_dir)


def store_wheel(wheel: Path, cache_dir: Path = CACHE_DIR) -> tuple[Artifact, Path]:
    """Put a wheel into the local cache under its digest."""
    digest = sha256_digest(wheel)
    artifact = Artifact(digest=digest, kind="wheel", filename=wheel.name, size=wheel.stat().st_size)
    target = cached_path(artifact, cache_dir)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(wheel, tmp)
        tmp.replace(target)
    return artifact, target


def cached_path(artifact: Artifact, cache_dir: Path = CACHE_DIR) -> Path:
    return Path(cache_dir) / artifact.digest.replace(":", "-") / artifact.filename


def verify(path: Path, digest: str) -> None:
    actual = sha256_digest(path)
    if actual != digest:
        raise ArtifactError(f"{path}: sha256 is {actual}, expected {digest}; the file is corrupt or replaced")


def _copy_hostside_names(target: Path) -> None:
    """The package files of ``frontier_hostside`` and ``frontier_settings`` that the runtime imports,
    beside its sources, with fixed times and modes (the runtime's pyproject packages them where it
    finds them)."""
    settings = {f"frontier_settings/{p.name}": p.read_bytes() for p in sorted(SETTINGS_DIR.glob("*.py"))}
    for rel, data in {**frontier_hostside.package_files(), **settings}.items():
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        dest.chmod(0o644)
        os.utime(dest, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def _build_missing_kernels(runtime: Path) -> None:
    """The native CPU kernels the wheel carries as package data, built into the clean copy where the
    sources come without them (``make install`` builds them in a checkout; a fresh one has none).

    The build runs from the copy (its directory first on ``sys.path``), so the libraries are compiled
    from the very source that goes into the wheel, whatever runtime this interpreter has installed."""
    ops = runtime / "frontier_runtime" / "ops"
    if not (ops / "csrc" / "kernels.cpp").is_file() or any((ops / "kernels").glob("*.so")):
        return
    command = [sys.executable, "-m", "frontier_runtime.ops.build_kernels", "--out", str(ops / "kernels")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=runtime)
    if result.returncode != 0:
        raise ArtifactError(
            f"building the native CPU kernels for the wheel failed:\n{result.stderr.strip()[-3000:]}"
        )
    for path in (ops / "kernels").iterdir():  # as _clean_copy leaves every file: fixed mode and time
        path.chmod(0o644)
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def _clean_copy(source: Path, target: Path) -> None:
    """Copy the sources without build leftovers, with fixed times and modes (both end up in the zip)."""
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if any(part in _SKIP or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_symlink() or path.suffix in (".pyc", ".pyo"):
            continue
        dest = target / rel
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        dest.chmod(0o644)
        os.utime(dest, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


# --- container images -----------------------------------------------------------------------------


# The engines image.build and image.push drive, in order of preference. Both take the same
# build/login/push/image-inspect command lines (podman's are docker's), including --build-context;
# podman's build also needs the image format named (PODMAN_BUILD_FORMAT).
CONTAINER_ENGINES = ("docker", "podman")
PODMAN_BUILD_FORMAT = ("--format", "docker")


def container_engine() -> str:
    """The first container engine here that answers (docker with its daemon, or podman), or a clear
    refusal naming what was tried."""
    tried = []
    for name in CONTAINER_ENGINES:
        engine = shutil.which(name)
        if not engine:
            continue
        probe = subprocess.run([engine, "info", "--format", "{{.Version}}"], capture_output=True, text=True)
        if probe.returncode == 0:
            return engine
        tried.append(f"{name} is installed but does not answer: {probe.stderr.strip()[:200]}")
    if tried:
        raise ArtifactError("; ".join(tried))
    raise ArtifactError(
        "no container engine here (neither docker nor podman is installed): on this machine build the "
        "runtime wheel with `fab release.build` and deploy its digest; image.build/image.push need one"
    )


def source_tag(
    source_dir: Path = RUNTIME_DIR, hostside_dir: Path = HOSTSIDE_DIR, lock: Path = LOCKS_DIR / IMAGE_LOCK
) -> str:
    """An image tag derived from the image's sources (the runtime's and the host side's, which the
    image installs beside it, and the lock its other wheels come from): the same sources always get
    the same tag.

    Tags only name a local build; releases still deploy by the digest the registry returns.
    """
    digest = hashlib.sha256()
    for label, base in (("runtime", source_dir), ("hostside", hostside_dir)):
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            rel = path.relative_to(base)
            if any(part == "__pycache__" or part.endswith(".egg-info") for part in rel.parts):
                continue  # install leftovers: not in the image
            digest.update(f"{label}/{rel}".encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(f"requirements/{lock.name}".encode() + b"\0" + lock.read_bytes() + b"\0")
    return f"src-{digest.hexdigest()[:12]}"


def build_image(
    repository: str,
    tag: str,
    context: Path = RUNTIME_DIR,
    hostside_dir: Path = HOSTSIDE_DIR,
    locks_dir: Path = LOCKS_DIR,
) -> str:
    """``docker build`` the runtime image; returns the local image id.

    The host side's distribution is a second build context (``hostside``): the Dockerfile builds
    its wheel beside the runtime's and installs both. The lock files are a third
    (``requirements``): every other wheel comes from its IMAGE_LOCK, each checked by its hash.
    """
    docker = container_engine()
    ref = f"{repository}:{tag}"
    command = [
        docker, "build", "--pull",
        "--build-context", f"hostside={hostside_dir}",
        "--build-context", f"requirements={locks_dir}",
        "-t", ref,
    ]  # fmt: skip
    if Path(docker).name == "podman":
        # podman writes OCI images by default, and the OCI format has no HEALTHCHECK: it would drop
        # the image's liveness probe with a warning. Docker's format keeps it (docker has no flag).
        command += PODMAN_BUILD_FORMAT
        # Every file in the layers and the image's created time at SOURCE_DATE_EPOCH, not the build's
        # clock: two builds of one checkout differ in no timestamp (scripts/reproducible_image.py
        # shows the files themselves are equal). Docker's BuildKit reads the Dockerfile's
        # SOURCE_DATE_EPOCH build argument for the created times only.
        command += ["--timestamp", str(SOURCE_DATE_EPOCH)]
    result = subprocess.run([*command, str(context)], text=True)
    if result.returncode != 0:
        raise ArtifactError(f"{Path(docker).name} build of {ref} failed (exit {result.returncode})")
    image_id = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    return image_id


def push_image(repository: str, tag: str, ecr_client: object) -> Artifact:
    """Log in to ECR, push ``repository:tag`` and return the immutable digest ECR reports."""
    docker = container_engine()
    import base64

    auth = ecr_client.get_authorization_token()["authorizationData"][0]  # type: ignore[attr-defined]
    user, password = base64.b64decode(auth["authorizationToken"]).decode().split(":", 1)
    registry = auth["proxyEndpoint"].removeprefix("https://")
    login = subprocess.run(
        [docker, "login", "--username", user, "--password-stdin", registry], input=password, text=True,
        capture_output=True,
    )  # fmt: skip
    if login.returncode != 0:
        raise ArtifactError(f"{Path(docker).name} login to {registry} failed: {login.stderr.strip()}")
    ref = f"{repository}:{tag}"
    if subprocess.run([docker, "push", ref], text=True).returncode != 0:
        raise ArtifactError(f"{Path(docker).name} push {ref} failed")
    name = repository.split("/", 1)[1] if "/" in repository else repository
    images = ecr_client.describe_images(repositoryName=name, imageIds=[{"imageTag": tag}])  # type: ignore[attr-defined]
    digest = check_digest(images["imageDetails"][0]["imageDigest"])
    return Artifact(digest=digest, kind="image", image=f"{repository}@{digest}")
