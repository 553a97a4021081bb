"""Compiled GPU kernels kept in S3 for the next host: Triton's cache of what a start compiled.

Triton compiles each kernel specialization the first time it runs — on a GPU host the warm-up and
the CUDA-graph capture run every decode shape, so a start compiles them all, on its CPU — and keeps
the results in its cache directory (``TRITON_CACHE_DIR``). A new host would compile them again. A
start points that directory at one of the host's weights cache and, before the engine is built,
restores it from beside the weights version::

    s3://bucket/prefix/<version>/kernels/<key>.tar

``key`` digests the engine's spec (the runtime's identity with its torch version, the device kind —
on a GPU its name and compute capability —, dtype, quantization and ranks) and Triton's version:
the image's code × the model × the GPU type. Triton's own cache names each entry by its kernel's
source, specialization and target, so a restored entry is used only where it is exactly what the
JIT would compile; a wrong or stale one costs nothing but its bytes.

Once the engine is ready, a start that compiled what the restore did not bring publishes the whole
directory as one object (one PUT: a reader sees all of it or the previous one). Neither step can
stop a start: a failed restore or publish is logged and the kernels are compiled as before. A local
``weights_uri`` keeps the directory on the host only (a restart reuses it).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from frontier_runtime.storage.manifest import version_prefix
from frontier_runtime.storage.weights import is_s3_uri

log = logging.getLogger("frontier_runtime.kernel_cache")

#: Triton's cache directory, read by Triton each time it looks there.
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
#: Below a weights version in S3, and below the host's weights cache: the kernel caches by key.
KERNELS_DIR = "kernels"
KEY_FORMAT = "frontier-kernels-key/1"
#: Triton writes an entry in a temporary directory of this prefix, then renames it into place.
TRITON_TEMP_PREFIX = "tmp."


@dataclass
class KernelCache:
    """This start's kernel directory, what the restore put there, and where a publish goes."""

    directory: Path
    key: str
    #: The files (relative paths) the kept archive holds: what the next host gets already.
    restored: frozenset[str]
    #: Puts the directory's archive where the next host restores it (None: kept on this host only).
    upload: Callable[[bytes], None] | None = None

    def publish(self) -> int:
        """Upload the directory if it holds what the kept archive lacks (this start compiled it, or an
        earlier start here that could not publish); the number of such files."""
        new = entries(self.directory) - self.restored
        if not new or self.upload is None:
            return 0
        started = time.monotonic()
        body = archive(self.directory)
        try:
            self.upload(body)
        except Exception as exc:  # the replica serves either way; the next host compiles again
            log.warning(
                f"compiled kernels not kept: {exc}",
                extra={"event": "kernels_publish_failed", "key": self.key, "error": str(exc)},
            )
            return 0
        log.info(
            f"compiled kernels kept: {len(new)} new files, {len(body)} bytes",
            extra={
                "event": "kernels_kept",
                "key": self.key,
                "files": len(new),
                "bytes": len(body),
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return len(new)


def cache_key(spec_json: str) -> str:
    text = json.dumps([KEY_FORMAT, json.loads(spec_json), _triton_version()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def open_cache(
    weights_uri: str, version: str, cache_root: Path, spec_json: str, s3_client: Any | None = None
) -> KernelCache:
    """Point Triton at this engine's kernel directory and fill it from S3 where the weights are there."""
    key = cache_key(spec_json)
    directory = cache_root / KERNELS_DIR / key
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[TRITON_CACHE_ENV] = str(directory)
    if not is_s3_uri(weights_uri):
        return KernelCache(directory, key, entries(directory))  # nowhere to keep it but here
    client = s3_client if s3_client is not None else _client()
    bucket, prefix = version_prefix(weights_uri, f"{version}/{KERNELS_DIR}")
    object_key = f"{prefix}/{key}.tar"

    def upload(body: bytes) -> None:
        client.put_object(Bucket=bucket, Key=object_key, Body=body)

    started = time.monotonic()
    try:
        body = client.get_object(Bucket=bucket, Key=object_key)["Body"].read()
    except Exception as exc:  # absent (the first host of its kind) or unreachable: compile as before
        found = "none kept yet" if _is_missing(exc) else f"not read: {exc}"
        log.info(f"compiled kernels: {found}", extra={"event": "kernels_miss", "key": key})
        return KernelCache(directory, key, frozenset(), upload)
    try:
        kept = extract(body, directory)
    except (tarfile.TarError, OSError) as exc:  # a damaged or unsafe archive: compile, and replace it
        log.warning(f"compiled kernels refused: {exc}", extra={"event": "kernels_refused", "key": key})
        return KernelCache(directory, key, frozenset(), upload)
    log.info(
        f"compiled kernels restored: {len(kept)} files",
        extra={
            "event": "kernels_restored",
            "key": key,
            "files": len(kept),
            "bytes": len(body),
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    return KernelCache(directory, key, kept, upload)


def entries(directory: Path) -> frozenset[str]:
    """The directory's finished entries' files (Triton's half-written temporaries left out)."""
    return frozenset(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not p.relative_to(directory).parts[0].startswith(TRITON_TEMP_PREFIX)
    )


def archive(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted(entries(directory)):
            tar.add(directory / name, arcname=name, recursive=False)
    return buffer.getvalue()


def extract(body: bytes, directory: Path) -> frozenset[str]:
    """Unpack an archive of :func:`archive` into ``directory``, refusing anything but plain files
    inside it (the "data" filter); files already there stay as they are. The archive's files."""
    with tarfile.open(fileobj=io.BytesIO(body), mode="r") as tar:
        files = [m for m in tar.getmembers() if m.isfile()]
        missing = [m for m in files if not (directory / m.name).exists()]
        tar.extractall(directory, members=missing, filter="data")
    return frozenset(m.name for m in files)


def _client() -> Any:
    import boto3
    from botocore.config import Config

    # A kernel cache is worth seconds of compiling, not minutes of waiting on an unreachable S3.
    return boto3.client("s3", config=Config(connect_timeout=3, read_timeout=30, retries={"max_attempts": 2}))


def _is_missing(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in ("NoSuchKey", "404")


def _triton_version() -> str:
    """Triton's version, read from its metadata (importing it costs a start a second)."""
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:  # an image without Triton compiles no GPU kernel
        return "none"
