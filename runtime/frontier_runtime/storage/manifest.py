"""The weights manifest: the contract between ``fab weights.push`` and the runtime's fetcher.

Layout in the bucket, for ``weights_uri = s3://bucket/prefix`` and a version ``v``::

    s3://bucket/prefix/v/manifest.json
    s3://bucket/prefix/v/<file path>        (one object per file listed in the manifest)

The manifest lists every file with its size and sha256; a weights version is immutable once its
manifest exists (the manifest is written last, so a partial push is never visible).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

FORMAT = "frontier-weights/1"
MANIFEST_NAME = "manifest.json"
CHUNK = 8 * 1024 * 1024


class ManifestError(ValueError):
    """A manifest that is malformed or does not match the files it describes."""


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    model: str
    version: str
    files: tuple[ManifestEntry, ...]
    created_at: str = ""
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(f"manifest format must be {FORMAT!r}, got {data.get('format')!r}")
        try:
            files = tuple(
                ManifestEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in data["files"]
            )
            manifest = cls(
                model=str(data["model"]),
                version=str(data["version"]),
                files=files,
                created_at=str(data.get("created_at", "")),
                extra=dict(data.get("extra", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"manifest is missing or mistypes a field: {exc}") from exc
        for entry in manifest.files:
            check_relative_path(entry.path)
            if len(entry.sha256) != 64 or any(c not in "0123456789abcdef" for c in entry.sha256):
                raise ManifestError(f"manifest entry {entry.path!r}: sha256 must be 64 lowercase hex digits")
            if entry.size < 0:
                raise ManifestError(f"manifest entry {entry.path!r}: size must be >= 0, got {entry.size}")
        return manifest


def check_relative_path(path: str) -> None:
    """Refuse paths that would escape the model directory (absolute, '..', backslashes)."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or "\\" in path:
        raise ManifestError(f"manifest path {path!r} must be relative and stay inside the model directory")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(model_dir: Path, model: str, version: str, created_at: str = "") -> Manifest:
    """Describe every regular file under ``model_dir`` (sorted, so the same files → the same manifest)."""
    entries = []
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = file.relative_to(model_dir).as_posix()
        if rel == MANIFEST_NAME:
            continue
        entries.append(ManifestEntry(rel, file.stat().st_size, sha256_file(file)))
    if not entries:
        raise ManifestError(f"{model_dir}: no files to describe")
    return Manifest(model=model, version=version, files=tuple(entries), created_at=created_at)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → ``("bucket", "a/b")``."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI has no bucket: {uri!r}")
    return bucket, key.strip("/")


def version_prefix(weights_uri: str, version: str) -> tuple[str, str]:
    """Bucket and key prefix (no trailing slash) of one weights version."""
    bucket, prefix = split_s3_uri(weights_uri)
    return bucket, f"{prefix}/{version}" if prefix else version
