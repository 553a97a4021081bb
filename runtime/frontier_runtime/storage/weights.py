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

How a cold start fetches (the default, ``concurrency > 1``): every file is cut into parts and all
parts of all files go to one bounded pool of ranged GETs (a file of one part is one whole-object
GET). Parts are only as small as it takes to keep every connection busy (the bytes to fetch over
the concurrency, within ``MIN_PART_SIZE``..``MAX_PART_SIZE``), so a model of many shards is
fetched shard by shard and one huge file range by range. Each chunk is written at its offset as
it streams in and fed to its file's SHA-256 in order, by whichever worker holds the next bytes in
sequence, so hashing runs while the other parts are still on the wire and the last byte is
verified moments after it arrives: there is no second pass over the file. A file is written to
disk as soon as its last part is in, by the worker that landed it, so the disk's work overlaps
the rest of the download instead of following it. ``concurrency=1`` keeps
the older path (one file after another, a whole download, then a hash over the file), which the
cold-start bench (bench/cold_start.py) measures as its "before".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier_runtime.config import WEIGHTS_FETCH_CONCURRENCY, WEIGHTS_FETCH_MAX_CONCURRENCY
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
DEFAULT_CONCURRENCY = WEIGHTS_FETCH_CONCURRENCY
MAX_CONCURRENCY = WEIGHTS_FETCH_MAX_CONCURRENCY
MIN_PART_SIZE = 8 * 1024 * 1024
#: A part that lands ahead of its file's hash waits in memory, so the largest part bounds that.
MAX_PART_SIZE = 64 * 1024 * 1024
#: Bytes read from a GET's body at a time: written and hashed as they come.
STREAM_CHUNK = 8 * 1024 * 1024


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
    #: GETs in flight at most (1: the serial path, file after file, hashed after each download).
    concurrency: int = 1
    #: Wall time spent getting bytes (and, in parallel, hashing them as they land).
    fetch_seconds: float = 0.0
    #: Time spent hashing: overlapped with the fetch in parallel, after each download when serial,
    #: plus any re-hash of cached files that lost their stamp.
    verify_seconds: float = 0.0


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
    concurrency: int = DEFAULT_CONCURRENCY,
    part_size: int | None = None,
) -> FetchReport:
    """Make ``source`` at ``version`` available and verified under ``cache_root``; return the report.

    Raises ``WeightsError`` when a file still fails its checksum after ``attempts`` downloads,
    when the manifest is missing or malformed, or when S3 cannot be reached and no verified copy
    of this version is cached. ``concurrency`` is the number of GETs in flight (1: serial);
    ``part_size`` the bytes of one ranged GET (default: sized to keep every connection busy).
    """
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise WeightsError(f"weights fetch concurrency = {concurrency}: must be 1..{MAX_CONCURRENCY}")
    if part_size is not None and part_size < 1024 * 1024:
        raise WeightsError(f"weights fetch part_size = {part_size}: must be at least 1 MiB (1048576)")
    started = time.monotonic()
    target = cache_dir_for(source, version, Path(cache_root))
    target.mkdir(parents=True, exist_ok=True)
    client = s3_client if s3_client is not None else default_client(concurrency)
    bucket, key_prefix = version_prefix(source, version)
    with _exclusive(target / LOCK_NAME):
        _remove_partials(target)
        report = FetchReport(model_dir=target, concurrency=concurrency)
        manifest = _remote_manifest(client, bucket, key_prefix, target, report)
        marker = _read_marker(target)
        if concurrency == 1:
            for entry in manifest.files:
                _ensure_file(client, bucket, key_prefix, target, entry, marker, report, attempts)
                _write_marker(target, marker)
        else:
            missing = [e for e in manifest.files if not _reusable(target, e, marker, report)]
            _write_marker(target, marker)
            source_of = _Source(client, bucket, key_prefix)
            _fetch_parallel(source_of, target, missing, marker, report, attempts, concurrency, part_size)
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
            "concurrency": concurrency,
            "fetch_s": round(report.fetch_seconds, 3),
            "verify_s": round(report.verify_seconds, 3),
            "seconds": round(report.seconds, 3),
        },
    )
    return report


