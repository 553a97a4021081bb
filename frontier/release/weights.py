"""``weights.push``: upload a model directory to the stack's weights bucket with a manifest.

Each file goes to ``<weights_uri>/<version>/<path>`` with an SHA-256 checksum (multipart, one
checksum per part, for large files) and its hex sha256 in the object's metadata. A file already
there with the same size and sha256 is skipped, so re-pushing an unchanged model uploads nothing.
The manifest (:mod:`frontier_runtime.storage.manifest`) is written last: a partial push is never
visible to a runtime, and a version whose manifest exists is immutable.

``weights.gc`` is the other end of a version's life: it keeps every version that a kept release
(one of the ``rollout.keep_releases`` most recent releases in the stack's history, and the last
good one) names in its ``runtime.yaml``, plus the ``rollout.keep_weight_versions`` most recently
pushed, and deletes the rest. A version is deleted manifest first, so a runtime never sees a
half-deleted version as complete; a version without a manifest (a push under way or interrupted)
is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from frontier_runtime.storage.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    build_manifest,
    split_s3_uri,
    version_prefix,
)

from frontier.errors import FrontierError
from frontier.release.history import HistoryStore, iso, now

MULTIPART_THRESHOLD = 64 * 1024 * 1024
PART_SIZE = 64 * 1024 * 1024
SHA_METADATA = "sha256"


class WeightsError(FrontierError):
    """A push that cannot proceed: missing directory, bucket, or a version that would change."""


@dataclass
class PushReport:
    bucket: str
    prefix: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0
    manifest_written: bool = False

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


Progress = Callable[[str, int], None]  # (file path, bytes just sent)


def push(
    s3: Any,
    src: Path,
    weights_uri: str,
    model: str,
    version: str,
    *,
    progress: Progress | None = None,
    create_bucket: bool = False,
    transfer: TransferConfig | None = None,
) -> PushReport:
    src = Path(src)
    if not src.is_dir():
        raise WeightsError(f"--src {src}: not a directory")
    bucket, prefix = version_prefix(weights_uri, version)
    _check_bucket(s3, bucket, prefix, create_bucket)
    manifest = build_manifest(src, model, version, created_at=iso(now()))
    stored = _listed(s3, bucket, f"{prefix}/")
    manifest_key = f"{prefix}/{MANIFEST_NAME}"
    existing = _existing_manifest(s3, bucket, manifest_key) if manifest_key in stored else None
    if existing is not None and existing.files != manifest.files:
        raise WeightsError(
            f"s3://{bucket}/{prefix} already holds a different model (its manifest lists other files or "
            f"hashes); a weights version is immutable: push under a new version"
        )
    report = PushReport(bucket, prefix)
    config = transfer or TransferConfig(
        multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=PART_SIZE
    )
    for entry in manifest.files:
        key = f"{prefix}/{entry.path}"
        if stored.get(key) == entry.size and _same_object(s3, bucket, key, entry.size, entry.sha256):
            report.skipped.append(entry.path)
            if progress:
                progress(entry.path, entry.size)
            continue
        s3.upload_file(
            str(src / entry.path),
            bucket,
            key,
            ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": {SHA_METADATA: entry.sha256}},
            Config=config,
            Callback=(lambda n, p=entry.path: progress(p, n)) if progress else None,
        )
        report.uploaded.append(entry.path)
        report.bytes_uploaded += entry.size
    if existing is None:
        # Written last, and only if absent: two pushes of one version cannot both claim it.
        s3.put_object(
            Bucket=bucket,
            Key=f"{prefix}/{MANIFEST_NAME}",
            Body=manifest.to_json().encode(),
            ContentType="application/json",
            ChecksumAlgorithm="SHA256",
            IfNoneMatch="*",
        )
        report.manifest_written = True
    return report


# The pusher is the deploy role, whose s3:ListBucket holds only with an s3:prefix under the model's
# prefix. So the bucket is probed, and what a version already holds is found, by listing under the
# version's prefix, never by HeadBucket (AWS checks it as s3:ListBucket with no prefix: refused) nor
# by a HEAD or GET of a key that may be missing (AWS answers 403, not 404, to a caller without an
# unconditioned listing). Only keys the listing shows are read.


def _check_bucket(s3: Any, bucket: str, prefix: str, create: bool) -> None:
    try:
        s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/", MaxKeys=1)
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if not create or code != "NoSuchBucket":
            raise WeightsError(f"weights bucket {bucket!r} is not reachable: {code}") from None
        s3.create_bucket(Bucket=bucket)


def _listed(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` and its size."""
    found: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.update((obj["Key"], obj["Size"]) for obj in page.get("Contents", []))
    return found


