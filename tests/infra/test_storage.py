"""Buckets: weights and history private, versioned, KMS-encrypted, TLS-only; ALB logs delivered."""

from __future__ import annotations

import json

import pytest
from infra_mocks import ACCOUNT_ID, ELB_ACCOUNTS

BUCKET = "aws:s3/bucket:Bucket"


def bucket(graph, purpose):
    [found] = [b for b in graph.of_type(BUCKET) if b.inputs["tags"]["frontier:purpose"] == purpose]
    return found


def config(graph, kind, purpose):
    """The one configuration resource of ``kind`` (e.g. ``Versioning``) for the bucket with ``purpose``."""
    typ = f"aws:s3/bucket{kind}:Bucket{kind}"
    name = bucket(graph, purpose).outputs["bucket"]
    [found] = [c.inputs for c in graph.of_type(typ) if c.inputs["bucket"] == name]
    return found


def bucket_policy(graph, purpose):
    return json.loads(config(graph, "Policy", purpose)["policy"])


DATA = ["weights", "history"]
ALL = ["weights", "history", "access-logs"]


def test_weights_bucket_is_the_one_the_model_uri_names(graph):
    assert f"s3://{bucket(graph, 'weights').inputs['bucket']}/" in graph.settings.model.weights_uri + "/"


@pytest.mark.parametrize("purpose", DATA)
def test_data_buckets_are_versioned(graph, purpose):
    assert config(graph, "Versioning", purpose)["versioningConfiguration"] == {"status": "Enabled"}


@pytest.mark.parametrize("purpose", DATA)
def test_data_buckets_are_encrypted_with_the_stacks_kms_key(graph, purpose):
    [rule] = config(graph, "ServerSideEncryptionConfiguration", purpose)["rules"]
    assert rule["applyServerSideEncryptionByDefault"] == {
        "sseAlgorithm": "aws:kms",
        "kmsMasterKeyId": graph.outputs["kms_key_arn"],
    }
    assert rule["bucketKeyEnabled"] is True


def test_the_log_bucket_uses_s3_managed_keys_because_alb_log_delivery_requires_them(graph):
    [rule] = config(graph, "ServerSideEncryptionConfiguration", "access-logs")["rules"]
    assert rule["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "AES256"}


@pytest.mark.parametrize("purpose", ALL)
def test_buckets_block_all_public_access_and_ignore_acls(graph, purpose):
    block = config(graph, "PublicAccessBlock", purpose)
    assert all(
        block[k] is True
        for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )
    assert config(graph, "OwnershipControls", purpose)["rule"] == {"objectOwnership": "BucketOwnerEnforced"}


@pytest.mark.parametrize("purpose", ALL)
def test_bucket_policies_refuse_requests_without_tls(graph, purpose):
    arn = bucket(graph, purpose).outputs["arn"]
    [deny] = [s for s in bucket_policy(graph, purpose)["Statement"] if s["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Principal"] == "*" and set(deny["Resource"]) == {arn, f"{arn}/*"}


def test_data_bucket_policies_grant_nothing(graph):
    for purpose in DATA:
        assert [s["Effect"] for s in bucket_policy(graph, purpose)["Statement"]] == ["Deny"]


@pytest.mark.parametrize(("purpose", "days"), [("weights", 30), ("history", 365)])
def test_old_versions_expire_and_abandoned_uploads_are_aborted(graph, purpose, days):
    rules = {r["id"]: r for r in config(graph, "LifecycleConfiguration", purpose)["rules"]}
    assert rules["expire-noncurrent-versions"]["noncurrentVersionExpiration"] == {"noncurrentDays": days}
    assert rules["abort-incomplete-uploads"]["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 7}


@pytest.mark.parametrize("purpose", DATA)
def test_data_bucket_access_is_logged_to_the_log_bucket(graph, purpose):
    logging = config(graph, "Logging", purpose)
    assert logging["targetBucket"] == bucket(graph, "access-logs").outputs["bucket"]


def test_only_the_regions_elb_account_may_write_alb_logs_and_only_under_its_prefix(graph):
    statements = {s["Sid"]: s for s in bucket_policy(graph, "access-logs")["Statement"]}
    elb = statements["ElbAccountWritesAccessLogs"]
    assert elb["Principal"] == {"AWS": f"arn:aws:iam::{ELB_ACCOUNTS[graph.settings.region]}:root"}
    assert elb["Action"] == "s3:PutObject"
    assert elb["Resource"].endswith(f"/alb/AWSLogs/{ACCOUNT_ID}/*")


def test_the_history_location_is_a_prefix_of_its_own_bucket(graph):
    assert graph.outputs["history_bucket"] == bucket(graph, "history").outputs["bucket"]
    assert graph.outputs["history_prefix"] == f"history/{graph.stack}/"


def test_buckets_are_never_force_destroyed(graph):
    assert all(b.inputs["forceDestroy"] is False for b in graph.of_type(BUCKET))
