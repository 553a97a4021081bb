"""The stack's history bucket: artifacts, releases, the deploy history and the deploy lock.

Layout under ``s3://<bucket>/history/<stack>/``::

    artifacts/sha256-<hex>/artifact.json, <wheel file>   what release.build registered
    releases/<id>/release.json, files/<name>              every release ever rolled, byte for byte
    records/<UTC time>-<kind>-<release>.json              one record per deploy or rollback
    lock/deploy.json                                      the deploy lock, a lease (conditional puts)

Records are separate objects (never a read-modify-write of one list), so two writers cannot lose
each other's entries. The bucket is ``frontier-<stack>-history`` on the local stack (moto) and
the ``history_bucket`` / ``history_prefix`` Pulumi stack outputs on cloud stacks (see
:mod:`frontier.aws`); the deploy role may write only under that prefix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import getpass
import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError
from frontier_hostside.names import RELEASE_MANIFEST as MANIFEST
from frontier_hostside.release_signature import SIGNATURE_NAME

from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.release.artifact import CACHE_DIR, Artifact, ArtifactError, cached_path, verify
from frontier.release.release import Release, ReleaseError, check_release_id, release_from_manifest

DEFAULT_LOCK_TTL_S = 3 * 3600
#: A deploy lock is a lease: its holder renews it every RENEW_EVERY_S while it runs, and a holder
#: that dies stops renewing, so its lock lapses within DEFAULT_LEASE_S and the next deploy takes it.
#: Four renewals fit in one lease, so one or two slow or failed S3 calls do not lose it.
DEFAULT_LEASE_S = 60.0
RENEW_EVERY_S = 15.0


class LockHeld(FrontierError):
    """Another deploy or rollback of this stack is running."""


class LockLost(FrontierError):
    """The deploy lock this command held was taken over or removed while it ran."""


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


@dataclasses.dataclass(frozen=True)
class LockInfo:
    """The deploy lock as one read or write of ``lock/deploy.json`` left it.

    ``lease_until`` is when it lapses unless its holder renews it; ``expires`` is the longest its
    holder was ever meant to run (``lock_ttl_s``, sized by host count). Both free the lock once
    passed; ``expires`` is kept because hosts that boot during a deploy trust the deploy's pointer
    until then (frontier/targets/ec2/backend.py), and a 60 s horizon would cut that short.
    """

    holder: str
    since: str
    expires: str
    purpose: str
    etag: str = ""
    renewed: str = ""
    lease_until: str = ""
    #: Unique per taking: S3's ETag of a simple put is the body's MD5, so the token (and the
    #: renewal time) keep two holders' writes from ever sharing an ETag.
    token: str = ""
    #: The lapsed lock this taking replaced, as ``describe()`` put it ("" when the lock was free).
    replaced: str = ""

    @property
    def lapses(self) -> str:
        """When the lock frees itself: the lease's end, or ``expires`` if that comes first.

        A lock written before leases existed has no lease and lapses at ``expires``, as it did then.
        """
        return min(self.lease_until, self.expires) if self.lease_until else self.expires

    def lapsed(self, at: dt.datetime | None = None) -> bool:
        return self.lapses <= iso(at or now())

    def body(self) -> str:
        return json.dumps(
            {
                "holder": self.holder,
                "since": self.since,
                "expires": self.expires,
                "purpose": self.purpose,
                "renewed": self.renewed,
                "lease_until": self.lease_until,
                "token": self.token,
            }
        )

    def describe(self) -> str:
        if not self.lease_until:
            return f"{self.holder} ({self.purpose}) since {self.since}, stale after {self.expires}"
        state = "lapsed" if self.lapsed() else "expires"
        return (
            f"{self.holder} ({self.purpose}) since {self.since}, last renewed {self.renewed}, "
            f"lease {state} {self.lapses}"
        )


def present(s3: Any, bucket: str, key: str) -> bool:
    """Whether ``key`` exists, by a listing of ``key`` as the prefix (the key itself sorts first).

    Not by a GET or HEAD of it: AWS answers those 404 for a missing key only to a caller it allows
    ``s3:ListBucket`` on the bucket as such, and 403 to one whose listing is conditioned on
    ``s3:prefix`` (the deploy and host roles: the request of a GET carries no prefix). A listing
    with ``Prefix`` set is what those roles are allowed, and answers the same on AWS and on moto.
    """
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
    return bool(listed) and listed[0]["Key"] == key


def get_if_present(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """``get_object`` of ``key``, or None where it does not exist (see :func:`present`).

    A key removed between the listing and the GET (a lock released meanwhile) answers NoSuchKey
    where the caller may list the bucket as such, AccessDenied where it may not: the first is read
    as absent, the second raised, never guessed to mean absent.
    """
    if not present(s3, bucket, key):
        return None
    try:
        found: dict[str, Any] = s3.get_object(Bucket=bucket, Key=key)
        return found
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise


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
        lease_s: float = DEFAULT_LEASE_S,
        renew_every_s: float = RENEW_EVERY_S,
    ) -> None:
        self.s3 = s3
        self.lease_s = lease_s
        self.renew_every_s = renew_every_s
        self.bucket = bucket
        self.prefix = (prefix or f"history/{stack}/").rstrip("/") + "/"
        # Artifacts are the stack's, shared by its model pools (each pool keeps its own releases).
        self.artifacts_prefix = (artifacts_prefix or self.prefix).rstrip("/") + "/"
        self.stack = stack

    def ensure_bucket(self) -> None:
        """Create the bucket where it does not exist (an unchecked moto in tests; the local stack's
        ``up`` and a cloud stack's Pulumi program create it as their administrator).

        Probed by listing under the stack's prefix, never HeadBucket: AWS authorises HeadBucket as
        ``s3:ListBucket`` with no ``s3:prefix`` in the request, which the deploy role's
        prefix-conditioned listing does not allow.
        """
        try:
            self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
            return
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "NoSuchBucket":
                raise
        try:
            self.s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    # --- objects ----------------------------------------------------------------------------------

    def _put(self, key: str, body: bytes | str, *, root: str | None = None, **kwargs: Any) -> dict[str, Any]:
        data = body.encode() if isinstance(body, str) else body
        answer: dict[str, Any] = self.s3.put_object(
            Bucket=self.bucket, Key=(root or self.prefix) + key, Body=data, **kwargs
        )
        return answer

    def _get(self, key: str, *, root: str | None = None) -> bytes | None:
        found = get_if_present(self.s3, self.bucket, (root or self.prefix) + key)
        return None if found is None else found["Body"].read()

    def _read(self, key: str) -> bytes:
        """A key a listing under the prefix has just shown (no existence check of its own)."""
        data: bytes = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        return data

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
        if release.signature and self._get(base + SIGNATURE_NAME) != release.signature.encode():
            # Before the manifest check: a release stored unsigned (or by an earlier key) gets this one.
            self._put(base + SIGNATURE_NAME, release.signature)
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
            files[key[len(base + "files/") :]] = self._read(key).decode()
        signature = self._get(base + SIGNATURE_NAME)
        return release_from_manifest(manifest.decode(), files, signature.decode() if signature else "")

    # --- history ----------------------------------------------------------------------------------

    def append(self, record: dict[str, Any]) -> str:
        key = f"records/{record['started_at'].replace(':', '')}-{record['kind']}-{record.get('release', 'none')}.json"
        self._put(key, json.dumps(record, indent=2, sort_keys=True) + "\n", IfNoneMatch="*")
        return key

    def records(self) -> list[dict[str, Any]]:
        """Every deploy and rollback of the stack, oldest first."""
        out: list[dict[str, Any]] = []
        for key in self._keys("records/"):
            body = self._read(key)
            if body:
                out.append(json.loads(body))
        return sorted(out, key=lambda r: r["started_at"])

    def last_good(self, *, excluding: str | None = None) -> dict[str, Any] | None:
        record: dict[str, Any]  # mypy reads reversed() of a list as Any
        for record in reversed(self.records()):
            if record["outcome"] == "succeeded" and record.get("release") != excluding:
                return record
        return None

    # --- the deploy lock --------------------------------------------------------------------------

    LOCK = "lock/deploy.json"

    def read_lock(self) -> LockInfo | None:
        obj = get_if_present(self.s3, self.bucket, self.prefix + self.LOCK)
        if obj is None:
            return None
        data = json.loads(obj["Body"].read())
        return LockInfo(
            data["holder"],
            data["since"],
            data["expires"],
            data.get("purpose", ""),
            obj["ETag"],
            renewed=data.get("renewed", ""),
            lease_until=data.get("lease_until", ""),
            token=data.get("token", ""),
        )

    def acquire(
        self, purpose: str, *, ttl_s: float = DEFAULT_LOCK_TTL_S, holder: str | None = None
    ) -> LockInfo:
        """Take the stack's deploy lock with a conditional put (If-None-Match: *); a lapsed lock
        (its lease not renewed in time, or past ``ttl_s``) is replaced, and named in ``replaced``."""
        start = now()
        info = LockInfo(
            holder or operator(),
            iso(start),
            iso(start + dt.timedelta(seconds=ttl_s)),
            purpose,
            renewed=iso(start),
            lease_until=iso(start + dt.timedelta(seconds=self.lease_s)),
            token=uuid.uuid4().hex,
        )
        replaced = ""
        for _ in range(3):
            try:
                put = self._put(self.LOCK, info.body(), IfNoneMatch="*")
                return dataclasses.replace(info, etag=put["ETag"], replaced=replaced)
            except ClientError as exc:
                if exc.response["Error"]["Code"] not in ("PreconditionFailed", "ConditionalRequestConflict"):
                    raise
            current = self.read_lock()
            if current is None:
                continue  # released between our put and our read: try again
            if not current.lapsed():
                raise LockHeld(
                    f"stack {self.stack!r} is locked by another deploy: {current.describe()}; wait for it, "
                    f"or break a dead lock with `fab unlock -s {self.stack}`"
                )
            self._delete_lock(current.etag)  # lapsed: only the exact lapsed object is removed
            replaced = current.describe()
        raise LockHeld(f"stack {self.stack!r}: could not take the deploy lock (contended)")

    def renew(self, lock: LockInfo) -> LockInfo:
        """Extend ``lock``'s lease by ``lease_s`` from now, only if the stored lock is still the very
        object ``lock`` last wrote (If-Match on its ETag): a renewal never overwrites a lock someone
        else took, even one taken after ours lapsed. Raises LockLost, naming why, when it is not."""
        at = now()
        renewed = dataclasses.replace(
            lock, renewed=iso(at), lease_until=iso(at + dt.timedelta(seconds=self.lease_s)), replaced=""
        )
        try:
            put = self._put(self.LOCK, renewed.body(), IfMatch=lock.etag)
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code in ("NoSuchKey", "404"):
                raise LockLost(
                    f"the deploy lock of stack {self.stack!r} was removed while {lock.purpose} ran "
                    f"(`fab unlock`?)"
                ) from None
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                current = self.read_lock()
                taker = current.describe() if current else "nobody (removed since)"
                raise LockLost(
                    f"the deploy lock of stack {self.stack!r} was taken over while {lock.purpose} ran: "
                    f"now held by {taker}"
                ) from None
            raise
        return dataclasses.replace(renewed, etag=put["ETag"])

    def release_lock(self, lock: LockInfo) -> None:
        self._delete_lock(lock.etag)

    def break_lock(self) -> LockInfo | None:
        current = self.read_lock()
        if current is not None:
            self._delete_lock(current.etag)
        return current

    def _delete_lock(self, etag: str) -> None:
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=self.prefix + self.LOCK, IfMatch=etag)
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                raise

    @contextlib.contextmanager
    def leased(self, purpose: str, *, ttl_s: float = DEFAULT_LOCK_TTL_S) -> Iterator[Lease]:
        """Hold the deploy lock for the block, renewing its lease in the background."""
        lease = Lease(self, self.acquire(purpose, ttl_s=ttl_s))
        lease.start()
        try:
            yield lease
        finally:
            lease.stop()
            self.release_lock(lease.info)  # the latest renewal's ETag: someone else's lock stays

    @contextlib.contextmanager
    def locked(self, purpose: str, *, ttl_s: float = DEFAULT_LOCK_TTL_S) -> Iterator[LockInfo]:
        """:meth:`leased`, for a holder that only needs the lock as it was taken."""
        with self.leased(purpose, ttl_s=ttl_s) as lease:
            yield lease.info


class Lease:
    """A held deploy lock, renewed every ``store.renew_every_s`` by a daemon thread.

    The thread only records what it learns; the holder asks :meth:`check` before each step, so a
    deploy that lost its lock stops where it stands rather than at a random point in a thread.
    """

    def __init__(self, store: HistoryStore, info: LockInfo) -> None:
        self.store = store
        self.info = info
        self.lost: LockLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease {info.purpose}", daemon=True)
        self._guard = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        """Raise LockLost (once the renewer learned it) if the lock is no longer this holder's."""
        with self._guard:
            lost = self.lost
        if lost is not None:
            raise lost

    def _run(self) -> None:
        while not self._stop.wait(self.store.renew_every_s):
            try:
                info = self.store.renew(self.info)
            except LockLost as exc:
                self._lose(exc)
                return
            except Exception as exc:  # noqa: BLE001 - S3 unreachable or slow: try again next round
                if self.info.lapsed():
                    # Past our lease another deploy may take the lock: from here it is not ours.
                    self._lose(
                        LockLost(
                            f"the deploy lock of stack {self.store.stack!r} lapsed at {self.info.lapses}: "
                            f"its renewals failed ({type(exc).__name__}: {exc})"
                        )
                    )
                    return
                continue
            with self._guard:
                self.info = info

    def _lose(self, exc: LockLost) -> None:
        with self._guard:
            self.lost = exc


def stack_history(settings: Settings, model: str, s3: Any, bucket: str, prefix: str) -> HistoryStore:
    """The history of pool ``model`` of ``settings``' stack under ``prefix`` in ``bucket``.

    A stack of several models keeps each pool's releases, history and lock apart; the artifacts
    (runtime wheels and images) stay the stack's.
    """
    pool_prefix = pool_history_prefix(settings, model, prefix)
    return HistoryStore(s3, bucket, settings.stack, pool_prefix, artifacts_prefix=prefix)


def pool_history_prefix(settings: Settings, model: str, prefix: str) -> str:
    """Where pool ``model`` keeps its releases, records and lock under the stack's history ``prefix``:
    ``models/<model>/`` in a file that lists its models, the stack's own prefix otherwise. Deploys
    write there and its hosts' node.env and principal name it, so none of them can drift apart."""
    return f"{prefix.rstrip('/')}/models/{model}/" if settings.listed_models else prefix
