"""Restoring a stack's history: from the S3 object versions of its history bucket, or from its
backup copy in a second region.

Where the copies come from. Every history bucket is versioned: a deleted or overwritten object keeps
its earlier versions (for ``HISTORY_NONCURRENT_DAYS``, infra/foundation.py), so a prefix deleted by
mistake comes back from the bucket itself (``--from version``, the default). A stack with
``backup.region`` set has its history bucket (and its own metering bucket) replicated to a bucket in
that region by S3 Cross-Region Replication (infra/backup.py), which protects against what versions
cannot: the region, the bucket or its key lost (``--from backup``). Delete markers are not
replicated, so the backup keeps what a deletion removed from the history.

How a key is restored. For each key under the stack's history prefix in the source, the version to
restore is its newest version that is not a delete marker; with ``--at``, the key as it was then
(nothing, where it was deleted or not yet written at that time). The
version is read and written back as the key's current object with an ordinary GET and PUT (never by
deleting delete markers: the deploy role holds no right to delete a version, and the deletion itself
stays in the bucket's versions as evidence). A key that exists in the history now is never replaced
unless ``force``: it is reported as ``present`` (the restore point's own version, or an object no
newer than it) or ``newer`` (written after the restore point). The deploy lock is never restored: a
restored lease would hold off every deploy until it lapsed; the restore itself runs under the lock.

The result is one :class:`Restored` row per key; :func:`restore` refuses, naming the source, when
the source holds nothing to restore at all. :func:`restore_metering` does the same for the
gateway's metering records in S3 (``gateway.metering.uri``), whose bucket is versioned and
replicated as the history's is.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any, Literal

from frontier import aws
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.release.history import HistoryStore

Source = Literal["version", "backup"]
SOURCES: tuple[Source, ...] = ("version", "backup")
#: The deploy lock's key under a history prefix (never restored: see the module's docstring).
LOCK_KEY = HistoryStore.LOCK

Outcome = Literal["restored", "replaced", "present", "newer"]


class RestoreError(FrontierError):
    """Nothing can be restored from the source named, or the restore was asked wrongly."""


@dataclasses.dataclass(frozen=True)
class Version:
    """One version of one key in a source: its key relative to the prefix, when it was written,
    and whether it is a delete marker."""

    key: str
    version_id: str
    modified: dt.datetime
    deleted: bool
    #: The key's current version (or marker) in its bucket, as S3 says (IsLatest).
    latest: bool = False
    size: int = 0


@dataclasses.dataclass(frozen=True)
class Restored:
    """What :func:`restore` did with one key."""

    key: str
    outcome: Outcome
    version_id: str
    modified: dt.datetime
    size: int


@dataclasses.dataclass(frozen=True)
class HistorySource:
    """Where the copies are read from: a versioned bucket (the history's own, or its backup) and the
    prefix the stack's history has there (the same prefix in both: replication keeps keys)."""

    kind: Source
    s3: Any
    bucket: str
    prefix: str

    def describe(self) -> str:
        what = "object versions of" if self.kind == "version" else "backup copy in"
        return f"the {what} s3://{self.bucket}/{self.prefix}"


def backup_bucket_name(history_bucket: str, region: str, backup_region: str) -> str:
    """The backup bucket of ``history_bucket``: its name with ``-backup`` after the purpose and the
    backup region in place of the stack's (``frontier-prod-history-<account>-us-east-1`` →
    ``frontier-prod-history-backup-<account>-us-west-2``). infra/backup.py names it by this too."""
    stem = history_bucket.removesuffix(f"-{region}")
    if stem == history_bucket:
        raise RestoreError(
            f"history bucket {history_bucket!r} does not end in its region {region!r}: "
            "it is not one the stack's program made, so it has no backup bucket"
        )
    account = stem.rsplit("-", 1)
    if len(account) != 2:
        raise RestoreError(f"history bucket {history_bucket!r} names no account")
    return f"{account[0]}-backup-{account[1]}-{backup_region}"


def backup_key_alias(stack: str) -> str:
    """The alias of the backup region's key (infra/backup.py): the deploy role may decrypt with the
    key of that alias there, and only through S3 (frontier.identity.documents)."""
    return f"alias/frontier-{stack}-backup"


def versions(source: HistorySource, at: dt.datetime | None = None) -> Iterator[Version]:
    """Every version (and delete marker) under the source's prefix written at or before ``at``."""
    pages = source.s3.get_paginator("list_object_versions").paginate(
        Bucket=source.bucket, Prefix=source.prefix
    )
    for page in pages:
        for entry, deleted in [(v, False) for v in page.get("Versions", [])] + [
            (m, True) for m in page.get("DeleteMarkers", [])
        ]:
            modified: dt.datetime = entry["LastModified"]
            if at is not None and modified > at:
                continue
            yield Version(
                entry["Key"][len(source.prefix) :],
                entry["VersionId"],
                modified,
                deleted,
                bool(entry.get("IsLatest")),
                int(entry.get("Size", 0)),
            )


def latest(found: Iterator[Version]) -> dict[str, Version]:
    """Each key's current version or delete marker, as S3 marks it (IsLatest)."""
    return {version.key: version for version in found if version.latest}


def newest_kept(found: Iterator[Version]) -> dict[str, Version]:
    """Each key's newest version that is not a delete marker (S3 lists a key's versions newest first)."""
    chosen: dict[str, Version] = {}
    for version in found:
        if not version.deleted and version.key not in chosen:
            chosen[version.key] = version
    return chosen


def as_at(found: Iterator[Version]) -> dict[str, Version]:
    """Each key's newest version or delete marker of those listed (the caller lists up to a time)."""
    chosen: dict[str, Version] = {}
    for version in found:
        kept = chosen.get(version.key)
        if kept is None or version.modified > kept.modified:
            chosen[version.key] = version
    return chosen


def restore_points(source: HistorySource, at: dt.datetime | None = None) -> dict[str, Version]:
    """For each key, the version to restore: where ``at`` is None its newest version that is not a
    delete marker (whatever deleted it since); else the key as it was at ``at``, which is nothing
    where a delete marker was its newest then, or it was not written yet."""
    chosen = newest_kept(versions(source)) if at is None else as_at(versions(source, at))
    return {
        key: version for key, version in sorted(chosen.items()) if not version.deleted and key != LOCK_KEY
    }


def restore(
    store: HistoryStore, source: HistorySource, *, at: dt.datetime | None = None, force: bool = False
) -> list[Restored]:
    """Bring the stack's history under ``store``'s prefix back from ``source`` (see the module's
    docstring), under the stack's deploy lock: one row per key the source holds, by key name."""
    target = HistorySource("version", store.s3, store.bucket, store.prefix)
    points = _points_or_refuse(f"stack {store.stack!r}", source, at)
    with store.locked("restore"):
        return _put_back(target, source, points, force)


def restore_metering(
    target: HistorySource, source: HistorySource, *, at: dt.datetime | None = None, force: bool = False
) -> list[Restored]:
    """The gateway's metering records under ``target`` back from ``source``, as :func:`restore`
    does the history's. No lock: the gateway only ever adds records, each under a key of its own."""
    points = _points_or_refuse(f"the metering of s3://{target.bucket}/{target.prefix}", source, at)
    return _put_back(target, source, points, force)


def _points_or_refuse(what: str, source: HistorySource, at: dt.datetime | None) -> dict[str, Version]:
    points = restore_points(source, at)
    if not points:
        when = f" at {at.isoformat()}" if at is not None else ""
        raise RestoreError(
            f"nothing to restore for {what}{when}: {source.describe()} holds no object "
            "(every key there is deleted, or none was written yet)"
        )
    return points


def _put_back(
    target: HistorySource, source: HistorySource, points: dict[str, Version], force: bool
) -> list[Restored]:
    current = {key: v for key, v in latest(versions(target)).items() if not v.deleted}
    rows = []
    for key, point in points.items():
        now = current.get(key)
        if now is not None and not force:
            # Replication keeps version ids, so the backup's copy of a key has the source's id.
            same = now.version_id == point.version_id
            outcome: Outcome = "newer" if now.modified > point.modified and not same else "present"
            rows.append(Restored(key, outcome, point.version_id, point.modified, point.size))
            continue
        body = source.s3.get_object(
            Bucket=source.bucket, Key=source.prefix + key, VersionId=point.version_id
        )["Body"].read()
        target.s3.put_object(Bucket=target.bucket, Key=target.prefix + key, Body=body)
        outcome = "restored" if now is None else "replaced"
        rows.append(Restored(key, outcome, point.version_id, point.modified, len(body)))
    return rows


def parse_at(text: str) -> dt.datetime:
    """``--at``: an ISO 8601 time; one without a zone is UTC."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise RestoreError(
            f"--at = {text!r}: not a time; write it ISO 8601, e.g. 2026-12-07T02:00:00Z"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def history_source(settings: Settings, store: HistoryStore, kind: str) -> HistorySource:
    """The source ``--from`` names for the stack whose history is ``store``."""
    return source_of(settings, HistorySource("version", store.s3, store.bucket, store.prefix), kind)


def source_of(settings: Settings, target: HistorySource, kind: str) -> HistorySource:
    """The source ``--from`` names for ``target`` (a prefix of one of the stack's versioned buckets):
    its own versions, or the same prefix of its bucket's backup copy in ``backup.region``."""
    if kind not in SOURCES:
        raise RestoreError(f"--from = {kind!r}: must be one of {', '.join(SOURCES)}")
    if kind == "version":
        return target
    if not settings.backup.region:
        raise RestoreError(
            f"stack {settings.stack!r} keeps no backup copy (backup.region is unset): restore from the "
            f"bucket's object versions with --from version"
        )
    bucket = backup_bucket_name(target.bucket, settings.region, settings.backup.region)
    s3 = aws.client(settings, "s3", region=settings.backup.region)
    return HistorySource("backup", s3, bucket, target.prefix)


def metering_target(settings: Settings, s3: Any) -> HistorySource:
    """Where the stack's gateway keeps its metering records in S3 (``gateway.metering.uri``)."""
    uri = settings.gateway.metering.uri if settings.gateway is not None else ""
    if not uri.startswith("s3://"):
        raise RestoreError(
            f"stack {settings.stack!r}: gateway.metering.uri = {uri!r} is not in S3, so no copy of its "
            "metering exists to restore (only an s3:// metering location is versioned and replicated)"
        )
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    return HistorySource("version", s3, bucket, f"{prefix}/" if prefix else "")
