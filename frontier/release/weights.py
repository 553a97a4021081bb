"""``weights.push``: upload a model directory to the stack's weights bucket with a manifest.

Each file goes to ``<weights_uri>/<version>/<path>`` with an SHA-256 checksum (multipart, one
checksum per part, for large files) and its hex sha256 in the object's metadata. A file already
there with the same size and sha256 is skipped, so re-pushing an unchanged model uploads nothing.
The manifest (:mod:`frontier_runtime.storage.manifest`) is written last: a partial push is never
visible to a runtime, and a version whose manifest exists is immutable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from frontier_runtime.storage.manifest import MANIFEST_NAME, Manifest, build_manifest, version_prefix

from frontier.errors import FrontierError
from frontier.release.history import iso, now

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
    _check_bucket(s3, bucket, create_bucket)
    manifest = build_manifest(src, model, version, created_at=iso(now()))
    existing = _existing_manifest(s3, bucket, f"{prefix}/{MANIFEST_NAME}")
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
        if _same_object(s3, bucket, key, entry.size, entry.sha256):
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


def _check_bucket(s3: Any, bucket: str, create: bool) -> None:
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if not create:
            raise WeightsError(
                f"weights bucket {bucket!r} is not reachable: {exc.response['Error']['Code']}"
            ) from None
        s3.create_bucket(Bucket=bucket)


def _existing_manifest(s3: Any, bucket: str, key: str) -> Manifest | None:
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise
    return Manifest.from_json(body.decode())


def _same_object(s3: Any, bucket: str, key: str, size: int, sha256: str) -> bool:
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return head.get("ContentLength") == size and head.get("Metadata", {}).get(SHA_METADATA) == sha256