def _existing_manifest(s3: Any, bucket: str, key: str) -> Manifest | None:
    """The manifest at ``key``, a key a listing has shown (None if deleted since)."""
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise
    return Manifest.from_json(body.decode())


def _same_object(s3: Any, bucket: str, key: str, size: int, sha256: str) -> bool:
    """Whether ``key``, listed with ``size`` bytes, holds exactly this file (its recorded sha256)."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    same: bool = head.get("ContentLength") == size and head.get("Metadata", {}).get(SHA_METADATA) == sha256
    return same


# --- weights.gc -----------------------------------------------------------------------------------

RUNTIME_CONFIG = "runtime.yaml"  # the rendered file of a release that names its weights


@dataclass(frozen=True)
class StoredVersion:
    """One weights version in the bucket: its objects, and its manifest's push time ("" if none)."""

    version: str
    key_prefix: str  # the version's "folder" in the bucket, without the trailing slash
    keys: tuple[str, ...]
    bytes: int
    pushed_at: str
    complete: bool  # its manifest exists


@dataclass(frozen=True)
class Verdict:
    stored: StoredVersion
    keep: bool
    why: str

    @property
    def version(self) -> str:
        return self.stored.version


@dataclass(frozen=True)
class GcPlan:
    bucket: str
    prefix: str
    verdicts: tuple[Verdict, ...]

    @property
    def doomed(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if not v.keep)


@dataclass(frozen=True)
class KeptRelease:
    release_id: str
    weights_uri: str
    version: str


def kept_releases(store: HistoryStore, keep_releases: int) -> list[KeptRelease]:
    """The releases hosts may still run or roll back to, newest first, with the weights each names.

    Hosts keep the ``keep_releases`` most recent releases whatever their outcome (a rollback rolls
    one of them), and the last good release is kept even when newer failed deploys push it out.
    """
    if keep_releases < 1:
        raise WeightsError(f"keep_releases = {keep_releases}: must be at least 1")
    records = store.records()
    ids: list[str] = []
    for record in reversed(records):
        release_id = record.get("release")
        if release_id and release_id not in ids:
            ids.append(release_id)
    kept = ids[:keep_releases]
    last_good = store.last_good()
    if last_good and last_good["release"] not in kept:
        kept.append(last_good["release"])
    return [_weights_of(store, release_id) for release_id in kept]


def _weights_of(store: HistoryStore, release_id: str) -> KeptRelease:
    release = store.get_release(release_id)
    text = release.files.get(RUNTIME_CONFIG)
    if text is None:
        raise WeightsError(
            f"release {release_id} has no {RUNTIME_CONFIG}: cannot tell which weights it needs"
        )
    try:
        model = (yaml.safe_load(text) or {})["model"]
        return KeptRelease(release_id, str(model["weights_uri"]), str(model["version"]))
    except (yaml.YAMLError, KeyError, TypeError) as exc:
        raise WeightsError(
            f"release {release_id}: {RUNTIME_CONFIG} does not name model.weights_uri and model.version ({exc})"
        ) from None