def record_verified(target: Path, manifest: Manifest) -> None:
    """Record ``target``'s files as verified against ``manifest``, whose hashes were just computed
    from these very files (a host that made a version's files itself, as the prepared-weights
    publisher does): the next fetch of that version into ``target`` reuses them with one ``stat``
    each, as it reuses files it downloaded, instead of hashing them all again."""
    with _exclusive(target / LOCK_NAME):
        marker = {entry.path: _stamp(target / entry.path, entry.sha256) for entry in manifest.files}
        _write_marker(target, marker)
        _write_atomically(target / MANIFEST_NAME, manifest.to_json().encode())


def default_client(concurrency: int) -> Any:
    import boto3  # imported here so a runtime serving a local directory never needs AWS settings
    from botocore.config import Config

    # botocore keeps 10 connections per client by default: more GETs than that would queue.
    return boto3.client("s3", config=Config(max_pool_connections=concurrency + 2))


def remote_manifest(client: Any, source: str, version: str) -> Manifest:
    """The manifest of ``source`` at ``version`` as S3 holds it (no cache); WeightsError if unreadable."""
    bucket, key_prefix = version_prefix(source, version)
    key = f"{key_prefix}/{MANIFEST_NAME}"
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return Manifest.from_json(body.decode("utf-8", errors="replace"))
    except ManifestError as exc:
        raise WeightsError(f"s3://{bucket}/{key}: {exc}") from exc
    except Exception as exc:  # botocore raises a zoo of types: not found, denied, unreachable
        raise WeightsError(f"cannot read the weights manifest s3://{bucket}/{key}: {exc}") from exc


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
    marker: dict[str, dict[str, Any]],
    report: FetchReport,
    attempts: int,
) -> None:
    path = target / entry.path
    if _reusable(target, entry, marker, report):
        return
    key = f"{key_prefix}/{entry.path}"
    last = ""
    for attempt in range(1, attempts + 1):
        partial, size, digest = _download(client, bucket, key, path, report)
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


def _rehash_matches(
    path: Path, entry: ManifestEntry, marker: dict[str, dict[str, Any]], report: FetchReport
) -> bool:
    """A cached file of the right size that lost its stamp: hash it; True (and stamped) if it matches."""
    if not (path.is_file() and path.stat().st_size == entry.size):
        return False
    report.files_rehashed.append(entry.path)
    started = time.monotonic()
    matches = sha256_file(path) == entry.sha256
    report.verify_seconds += time.monotonic() - started
    if matches:
        marker[entry.path] = _stamp(path, entry.sha256)
        report.files_reused.append(entry.path)
        return True
    log.warning(
        "cached file fails its checksum; fetching it again",
        extra={"event": "weights_corrupt", "file": entry.path},
    )
    return False


def _download(client: Any, bucket: str, key: str, path: Path, report: FetchReport) -> tuple[Path, int, str]:
    """Download beside ``path`` under a temporary name; return (temporary path, size, sha256)."""
    from boto3.s3.transfer import TransferConfig

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = _partial_name(path)
    config = TransferConfig(multipart_threshold=64 * 1024 * 1024, max_concurrency=8)
    started = time.monotonic()
    try:
        client.download_file(bucket, key, str(partial), Config=config)
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise WeightsError(f"cannot download s3://{bucket}/{key}: {exc}") from exc
    with partial.open("rb+") as fh:
        os.fsync(fh.fileno())
    hashing = time.monotonic()
    report.fetch_seconds += hashing - started
    size = partial.stat().st_size
    digest = sha256_file(partial)
    report.verify_seconds += time.monotonic() - hashing
    return partial, size, digest


