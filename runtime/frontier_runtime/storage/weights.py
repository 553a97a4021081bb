"""Fetch a model's weights from S3 into a local cache, verified against the manifest.

Cache layout for ``s3://bucket/prefix`` at version ``v`` under ``cache_dir``::

    cache_dir/bucket/prefix/v/manifest.json        the manifest the files were verified against
    cache_dir/bucket/prefix/v/.verified.json       size + mtime + sha256 of every verified file
    cache_dir/bucket/prefix/v/<file path>          the files themselves

A restart trusts a file without re-hashing it only while its size and mtime still match what was
recorded when it was verified, so a restart costs one ``stat`` per file instead of reading GBs.
A file that is missing, partial or changed is hashed (and fetched again when the hash is wrong).
Every download lands in a temporary name beside its target and is renamed only once verified,
so a crash never leaves a half-written file under its real name.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier_runtime.storage.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestEntry,
    ManifestError,
    check_relative_path,
    sha256_file,
    split_s3_uri,
    version_prefix,
)

log = logging.getLogger("frontier_runtime.weights")

MARKER_NAME = ".verified.json"
LOCK_NAME = ".lock"
PARTIAL_SUFFIX = ".partial"
DEFAULT_ATTEMPTS = 2


class WeightsError(RuntimeError):
    """The weights cannot be made available; the message says which file and why."""


@dataclass
class FetchReport:
    """What one fetch did: where the model now lies and how much it had to download."""

    model_dir: Path
    files_downloaded: list[str] = field(default_factory=list)
    files_reused: list[str] = field(default_factory=list)
    files_rehashed: list[str] = field(default_factory=list)
    bytes_downloaded: int = 0
    seconds: float = 0.0
    offline: bool = False


def is_s3_uri(source: str) -> bool:
    return source.startswith("s3://")


def cache_dir_for(source: str, version: str, cache_root: Path) -> Path:
    """The local directory that holds one weights version of ``source``."""
    bucket, prefix = split_s3_uri(source)
    parts = [bucket, *(p for p in prefix.split("/") if p), version or "_"]
    for part in parts:
        check_relative_path(part)
    return cache_root.joinpath(*parts)


def fetch_weights(
    source: str,
    version: str,
    cache_root: Path,
    *,
    s3_client: Any | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
) -> FetchReport:
    """Make ``source`` at ``version`` available and verified under ``cache_root``; return the report.

    Raises ``WeightsError`` when a file still fails its checksum after ``attempts`` downloads,
    when the manifest is missing or malformed, or when S3 cannot be reached and no verified copy
    of this version is cached.
    """
    started = time.monotonic()
    target = cache_dir_for(source, version, Path(cache_root))
    target.mkdir(parents=True, exist_ok=True)
    client = s3_client if s3_client is not None else _default_client()
    bucket, key_prefix = version_prefix(source, version)
    with _exclusive(target / LOCK_NAME):
        _remove_partials(target)
        report = FetchReport(model_dir=target)
        manifest = _remote_manifest(client, bucket, key_prefix, target, report)
        marker = _read_marker(target)
        for entry in manifest.files:
            _ensure_file(client, bucket, key_prefix, target, entry, marker, report, attempts)
            _write_marker(target, marker)
        _write_atomically(target / MANIFEST_NAME, manifest.to_json().encode())
    report.seconds = time.monotonic() - started
    log.info(
        "weights ready",
        extra={
            "event": "weights_ready",
            "model_dir": str(target),
            "downloaded": len(report.files_downloaded),
            "reused": len(report.files_reused),
            "bytes_downloaded": report.bytes_downloaded,
            "seconds": round(report.seconds, 3),
        },
    )
    return report


def _default_client() -> Any:
    import boto3  # imported here so a runtime serving a local directory never needs AWS settings

    return boto3.client("s3")


def _remote_manifest(
    client: Any, bucket: str, key_prefix: str, target: Path, report: FetchReport
) -> Manifest:
    key = f"{key_prefix}/{MANIFEST_NAME}"
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as exc:  # botocore raises a zoo of types: not found, denied, unreachable
        cached = _offline_manifest(target)
        if cached is None:
            raise WeightsError(f"cannot read the weights manifest s3://{bucket}/{key}: {exc}") from exc
        log.warning(
            "weights manifest unreachable; using the verified cache",
            extra={"event": "weights_offline", "key": f"s3://{bucket}/{key}", "error": str(exc)},
        )
        report.offline = True
        return cached
    try:
        return Manifest.from_json(body.decode("utf-8", errors="replace"))
    except ManifestError as exc:
        raise WeightsError(f"s3://{bucket}/{key}: {exc}") from exc


def _offline_manifest(target: Path) -> Manifest | None:
    """The cached manifest, only if every file it lists is still exactly as verified."""
    try:
        manifest = Manifest.from_json((target / MANIFEST_NAME).read_text())
    except (OSError, ManifestError):
        return None
    marker = _read_marker(target)
    if all(_trusted(target / e.path, e, marker) for e in manifest.files):
        return manifest
    return None


def _ensure_file(
    client: Any,
    bucket: str,
    key_prefix: str,
    target: Path,
    entry: ManifestEntry,
    marker: dict[str, dict],
    report: FetchReport,
    attempts: int,
) -> None:
    path = target / entry.path
    if _trusted(path, entry, marker):
        report.files_reused.append(entry.path)
        return
    if report.offline:
        raise WeightsError(f"{path}: changed since it was verified and S3 is unreachable")
    if path.is_file() and path.stat().st_size == entry.size:
        report.files_rehashed.append(entry.path)
        if sha256_file(path) == entry.sha256:
            marker[entry.path] = _stamp(path, entry.sha256)
            report.files_reused.append(entry.path)
            return
        log.warning(
            "cached file fails its checksum; fetching it again",
            extra={"event": "weights_corrupt", "file": entry.path},
        )
    marker.pop(entry.path, None)
    key = f"{key_prefix}/{entry.path}"
    last = ""
    for attempt in range(1, attempts + 1):
        partial, size, digest = _download(client, bucket, key, path)
        report.bytes_downloaded += size
        if size == entry.size and digest == entry.sha256:
            os.replace(partial, path)
            marker[entry.path] = _stamp(path, entry.sha256)
            report.files_downloaded.append(entry.path)
            return
        partial.unlink(missing_ok=True)
        last = f"got {size} bytes with sha256 {digest}, manifest says {entry.size} bytes with sha256 {entry.sha256}"
        log.warning(
            "downloaded file fails verification",
            extra={"event": "weights_mismatch", "file": entry.path, "attempt": attempt, "detail": last},
        )
    raise WeightsError(
        f"weights file {entry.path!r} (s3://{bucket}/{key}) failed verification after {attempts} download(s): {last}"
    )


def _download(client: Any, bucket: str, key: str, path: Path) -> tuple[Path, int, str]:
    """Download beside ``path`` under a temporary name; return (temporary path, size, sha256)."""
    from boto3.s3.transfer import TransferConfig

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}{PARTIAL_SUFFIX}-{os.getpid()}")
    config = TransferConfig(multipart_threshold=64 * 1024 * 1024, max_concurrency=8)
    try:
        client.download_file(bucket, key, str(partial), Config=config)
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise WeightsError(f"cannot download s3://{bucket}/{key}: {exc}") from exc
    with partial.open("rb+") as fh:
        os.fsync(fh.fileno())
    size = partial.stat().st_size
    return partial, size, sha256_file(partial)


def _trusted(path: Path, entry: ManifestEntry, marker: dict[str, dict]) -> bool:
    """True when ``path`` is the very file verified earlier against this manifest entry."""
    stamp = marker.get(entry.path)
    if not stamp or stamp.get("sha256") != entry.sha256:
        return False
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_size == entry.size == stamp.get("size") and st.st_mtime_ns == stamp.get("mtime_ns")


def _stamp(path: Path, sha256: str) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}


def _read_marker(target: Path) -> dict[str, dict]:
    try:
        data = json.loads((target / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}


def _write_marker(target: Path, marker: dict[str, dict]) -> None:
    _write_atomically(target / MARKER_NAME, json.dumps({"files": marker}, indent=1, sort_keys=True).encode())


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}{PARTIAL_SUFFIX}-{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _remove_partials(target: Path) -> None:
    """Leftovers of a download that died half-way (we hold the lock, so none is in progress)."""
    for leftover in target.rglob(f"*{PARTIAL_SUFFIX}-*"):
        if leftover.is_file():
            leftover.unlink(missing_ok=True)


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One fetcher per cache directory at a time, across processes on this host."""
    with lock_path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
