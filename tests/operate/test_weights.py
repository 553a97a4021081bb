"""weights.push: multipart uploads with SHA-256 checksums, identical files skipped, manifest last."""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from moto import mock_aws

from frontier.release.weights import WeightsError, push

URI = "s3://frontier-test-weights/tiny"
SMALL_PARTS = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="frontier-test-weights")
        yield client


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"hidden_size": 8}')
    (d / "sub" / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(os.urandom(11 * 1024 * 1024))  # three 5 MiB parts
    return d


def test_a_push_uploads_every_file_with_checksums_and_writes_the_manifest(s3, model):
    sent: list[int] = []
    report = push(s3, model, URI, "tiny", "v1", progress=lambda _p, n: sent.append(n), transfer=SMALL_PARTS)

    assert sorted(report.uploaded) == ["config.json", "model.safetensors", "sub/tokenizer.json"]
    assert report.manifest_written and sum(sent) == sum(
        p.stat().st_size for p in model.rglob("*") if p.is_file()
    )
    big = s3.get_object(
        Bucket="frontier-test-weights", Key="tiny/v1/model.safetensors", ChecksumMode="ENABLED"
    )
    assert big["ChecksumSHA256"].endswith("-3")  # a multipart object: one SHA-256 per part
    manifest = json.loads(
        s3.get_object(Bucket="frontier-test-weights", Key="tiny/v1/manifest.json")["Body"].read()
    )
    assert {f["path"] for f in manifest["files"]} == set(report.uploaded)


def test_pushing_the_same_model_again_uploads_nothing(s3, model):
    push(s3, model, URI, "tiny", "v1", transfer=SMALL_PARTS)
    again = push(s3, model, URI, "tiny", "v1", transfer=SMALL_PARTS)

    assert again.uploaded == [] and len(again.skipped) == 3
    assert again.bytes_uploaded == 0 and not again.manifest_written


def test_a_changed_model_under_an_existing_version_is_refused(s3, model):
    push(s3, model, URI, "tiny", "v1")
    (model / "config.json").write_text('{"hidden_size": 16}')

    with pytest.raises(WeightsError, match="immutable"):
        push(s3, model, URI, "tiny", "v1")
    report = push(s3, model, URI, "tiny", "v2")
    assert report.manifest_written and len(report.uploaded) == 3


def test_a_missing_source_directory_is_refused(s3, tmp_path):
    with pytest.raises(WeightsError, match="not a directory"):
        push(s3, tmp_path / "nope", URI, "tiny", "v1")
