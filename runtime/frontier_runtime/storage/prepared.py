"""The prepared-weights cache: the engine's load-time work, kept in S3 for the next host.

A prepared model directory (``models/llama/prepared.py``) holds the checkpoint's small files
(config, tokenizer), ``prepared.json`` and its shards ``prepared-NNNNN.safetensors``: every tensor
as the engine lays it out after loading. It is kept beside the weights version it was made from, one per key::

    s3://bucket/prefix/<version>/prepared/<key>/manifest.json
    s3://bucket/prefix/<version>/prepared/<key>/prepared.json, prepared-00000.safetensors, ...,
                                                config.json, tokenizer.json, ...

``key`` is a digest of the weights version's content (its manifest's files and hashes) and of the
engine's spec: the runtime's version and layout code, the device kind (the CPU's kernel choices,
or the GPU type), the dtype and quantization settings and the placement. The directory is an
ordinary weights version to the fetcher (``fetch_weights`` of ``<version>/prepared/<key>``): a
parallel ranged fetch, every file hashed as it lands and refused on a mismatch, the host cache
reused on a restart. A start that finds its key loads from it without packing; one that does not
fetches the checkpoint, loads it, and once ready publishes what it computed for the next host
(manifest last, so a half-written directory is never seen). A prepared file whose recorded spec
differs from the engine's is refused by the loader; the start then loads the checkpoint and
publishes over it.

A local ``weights_uri`` (a directory) gets the same cache on the host only, under
``<weights_cache_dir>/local-prepared/<key>/``, keyed by the directory's files (path, size, mtime).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier_runtime.storage import weights
from frontier_runtime.storage.manifest import MANIFEST_NAME, Manifest, build_manifest, version_prefix
from frontier_runtime.storage.weights import (
    FetchReport,
    WeightsError,
    cache_dir_for,
    fetch_weights,
    record_verified,
    remote_manifest,
)

log = logging.getLogger("frontier_runtime.prepared")

#: Below a weights version: the prepared directories made from it, one per key.
PREPARED_DIR = "prepared"
#: Under the host's weights cache: the prepared directories of local weights directories.
LOCAL_PREPARED_DIR = "local-prepared"
#: What the prepared file replaces: the checkpoint's tensors (the rest of the directory is kept).
CHECKPOINT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin", ".pt")
KEY_FORMAT = "frontier-prepared-key/1"
#: In a prepared directory: what its key digests (the weights' digest and the engine's spec), so a
#: host with S3 unreachable can find its own among the cached ones.
KEY_NAME = "key.json"


def weights_digest(manifest: Manifest) -> str:
    """A weights version's content: every file's path, size and sha256 (not when it was pushed)."""
    rows = sorted((e.path, e.size, e.sha256) for e in manifest.files)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def local_digest(model_dir: Path) -> str:
    """A local weights directory's identity: every file's path, size and mtime (hashing GBs at
    every start would cost more than the packing the cache saves)."""
    rows = []
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        st = file.stat()
        rows.append((file.relative_to(model_dir).as_posix(), st.st_size, st.st_mtime_ns))
    return hashlib.sha256(json.dumps([str(model_dir.resolve()), rows]).encode()).hexdigest()


def cache_key(weights: str, spec_json: str) -> str:
    """The key of the prepared directory for weights of digest ``weights`` loaded by ``spec_json``."""
    text = json.dumps([KEY_FORMAT, weights, json.loads(spec_json)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def prepared_version(version: str, key: str) -> str:
    return f"{version}/{PREPARED_DIR}/{key}"


@dataclass
class ModelSource:
    """Where a start loads from, and where what it prepares goes once it is ready."""

    model_dir: Path
    #: The directory holds a prepared file (a cache hit): the loader maps it instead of packing.
    hit: bool
    key: str
    #: Fetches and verifies the checkpoint itself: what a start falls back to when a prepared file is
    #: refused (None when ``model_dir`` already is the checkpoint).
    checkpoint: Callable[[], Path] | None = None
    #: Where the caller writes the prepared file of this key (then calls ``publish``).
    staging: Path | None = None
    #: Publishes ``staging`` with the small files of the checkpoint directory it was made from; the
    #: host's entry it leaves.
    publish: Callable[[Path], Path] | None = None
    reports: tuple[FetchReport, ...] = ()


def from_s3(
    source: str,
    version: str,
    cache_root: Path,
    spec_json: str,
    *,
    concurrency: int,
    s3_client: Any | None = None,
) -> ModelSource:
    """The prepared directory of this engine's key when S3 has it, else the checkpoint (verified)."""
    client = s3_client if s3_client is not None else weights.default_client(concurrency)

    def checkpoint() -> Path:
        report = fetch_weights(source, version, cache_root, s3_client=client, concurrency=concurrency)
        fetched.append(report)
        return report.model_dir

    fetched: list[FetchReport] = []
    try:
        manifest = remote_manifest(client, source, version)
    except WeightsError as exc:  # S3 unreachable: the verified host cache may still serve
        log.warning(f"prepared cache not consulted: {exc}", extra={"event": "prepared_skipped"})
        cached = _cached_prepared(source, version, cache_root, spec_json, client)
        if cached is not None:
            return cached
        report = fetch_weights(source, version, cache_root, s3_client=client, concurrency=concurrency)
        return ModelSource(report.model_dir, False, "", reports=(report,))
    key = cache_key(weights_digest(manifest), spec_json)
    bucket, prefix = version_prefix(source, prepared_version(version, key))
    # Staged where the fetcher keeps this key's directory: a restart here hashes it once and reuses it.
    staging = cache_dir_for(source, prepared_version(version, key), cache_root)
    keyed = json.dumps({"weights": weights_digest(manifest), "spec": json.loads(spec_json)}, sort_keys=True)
    publish = _s3_publisher(client, bucket, prefix, staging, keyed)
    try:
        report = fetch_weights(
            source, prepared_version(version, key), cache_root, s3_client=client, concurrency=concurrency
        )
    except WeightsError as exc:
        log.info(
            "prepared weights not in S3; loading the checkpoint",
            extra={"event": "prepared_miss", "key": key, "detail": str(exc)},
        )
        shutil.rmtree(staging, ignore_errors=True)
        model_dir = checkpoint()
        return ModelSource(model_dir, False, key, staging=staging, publish=publish, reports=tuple(fetched))
    log.info("prepared weights found", extra={"event": "prepared_hit", "key": key})
    return ModelSource(report.model_dir, True, key, checkpoint, staging, publish, (report,))


