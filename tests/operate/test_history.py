"""The history bucket: releases stored byte for byte, records in order, and the deploy lock."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from frontier.errors import FrontierError
from frontier.release.artifact import Artifact, ArtifactError, store_wheel
from frontier.release.history import HistoryStore, LockHeld, iso, now
from frontier.release.release import Release
from frontier.targets import backend_for, load_stack


@pytest.fixture
def store():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="frontier-test-history")
        yield HistoryStore(s3, "frontier-test-history", "test")


def record(kind: str, release: str, outcome: str, minute: int) -> dict:
    started = dt.datetime(2026, 1, 1, 12, minute, tzinfo=dt.UTC)
    return {"kind": kind, "release": release, "outcome": outcome, "started_at": iso(started)}


def test_a_stored_release_comes_back_byte_for_byte(store):
    release = Release(
        Artifact("sha256:" + "c" * 64, "wheel", "w-0.1-py3-none-any.whl", 1),
        {"runtime.yaml": "model:\n  name: x  # ünïcode\n", "frontier-runtime.service": "[Unit]\n"},
    )
    store.put_release(release)
    back = store.get_release(release.id)
    assert back.manifest() == release.manifest() and dict(back.files) == dict(release.files)


def test_records_come_back_oldest_first_and_the_last_good_release_is_found(store):
    store.append(record("deploy", "r-000000000002", "rolled_back", 2))
    store.append(record("deploy", "r-000000000001", "succeeded", 1))
    store.append(record("deploy", "r-000000000003", "succeeded", 3))
    assert [r["release"] for r in store.records()] == ["r-000000000001", "r-000000000002", "r-000000000003"]
    assert store.last_good()["release"] == "r-000000000003"
    assert store.last_good(excluding="r-000000000003")["release"] == "r-000000000001"


def test_an_unknown_digest_is_refused_with_how_to_build_it(store):
    with pytest.raises(ArtifactError, match="release.build"):
        store.get_artifact("sha256:" + "d" * 64)


def test_an_artifact_is_fetched_again_and_verified_when_the_local_copy_is_gone(store, tmp_path: Path):
    wheel = tmp_path / "frontier_runtime-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK wheel bytes")
    artifact, cached = store_wheel(wheel, tmp_path / "cache")
    store.put_artifact(artifact, cached)
    cached.unlink()
    assert store.get_artifact(artifact.digest) == artifact
    assert store.fetch_artifact(artifact, tmp_path / "cache").read_bytes() == b"PK wheel bytes"


def test_a_held_lock_refuses_a_second_deploy_naming_holder_and_time(store):
    held = store.acquire("deploy r-000000000001", holder="alice@laptop")
    with pytest.raises(LockHeld, match=r"alice@laptop \(deploy r-000000000001\) since 20\d\d-"):
        store.acquire("deploy r-000000000002", holder="bob@ci")
    store.release_lock(held)
    store.release_lock(store.acquire("deploy r-000000000002", holder="bob@ci"))
    assert store.read_lock() is None


def test_a_stale_lock_is_taken_over(store):
    # The lock is a lease now (test_deploy_lease.py: a holder that stops renewing lapses within it);
    # past ttl_s (lock_ttl_s, its horizon) it lapses as well, renewed or not, as a stale lock did.
    store.acquire("deploy r-000000000001", holder="crashed@host", ttl_s=-1)
    lock = store.acquire("deploy r-000000000002", holder="bob@ci")
    assert store.read_lock().holder == "bob@ci" and lock.expires > iso(now())


def test_releasing_someone_elses_lock_does_nothing(store):
    mine = store.acquire("deploy", holder="alice@laptop", ttl_s=-1)
    theirs = store.acquire("deploy", holder="bob@ci")  # took over the stale one
    store.release_lock(mine)
    assert store.read_lock().holder == "bob@ci"
    store.release_lock(theirs)


def test_a_cloud_stack_finds_its_history_in_the_saved_pulumi_outputs(saved_outputs):
    prod = load_stack("prod")
    saved_outputs.ec2(prod, history_bucket="frontier-prod-history-1a2b", history_prefix="history/prod/")
    with mock_aws():
        store = backend_for(prod).history_store()
    assert (store.bucket, store.prefix) == ("frontier-prod-history-1a2b", "history/prod/")


def test_a_cloud_stack_without_saved_outputs_says_how_to_save_them(tmp_path, monkeypatch):
    monkeypatch.setenv("FRONTIER_STACK_OUTPUTS", str(tmp_path / "missing.json"))
    with pytest.raises(FrontierError, match=r"pulumi stack output --json -s prod >"):
        backend_for(load_stack("prod")).history_store()