def stored_versions(s3: Any, weights_uri: str) -> list[StoredVersion]:
    """Every version under ``weights_uri`` in the bucket, newest push first (incomplete ones last)."""
    bucket, prefix = split_s3_uri(weights_uri)
    root = f"{prefix}/" if prefix else ""
    objects: dict[str, list[tuple[str, int]]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
        for obj in page.get("Contents", []):
            version, _, rest = obj["Key"][len(root) :].partition("/")
            if rest:
                objects.setdefault(version, []).append((obj["Key"], obj["Size"]))
    versions = []
    for version, items in objects.items():
        keys = tuple(sorted(k for k, _ in items))
        manifest = _existing_manifest_or_none(s3, bucket, f"{root}{version}/{MANIFEST_NAME}", keys)
        pushed_at = manifest.created_at if manifest else ""
        size = sum(n for _, n in items)
        versions.append(
            StoredVersion(version, f"{root}{version}", keys, size, pushed_at, manifest is not None)
        )
    complete = sorted(
        (v for v in versions if v.complete), key=lambda v: (v.pushed_at, v.version), reverse=True
    )
    return complete + sorted((v for v in versions if not v.complete), key=lambda v: v.version)


def _existing_manifest_or_none(s3: Any, bucket: str, key: str, keys: tuple[str, ...]) -> Manifest | None:
    if key not in keys:
        return None
    try:
        return _existing_manifest(s3, bucket, key)
    except ManifestError as exc:
        raise WeightsError(f"s3://{bucket}/{key}: {exc}") from None


def plan_gc(
    s3: Any,
    weights_uri: str,
    kept: Iterable[KeptRelease],
    keep_last: int,
    only: Iterable[str] = (),
) -> GcPlan:
    """What a GC of ``weights_uri`` keeps and deletes, and why; nothing is touched.

    ``only`` names the versions to delete (none: every version no rule keeps). Asking for a version
    a kept release needs is refused, naming the release, before anything is deleted.
    """
    if keep_last < 0:
        raise WeightsError(f"--keep-last = {keep_last}: must be >= 0")
    bucket, prefix = split_s3_uri(weights_uri)
    needs: dict[str, list[str]] = {}
    for release in kept:
        if release.weights_uri.rstrip("/") == weights_uri.rstrip("/"):
            needs.setdefault(release.version, []).append(release.release_id)
    versions = stored_versions(s3, weights_uri)
    asked = list(dict.fromkeys(only))
    _refuse_needed(asked, needs, weights_uri)
    known = {v.version for v in versions}
    unknown = [v for v in asked if v not in known]
    if unknown:
        raise WeightsError(
            f"weights version(s) {', '.join(unknown)} not found under {weights_uri} "
            f"(there: {', '.join(sorted(known)) or 'none'})"
        )
    recent = [v.version for v in versions if v.complete][:keep_last]
    verdicts = tuple(_verdict(v, needs, recent, keep_last, asked) for v in versions)
    return GcPlan(bucket, prefix, verdicts)


def _refuse_needed(asked: list[str], needs: Mapping[str, list[str]], weights_uri: str) -> None:
    for version in asked:
        if version in needs:
            raise WeightsError(
                f"refusing to delete {weights_uri}/{version}: kept release {needs[version][0]} needs it "
                "(a host may run it or roll back to it)"
            )


def _verdict(
    v: StoredVersion, needs: Mapping[str, list[str]], recent: list[str], keep_last: int, asked: list[str]
) -> Verdict:
    def verdict(keep: bool, why: str) -> Verdict:
        return Verdict(v, keep, why)

    if v.version in needs:
        return verdict(True, "kept release " + ", ".join(needs[v.version]) + " needs it")
    if not v.complete:
        return verdict(True, "no manifest (a push under way or interrupted): left alone")
    if asked:
        return verdict(v.version not in asked, "asked for" if v.version in asked else "not asked for")
    if v.version in recent:
        return verdict(True, f"one of the last {keep_last} pushed")
    return verdict(False, f"no kept release needs it; older than the last {keep_last} pushed")


def apply_gc(s3: Any, plan: GcPlan) -> list[str]:
    """Delete the plan's doomed versions, each manifest first; return the versions deleted."""
    deleted = []
    for verdict in plan.doomed:
        stored = verdict.stored
        manifest = f"{stored.key_prefix}/{MANIFEST_NAME}"
        # The manifest goes first: from then on no runtime can start on a half-deleted version.
        s3.delete_object(Bucket=plan.bucket, Key=manifest)
        rest = [k for k in stored.keys if k != manifest]
        for start in range(0, len(rest), 1000):  # DeleteObjects takes at most 1000 keys a call
            batch = [{"Key": k} for k in rest[start : start + 1000]]
            s3.delete_objects(Bucket=plan.bucket, Delete={"Objects": batch, "Quiet": True})
        deleted.append(verdict.version)
    return deleted