def _cached_prepared(
    source: str, version: str, cache_root: Path, spec_json: str, client: Any
) -> ModelSource | None:
    """With S3 unreachable: this engine's prepared directory, if the host cache holds it verified (a
    host that started from it never fetched the checkpoint). Its ``key.json`` says what it was keyed
    by; the fetcher serves it offline only while every file is exactly as verified."""
    root = cache_dir_for(source, f"{version}/{PREPARED_DIR}", cache_root)
    for directory in sorted(p for p in root.glob("*") if p.is_dir()):
        try:
            keyed = json.loads((directory / KEY_NAME).read_text())
            if keyed.get("spec") != json.loads(spec_json) or directory.name != cache_key(
                keyed["weights"], spec_json
            ):
                continue
            report = fetch_weights(
                source, prepared_version(version, directory.name), cache_root, s3_client=client
            )
        except (OSError, ValueError, KeyError, WeightsError):
            continue
        return ModelSource(report.model_dir, True, directory.name, reports=(report,))
    return None


def from_directory(model_dir: Path, cache_root: Path, spec_json: str) -> ModelSource:
    """A local weights directory: its prepared directory on this host when one was made, else itself."""
    key = cache_key(local_digest(model_dir), spec_json)
    target = cache_root / LOCAL_PREPARED_DIR / key
    if (target / MANIFEST_NAME).is_file():
        return ModelSource(target, True, key, checkpoint=lambda: model_dir)
    staging = target.with_name(f"{key}.staging-{os.getpid()}")

    def publish(checkpoint_dir: Path) -> Path:
        _link_small_files(checkpoint_dir, staging)
        (staging / MANIFEST_NAME).write_text(
            build_manifest(staging, model=model_dir.name, version=key).to_json()
        )
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        return target

    return ModelSource(model_dir, False, key, staging=staging, publish=publish)


def _s3_publisher(client: Any, bucket: str, prefix: str, staging: Path, keyed: str) -> Callable[[Path], Path]:
    """Uploads the staged prepared directory (its prepared file, plus the checkpoint's small files)
    under ``prefix``, manifest last; the staged files stay as this host's cache of the key."""

    def publish(checkpoint_dir: Path) -> Path:
        _link_small_files(checkpoint_dir, staging)
        (staging / KEY_NAME).write_text(keyed)
        manifest = build_manifest(staging, model=prefix, version=prefix.rsplit("/", 1)[-1])
        for entry in manifest.files:
            client.upload_file(str(staging / entry.path), bucket, f"{prefix}/{entry.path}")
        client.put_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST_NAME}", Body=manifest.to_json().encode())
        # This host's copy is a verified cache entry like a fetched one: a restart maps it unhashed.
        record_verified(staging, manifest)
        log.info(
            "prepared weights published",
            extra={
                "event": "prepared_published",
                "key": f"s3://{bucket}/{prefix}",
                "files": len(manifest.files),
            },
        )
        return staging

    return publish


def _link_small_files(checkpoint_dir: Path, staged: Path) -> None:
    """The checkpoint's files other than its tensors (config, tokenizer, ...) into ``staged``."""
    for file in sorted(p for p in checkpoint_dir.rglob("*") if p.is_file()):
        relative = file.relative_to(checkpoint_dir)
        name = relative.as_posix()
        skipped = name.startswith((".", f"{PREPARED_DIR}/")) or name == MANIFEST_NAME  # not the model's
        if skipped or name.endswith(CHECKPOINT_SUFFIXES):
            continue
        destination = staged / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, destination)