def _partial_name(path: Path) -> Path:
    return path.with_name(f"{path.name}{PARTIAL_SUFFIX}-{os.getpid()}")


# --- the parallel path ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    client: Any
    bucket: str
    key_prefix: str

    def key(self, entry: ManifestEntry) -> str:
        return f"{self.key_prefix}/{entry.path}"

    def uri(self, entry: ManifestEntry) -> str:
        return f"s3://{self.bucket}/{self.key(entry)}"


def _reusable(
    target: Path, entry: ManifestEntry, marker: dict[str, dict[str, Any]], report: FetchReport
) -> bool:
    """True when the cached copy of ``entry`` is verified (by its stamp, or by hashing it now)."""
    path = target / entry.path
    if _trusted(path, entry, marker):
        report.files_reused.append(entry.path)
        return True
    if report.offline:
        raise WeightsError(f"{path}: changed since it was verified and S3 is unreachable")
    if _rehash_matches(path, entry, marker, report):
        return True
    marker.pop(entry.path, None)
    return False


class _Incoming:
    """One file being downloaded in parts: written at offsets as chunks land, hashed in order.

    Chunks of one part land in order, parts in any order; a chunk ahead of the hash waits in
    memory until the bytes before it are hashed (the chunks of a file's first part never wait).
    Whichever worker lands the awaited chunk hashes every consecutive chunk that is ready,
    outside the lock (hashlib releases the GIL on large buffers), so several files hash at once
    while their other parts are still downloading.
    """

    def __init__(self, entry: ManifestEntry, path: Path, part_size: int) -> None:
        self.entry = entry
        self.partial = _partial_name(path)
        self.parts = max(1, -(-entry.size // part_size))
        self.part_size = part_size
        self.received = 0
        self.hash_seconds = 0.0
        self._digest = hashlib.sha256()
        self._ready: dict[int, bytes] = {}  # offset -> chunk that landed ahead of the hash
        self._hashed = 0  # the hash has consumed every byte before this offset
        self._hashing = False
        self._parts_left = self.parts
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def byte_range(self, index: int) -> tuple[int, int]:
        first = index * self.part_size
        return first, min(first + self.part_size, self.entry.size) - 1

    def land(self, offset: int, data: bytes) -> None:
        os.pwrite(self.fd, data, offset)
        with self._lock:
            self.received += len(data)
            self._ready[offset] = data
            if self._hashing:
                return  # the worker hashing this file will reach this chunk
            self._hashing = True
        while True:
            with self._lock:
                chunk = self._ready.pop(self._hashed, None)
                if not chunk:
                    self._hashing = False
                    return
                self._hashed += len(chunk)
            started = time.monotonic()
            self._digest.update(chunk)
            self.hash_seconds += time.monotonic() - started

    def part_landed(self) -> None:
        """One part is in; after the last, its worker writes the file to disk while the other files'
        parts still download. Left to the end, the whole model's dirty pages (below the kernel's
        background threshold, so never written early) would be flushed only after the last byte
        came in: the disk's time added to the network's rather than overlapping it."""
        with self._lock:
            self._parts_left -= 1
            last = self._parts_left == 0
        if last:
            os.fdatasync(self.fd)

    def finish(self) -> tuple[int, str]:
        """Close the file durably; return (bytes received, sha256 of the bytes in order)."""
        os.fsync(self.fd)
        os.close(self.fd)
        complete = self._hashed == self.received and not self._ready
        return self.received, self._digest.hexdigest() if complete else "incomplete"

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.partial.unlink(missing_ok=True)


def _fetch_parallel(
    source: _Source,
    target: Path,
    entries: list[ManifestEntry],
    marker: dict[str, dict[str, Any]],
    report: FetchReport,
    attempts: int,
    concurrency: int,
    part_size: int | None,
) -> None:
    """Download ``entries`` through one pool of ranged GETs; retry the files that fail their hash."""
    pending = list(entries)
    if part_size is None:
        wanted = -(-sum(e.size for e in entries) // concurrency)
        part_size = min(MAX_PART_SIZE, max(MIN_PART_SIZE, wanted))
    failures: dict[str, str] = {}
    for attempt in range(1, attempts + 1):
        if not pending:
            return
        started = time.monotonic()
        incoming = _download_round(source, target, pending, concurrency, part_size)
        report.fetch_seconds += time.monotonic() - started
        failed = []
        for item in incoming:
            size, digest = item.finish()
            entry = item.entry
            report.bytes_downloaded += size
            report.verify_seconds += item.hash_seconds
            if size == entry.size and digest == entry.sha256:
                path = target / entry.path
                os.replace(item.partial, path)
                marker[entry.path] = _stamp(path, entry.sha256)
                report.files_downloaded.append(entry.path)
                continue
            item.partial.unlink(missing_ok=True)
            failures[entry.path] = (
                f"got {size} bytes with sha256 {digest}, manifest says {entry.size} bytes with sha256 {entry.sha256}"
            )
            log.warning(
                "downloaded file fails verification",
                extra={
                    "event": "weights_mismatch",
                    "file": entry.path,
                    "attempt": attempt,
                    "detail": failures[entry.path],
                },
            )
            failed.append(entry)
        _write_marker(target, marker)
        pending = failed
    if pending:
        entry = pending[0]
        raise WeightsError(
            f"weights file {entry.path!r} ({source.uri(entry)}) failed verification after {attempts} "
            f"download(s): {failures[entry.path]}"
        )


def _download_round(
    source: _Source, target: Path, entries: list[ManifestEntry], concurrency: int, part_size: int
) -> list[_Incoming]:
    """Every part of every file in one bounded pool; the files with all their parts landed."""
    incoming = [_Incoming(e, target / e.path, part_size) for e in entries]
    # Largest files first: their parts are the long pole, small files fill the gaps at the end.
    order = sorted(incoming, key=lambda item: -item.entry.size)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="weights-get") as pool:
        futures: list[Future[None]] = [
            pool.submit(_get_part, source, item, index) for item in order for index in range(item.parts)
        ]
        done, not_done = wait(futures, return_when=FIRST_EXCEPTION)
        for future in not_done:
            future.cancel()
    errors = [f.exception() for f in futures if f.done() and not f.cancelled() and f.exception()]
    if errors:
        for item in incoming:
            item.abandon()
        error = errors[0]
        raise error if isinstance(error, WeightsError) else WeightsError(str(error))
    return incoming


def _get_part(source: _Source, item: _Incoming, index: int) -> None:
    entry = item.entry
    kwargs: dict[str, Any] = {"Bucket": source.bucket, "Key": source.key(entry)}
    first, last = item.byte_range(index)
    if item.parts > 1:
        kwargs["Range"] = f"bytes={first}-{last}"
    offset = first
    try:
        body = source.client.get_object(**kwargs)["Body"]
        while chunk := body.read(STREAM_CHUNK):
            item.land(offset, chunk)
            offset += len(chunk)
        item.part_landed()
    except Exception as exc:  # botocore raises a zoo of types: not found, denied, unreachable
        raise WeightsError(f"cannot download {source.uri(entry)}: {exc}") from exc


def _trusted(path: Path, entry: ManifestEntry, marker: dict[str, dict[str, Any]]) -> bool:
    """True when ``path`` is the very file verified earlier against this manifest entry."""
    stamp = marker.get(entry.path)
    if not stamp or stamp.get("sha256") != entry.sha256:
        return False
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_size == entry.size == stamp.get("size") and st.st_mtime_ns == stamp.get("mtime_ns")


def _stamp(path: Path, sha256: str) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}


def _read_marker(target: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((target / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}


def _write_marker(target: Path, marker: dict[str, dict[str, Any]]) -> None:
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
