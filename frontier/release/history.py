"""The stack's history bucket: artifacts, releases, the deploy history and the deploy lock.

Layout under ``s3://<bucket>/history/<stack>/``::

    artifacts/sha256-<hex>/artifact.json, <wheel file>   what release.build registered
    releases/<id>/release.json, files/<name>              every release ever rolled, byte for byte
    records/<UTC time>-<kind>-<release>.json              one record per deploy or rollback
    lock/deploy.json                                      the deploy lock (conditional put)

Records are separate objects (never a read-modify-write of one list), so two writers cannot lose
each other's entries. The bucket is ``frontier-<stack>-history`` on the local stack (moto) and
the ``history_bucket`` / ``history_prefix`` Pulumi stack outputs on cloud stacks (see
:mod:`frontier.aws`); the deploy role may write only under that prefix.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.release.artifact import CACHE_DIR, Artifact, ArtifactError, cached_path, verify
from frontier.release.release import MANIFEST, Release, ReleaseError, check_release_id, release_from_manifest

DEFAULT_LOCK_TTL_S = 3 * 3600


class LockHeld(FrontierError):
    """Another deploy or rollback of this stack is running."""


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class LockInfo:
    holder: str
    since: str
    expires: str
    purpose: str
    etag: str = ""

    def describe(self) -> str:
        return f"{self.holder} ({self.purpose}) since {self.since}, stale after {self.expires}"


class HistoryStore:
    """One stack's prefix in its history bucket."""

    def __init__(
        self,
        s3: Any,
        bucket: str,
        stack: str,
        prefix: str | None = None,
        *,
        artifacts_prefix: str | None = None,
    ) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.prefix = (prefix or f"history/{stack}/").rstrip("/") + "/"
        # Artifacts are the stack's, shared by its model pools (each pool keeps its own releases).
        self.artifacts_prefix = (artifacts_prefix or self.prefix).rstrip("/") + "/"
        self.stack = stack

    def ensure_bucket(self) -> None:
        with contextlib.suppress(ClientError):
            self.s3.head_bucket(Bucket=self.bucket)
            return
        try:
            self.s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    # --- objects ----------------------------------------------------------------------------------

    def _put(self, key: str, body: bytes | str, *, root: str | None = None, **kwargs: Any) -> dict:
        data = body.encode() if isinstance(body, str) else body
        return self.s3.put_object(Bucket=self.bucket, Key=(root or self.prefix) + key, Body=data, **kwargs)

    def _get(self, key: str, *, root: str | None = None) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=(root or self.prefix) + key)["Body"].read()
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
                return None
            raise

    def _keys(self, sub: str) -> list[str]:
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + sub
        ):
            keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
        return sorted(keys)

    # --- artifacts --------------------------------------------------------------------------------

    def put_artifact(self, artifact: Artifact, path: Path | None) -> None:
        base = f"artifacts/{artifact.digest.replace(':', '-')}/"
        if path is not None:
            verify(path, artifact.digest)
            self.s3.upload_file(str(path), self.bucket, self.artifacts_prefix + base + artifact.filename)
        self._put(base + "artifact.json", artifact.to_json(), root=self.artifacts_prefix)

    def get_artifact(self, digest: str) -> Artifact:
        body = self._get(f"artifacts/{digest.replace(':', '-')}/artifact.json", root=self.artifacts_prefix)
        if body is None:
            raise ArtifactError(
                f"digest {digest} is not a known artifact of stack {self.stack!r}: build it with "
                f"`fab release.build -s {self.stack}` (wheel) or `fab image.push -s {self.stack}` (image)"
            )
        return Artifact.from_json(body.decode())

    def fetch_artifact(self, artifact: Artifact, cache_dir: Path = CACHE_DIR) -> Path:
        """The wheel in the local cache, downloaded from the bucket if missing; verified either way."""
        path = cached_path(artifact, cache_dir)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.part")
            key = f"{self.artifacts_prefix}artifacts/{artifact.digest.replace(':', '-')}/{artifact.filename}"
            self.s3.download_file(self.bucket, key, str(tmp))
            verify(tmp, artifact.digest)
            tmp.replace(path)
        verify(path, artifact.digest)
        return path

    # --- releases ---------------------------------------------------------------------------------

    def put_release(self, release: Release) -> None:
        base = f"releases/{release.id}/"
        if self._get(base + MANIFEST) == release.manifest().encode():
            return
        for name, text in release.files.items():
            self._put(base + "files/" + name, text)
        self._put(base + MANIFEST, release.manifest())  # last: a release is visible only when complete

    def get_release(self, release_id: str) -> Release:
        check_release_id(release_id)
        base = f"releases/{release_id}/"
        manifest = self._get(base + MANIFEST)
        if manifest is None:
            raise ReleaseError(f"release {release_id} is not in the history of stack {self.stack!r}")
        files = {}
        for key in self._keys(base + "files/"):
            files[key[len(base + "files/") :]] = (self._get(key) or b"").decode()
        return release_from_manifest(manifest.decode(), files)

    # --- history ----------------------------------------------------------------------------------

    def append(self, record: dict[str, Any]) -> str:
        key = f"records/{record['started_at'].replace(':', '')}-{record['kind']}-{record.get('release', 'none')}.json"
        self._put(key, json.dumps(record, indent=2, sort_keys=True) + "\n", IfNoneMatch="*")
        return key

    def records(self) -> list[dict[str, Any]]:
        """Every deploy and rollback of the stack, oldest first."""
        out = []
        for key in self._keys("records/"):
            body = self._get(key)
            if body:
                out.append(json.loads(body))
        return sorted(out, key=lambda r: r["started_at"])

    def last_good(self, *, excluding: str | None = None) -> dict[str, Any] | None:
        for record in reversed(self.records()):
            if record["outcome"] == "succeeded" and record.get("release") != excluding:
                return record
        return None

    # --- the deploy lock --------------------------------------------------------------------------

    def read_lock(self) -> LockInfo | None:
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + "lock/deploy.json")
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
                return None
            raise
        data = json.loads(obj["Body"].read())
        return LockInfo(data["holder"], data["since"], data["expires"], data.get("purpose", ""), obj["ETag"])

    def acquire(
        self, purpose: str, *, ttl_s: float = DEFAULT_LOCK_TTL_S, holder: str | None = None
    ) -> LockInfo:
        """Take the stack's deploy lock with a conditional put; a stale lock (past its TTL) is replaced."""
        start = now()
        info = LockInfo(holder or operator(), iso(start), iso(start + dt.timedelta(seconds=ttl_s)), purpose)
        body = json.dumps(
            {"holder": info.holder, "since": info.since, "expires": info.expires, "purpose": purpose}
        )
        for _ in range(3):
            try:
                put = self._put("lock/deploy.json", body, IfNoneMatch="*")
                return LockInfo(info.holder, info.since, info.expires, purpose, put["ETag"])
            except ClientError as exc:
                if exc.response["Error"]["Code"] not in ("PreconditionFailed", "ConditionalRequestConflict"):
                    raise
            current = self.read_lock()
            if current is None:
                continue  # released between our put and our read: try again
            if current.expires > iso(now()):
                raise LockHeld(
                    f"stack {self.stack!r} is locked by another deploy: {current.describe()}; wait for it, "
                    f"or break a dead lock with `fab unlock -s {self.stack}`"
                )
            self._delete_lock(current.etag)  # stale: only the exact stale object is removed
        raise LockHeld(f"stack {self.stack!r}: could not take the deploy lock (contended)")

    def release_lock(self, lock: LockInfo) -> None:
        self._delete_lock(lock.etag)

    def break_lock(self) -> LockInfo | None:
        current = self.read_lock()
        if current is not None:
            self._delete_lock(current.etag)
        return current

    def _delete_lock(self, etag: str) -> None:
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=self.prefix + "lock/deploy.json", IfMatch=etag)
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("PreconditionFailed", "NoSuchKey", "404"):
                raise

    @contextlib.contextmanager
    def locked(self, purpose: str, *, ttl_s: float = DEFAULT_LOCK_TTL_S) -> Iterator[LockInfo]:
        lock = self.acquire(purpose, ttl_s=ttl_s)
        try:
            yield lock
        finally:
            self.release_lock(lock)


def stack_history(settings: Settings, s3: Any, bucket: str, prefix: str) -> HistoryStore:
    """The history of ``settings``' stack under ``prefix`` in ``bucket``.

    A stack of several models keeps each pool's releases, history and lock apart (``settings`` is
    then one pool's view); the artifacts (runtime wheels and images) stay the stack's.
    """
    pool_prefix = f"{prefix.rstrip('/')}/models/{settings.model.name}/" if settings.models else prefix
    return HistoryStore(s3, bucket, settings.stack, pool_prefix, artifacts_prefix=prefix)
