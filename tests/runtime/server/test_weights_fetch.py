"""Weights fetch: S3 + manifest → verified local cache; a restart reuses it without downloading."""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import pytest
from frontier_runtime.storage.manifest import MANIFEST_NAME, build_manifest
from frontier_runtime.storage.weights import MARKER_NAME, WeightsError, cache_dir_for, fetch_weights
from moto import mock_aws

BUCKET = "weights-bucket"
SOURCE = f"s3://{BUCKET}/models/tiny"
VERSION = "v1"


def _model_files(root: Path) -> Path:
    src = root / "src"
    (src / "sub").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(300_000))
    (src / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (src / "sub" / "tokenizer.json").write_text('{"version": "1.0"}')
    return src


def _push(s3, src: Path, version: str = VERSION) -> None:
    manifest = build_manifest(src, model="tiny", version=version)
    for entry in manifest.files:
        s3.put_object(
            Bucket=BUCKET, Key=f"models/tiny/{version}/{entry.path}", Body=(src / entry.path).read_bytes()
        )
    s3.put_object(
        Bucket=BUCKET, Key=f"models/tiny/{version}/{MANIFEST_NAME}", Body=manifest.to_json().encode()
    )


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture
def pushed(s3, tmp_path: Path) -> Path:
    src = _model_files(tmp_path)
    _push(s3, src)
    return src


def _same_tree(a: Path, b: Path) -> None:
    for file in a.rglob("*"):
        if file.is_file():
            assert (b / file.relative_to(a)).read_bytes() == file.read_bytes(), file


def test_first_fetch_downloads_every_file_and_verifies_it(s3, pushed: Path, tmp_path: Path) -> None:
    report = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    assert sorted(report.files_downloaded) == ["config.json", "model.safetensors", "sub/tokenizer.json"]
    assert report.model_dir == cache_dir_for(SOURCE, VERSION, tmp_path / "cache")
    assert report.bytes_downloaded == sum(f.stat().st_size for f in pushed.rglob("*") if f.is_file())
    _same_tree(pushed, report.model_dir)
    assert (report.model_dir / MANIFEST_NAME).is_file()


def test_restart_reuses_the_verified_cache_without_downloading_or_rehashing(
    s3, pushed: Path, tmp_path: Path
) -> None:
    fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    again = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    assert again.files_downloaded == []
    assert again.files_rehashed == []
    assert again.bytes_downloaded == 0
    assert sorted(again.files_reused) == ["config.json", "model.safetensors", "sub/tokenizer.json"]


def test_a_corrupted_cached_file_is_detected_and_fetched_again(s3, pushed: Path, tmp_path: Path) -> None:
    model_dir = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3).model_dir
    target = model_dir / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[1000] ^= 0xFF  # same size, one flipped byte
    target.write_bytes(bytes(data))
    report = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    assert report.files_rehashed == ["model.safetensors"]
    assert report.files_downloaded == ["model.safetensors"]
    assert target.read_bytes() == (pushed / "model.safetensors").read_bytes()


def test_a_partial_cached_file_is_fetched_again(s3, pushed: Path, tmp_path: Path) -> None:
    model_dir = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3).model_dir
    target = model_dir / "model.safetensors"
    target.write_bytes(target.read_bytes()[:1234])
    report = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    assert report.files_downloaded == ["model.safetensors"]
    assert target.read_bytes() == (pushed / "model.safetensors").read_bytes()


def test_a_cache_without_marker_is_hashed_once_then_trusted(s3, pushed: Path, tmp_path: Path) -> None:
    model_dir = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3).model_dir
    (model_dir / MARKER_NAME).unlink()
    first = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    assert sorted(first.files_rehashed) == ["config.json", "model.safetensors", "sub/tokenizer.json"]
    assert first.files_downloaded == []
    second = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    assert second.files_rehashed == []


def test_a_remote_file_that_never_matches_its_checksum_stops_startup(
    s3, pushed: Path, tmp_path: Path
) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"models/tiny/{VERSION}/config.json", Body=b'{"tampered": true}')
    with pytest.raises(WeightsError) as err:
        fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    message = str(err.value)
    assert "'config.json'" in message and "after 2 download(s)" in message and "sha256" in message
    model_dir = cache_dir_for(SOURCE, VERSION, tmp_path / "cache")
    assert not (model_dir / "config.json").exists(), (
        "an unverified file must never appear under its real name"
    )
    assert not list(model_dir.rglob("*.partial-*"))


def test_a_missing_manifest_names_the_uri(s3, tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=rf"s3://{BUCKET}/models/tiny/v9/manifest.json"):
        fetch_weights(SOURCE, "v9", tmp_path / "cache", s3_client=s3)


def test_a_malformed_manifest_is_refused(s3, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"models/tiny/{VERSION}/{MANIFEST_NAME}", Body=b'{"format": "other"}')
    with pytest.raises(WeightsError, match="manifest format"):
        fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)


def test_leftovers_of_an_interrupted_download_are_removed(s3, pushed: Path, tmp_path: Path) -> None:
    model_dir = cache_dir_for(SOURCE, VERSION, tmp_path / "cache")
    model_dir.mkdir(parents=True)
    leftover = model_dir / "model.safetensors.partial-99999"
    leftover.write_bytes(b"half")
    fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    assert not leftover.exists()


def test_a_verified_cache_serves_when_s3_is_unreachable(s3, pushed: Path, tmp_path: Path) -> None:
    fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=s3)
    dead = boto3.client(
        "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9", config=_no_retries()
    )
    report = fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=dead)
    assert report.offline and report.files_downloaded == []


def test_unreachable_s3_and_no_cache_is_a_clear_error(tmp_path: Path) -> None:
    dead = boto3.client(
        "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9", config=_no_retries()
    )
    with pytest.raises(WeightsError, match="cannot read the weights manifest"):
        fetch_weights(SOURCE, VERSION, tmp_path / "cache", s3_client=dead)


def _no_retries():
    from botocore.config import Config

    return Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1, read_timeout=1)
