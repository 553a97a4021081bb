"""``fab restore``'s library: the history brought back from its bucket's object versions or from a
backup copy, keys that exist now kept unless forced, and a clear refusal when nothing can be restored.

Against moto in-process (S3 versioning and delete markers behave as AWS's here); the backup copy is
a second versioned bucket written as replication writes it (same keys, same bodies), because moto
keeps a replication configuration but copies nothing.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import boto3
import pytest
import yaml
from moto import mock_aws

from frontier.errors import StackError
from frontier.release.history import HistoryStore, iso, now
from frontier.release.restore import (
    HistorySource,
    RestoreError,
    backup_bucket_name,
    history_source,
    metering_target,
    parse_at,
    restore,
    restore_metering,
)
from frontier.targets import load_stack

BUCKET = "frontier-test-history-123456789012-us-east-1"
BACKUP = "frontier-test-history-backup-123456789012-us-west-2"


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        for bucket in (BUCKET, BACKUP):
            client.create_bucket(Bucket=bucket)
            client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        yield client


@pytest.fixture
def store(s3):
    return HistoryStore(s3, BUCKET, "test")


def record(release: str, minute: int) -> dict:
    started = dt.datetime(2026, 1, 1, 12, minute, tzinfo=dt.UTC)
    return {"kind": "deploy", "release": release, "outcome": "succeeded", "started_at": iso(started)}


def delete_prefix(s3, bucket: str, prefix: str) -> None:
    """What a careless `aws s3 rm --recursive` does in a versioned bucket: a delete marker per key."""
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})


def versions_source(store: HistoryStore) -> HistorySource:
    return HistorySource("version", store.s3, store.bucket, store.prefix)


def test_a_deleted_history_comes_back_from_its_versions(store, s3):
    store.append(record("r-000000000001", 1))
    store.append(record("r-000000000002", 2))
    delete_prefix(s3, BUCKET, store.prefix)
    assert store.records() == []
    rows = restore(store, versions_source(store))
    assert {r.outcome for r in rows} == {"restored"} and len(rows) == 2
    assert [r["release"] for r in store.records()] == ["r-000000000001", "r-000000000002"]


def test_keys_present_now_are_kept_and_reported(store, s3):
    store.append(record("r-000000000001", 1))
    store.append(record("r-000000000002", 2))
    s3.delete_object(Bucket=BUCKET, Key=store.prefix + store._keys("records/")[0])
    rows = {r.key: r.outcome for r in restore(store, versions_source(store))}
    assert sorted(rows.values()) == ["present", "restored"]


def test_an_object_written_after_the_restore_point_is_kept_unless_forced(store, s3):
    s3.put_object(Bucket=BUCKET, Key=store.prefix + "releases/r/release.json", Body=b"old")
    time.sleep(1.1)  # S3's times are to the second
    at = now()
    time.sleep(1.1)
    s3.put_object(Bucket=BUCKET, Key=store.prefix + "releases/r/release.json", Body=b"new")
    kept = restore(store, versions_source(store), at=at)
    assert [r.outcome for r in kept] == ["newer"]
    assert s3.get_object(Bucket=BUCKET, Key=store.prefix + "releases/r/release.json")["Body"].read() == b"new"
    forced = restore(store, versions_source(store), at=at, force=True)
    assert [r.outcome for r in forced] == ["replaced"]
    assert s3.get_object(Bucket=BUCKET, Key=store.prefix + "releases/r/release.json")["Body"].read() == b"old"


def test_the_deploy_lock_is_never_restored_and_is_free_afterwards(store, s3):
    store.append(record("r-000000000001", 1))
    with store.locked("deploy"):
        pass
    lock = store.acquire("a deploy that died")
    delete_prefix(s3, BUCKET, store.prefix)
    rows = restore(store, versions_source(store))
    assert HistoryStore.LOCK not in {r.key for r in rows}
    assert store.read_lock() is None and lock.holder  # the dead deploy's lease stays gone


def test_nothing_to_restore_is_refused_naming_the_source(store, s3):
    store.append(record("r-000000000001", 1))
    delete_prefix(s3, BUCKET, store.prefix)
    with pytest.raises(
        RestoreError, match=rf"nothing to restore for stack 'test'.*s3://{BUCKET}/history/test/"
    ):
        restore(store, versions_source(store), at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    assert store.records() == []  # and nothing was written


def test_a_history_comes_back_from_the_backup_copy(store, s3):
    store.append(record("r-000000000001", 1))
    for key in store._keys(""):
        body = s3.get_object(Bucket=BUCKET, Key=store.prefix + key)["Body"].read()
        s3.put_object(Bucket=BACKUP, Key=store.prefix + key, Body=body)
    delete_prefix(s3, BUCKET, store.prefix)
    rows = restore(store, HistorySource("backup", s3, BACKUP, store.prefix))
    assert [r.outcome for r in rows] == ["restored"]
    assert [r["release"] for r in store.records()] == ["r-000000000001"]


def test_the_backup_bucket_is_named_after_the_history_bucket_in_the_backup_region():
    assert backup_bucket_name(BUCKET, "us-east-1", "us-west-2") == BACKUP


def test_a_stack_without_a_backup_region_refuses_restore_from_backup(store):
    settings = load_stack("local")
    with pytest.raises(
        RestoreError, match=r"keeps no backup copy \(backup.region is unset\).*--from version"
    ):
        history_source(settings, store, "backup")


def test_an_unknown_source_and_a_bad_time_are_refused_naming_the_option(store):
    settings = load_stack("local")
    with pytest.raises(RestoreError, match=r"--from = 'tape': must be one of version, backup"):
        history_source(settings, store, "tape")
    with pytest.raises(RestoreError, match=r"--at = 'yesterday': not a time"):
        parse_at("yesterday")
    assert parse_at("2026-12-07T02:00:00").tzinfo == dt.UTC


def test_the_gateways_metering_records_come_back_from_their_versions(s3):
    metering = HistorySource("version", s3, BUCKET, "metering/")
    for n in range(3):
        s3.put_object(Bucket=BUCKET, Key=f"metering/2026/12/07/record-{n}.jsonl", Body=b"{}\n")
    delete_prefix(s3, BUCKET, "metering/")
    rows = restore_metering(metering, metering)
    assert [r.outcome for r in rows] == ["restored"] * 3
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="metering/")["Contents"]
    assert len(listed) == 3


def test_metering_kept_outside_s3_is_refused_naming_the_setting(s3):
    settings = load_stack("local")
    with pytest.raises(RestoreError, match=r"gateway.metering.uri = '.*' is not in S3"):
        metering_target(settings, s3)


def test_the_local_stack_refuses_a_backup_region_it_could_not_fill(tmp_path):
    document = yaml.safe_load(Path(load_stack("local").source).read_text())
    document["config"]["frontier:backup"] = {"region": "us-west-2"}
    path = tmp_path / "Pulumi.local.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(StackError, match=r"backup.region = 'us-west-2': the local stack has no second region"):
        load_stack("local", path=path)
