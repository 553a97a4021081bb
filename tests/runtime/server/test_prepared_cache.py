"""The prepared-weights cache in S3: keyed by the weights' content x the engine, published by the first
host once it is ready, fetched and hash-verified by the next one (which maps it and packs nothing),
refused and rebuilt when its bytes or its spec do not match; and the same on one host for a local
weights directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import boto3
import pytest
import yaml
from frontier_runtime.config import RuntimeConfig, parse_config
from frontier_runtime.models.llama import prepared as layout
from frontier_runtime.models.llama.loader import load_model
from frontier_runtime.server import warm_start
from frontier_runtime.server.serve import build_engine
from frontier_runtime.storage import prepared as cache
from frontier_runtime.storage import prepared_eviction as eviction
from frontier_runtime.storage.manifest import MANIFEST_NAME, Manifest, ManifestEntry, build_manifest
from moto import mock_aws
from server_harness import MODEL, push_weights, weights_start_document

BUCKET = "frontier-prepared"
SOURCE = f"s3://{BUCKET}/tiny"
SHARD = layout.SHARD_NAME.format(0)
SPEC = '{"device": "cpu:x86_64:avx512:panel", "dtype": "auto"}'


def _manifest(*files: tuple[str, int, str], created_at: str = "") -> Manifest:
    return Manifest("m", "v1", tuple(ManifestEntry(*f) for f in files), created_at=created_at)


def test_the_key_follows_the_weights_content_and_the_engine_not_when_they_were_pushed() -> None:
    weights = _manifest(("model.safetensors", 10, "a" * 64), created_at="2026-01-01")
    same_bytes_later = _manifest(("model.safetensors", 10, "a" * 64), created_at="2026-02-02")
    other_bytes = _manifest(("model.safetensors", 10, "b" * 64))
    key = cache.cache_key(cache.weights_digest(weights), SPEC)
    assert cache.cache_key(cache.weights_digest(same_bytes_later), SPEC) == key
    assert cache.cache_key(cache.weights_digest(other_bytes), SPEC) != key
    other_cpu = SPEC.replace("avx512:panel", "avx2:plain")
    assert cache.cache_key(cache.weights_digest(weights), other_cpu) != key


def test_the_engine_half_of_the_key_names_the_runtime_device_and_settings(tiny_model: Path) -> None:
    spec = json.loads(warm_start.engine_spec(_config(str(tiny_model), Path("unused"))))
    assert spec["runtime"] == layout.runtime_identity()
    assert spec["device"].startswith("cpu:")
    assert (spec["dtype"], spec["quantization"], spec["ranks"]) == ("float32", "none", 1)  # the settings


def _config(weights_uri: str, cache_dir: Path) -> RuntimeConfig:
    return parse_config(yaml.safe_dump(weights_start_document(weights_uri, cache_dir)))


@pytest.fixture
def pushed(tiny_model: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        push_weights(s3, tiny_model, BUCKET)
        yield s3


def _start(config: RuntimeConfig) -> tuple[cache.ModelSource, Path]:
    """One start as serve makes it, through the publish it runs once ready; the directory it loaded."""
    source = warm_start.model_source(config, lambda phase, seconds: None)
    loaded: list[Path] = []

    def recording_build(config: RuntimeConfig, model_dir: Path):  # noqa: ANN202
        loaded.append(model_dir)
        return build_engine(config, model_dir)

    engine, after_ready = warm_start.build(config, source, recording_build)
    try:
        engine.warmup()
        if after_ready is not None:
            after_ready()
    finally:
        engine.shutdown()
    return source, loaded[-1]


def _prepared_keys(s3) -> list[str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="tiny/v1/prepared/").get("Contents", [])
    return sorted(o["Key"].split("/", 4)[-1] for o in listed)


def test_a_miss_loads_the_checkpoint_and_publishes_what_it_prepared_once_ready(
    pushed, tmp_path: Path
) -> None:
    source, loaded = _start(_config(SOURCE, tmp_path / "host-a"))
    assert not source.hit and list(loaded.glob("model*.safetensors"))
    published = _prepared_keys(pushed)
    assert {MANIFEST_NAME, layout.PREPARED_NAME, SHARD, "config.json", "tokenizer.json"} <= set(published)
    assert not [name for name in published if name.startswith("model")]  # not the checkpoint again


def test_the_next_host_fetches_the_prepared_directory_instead_of_the_checkpoint(
    pushed, tmp_path: Path
) -> None:
    _start(_config(SOURCE, tmp_path / "host-a"))
    source, loaded = _start(_config(SOURCE, tmp_path / "host-b"))
    assert source.hit and loaded == source.model_dir
    assert (loaded / layout.PREPARED_NAME).is_file() and not list(loaded.glob("model*.safetensors"))
    (report,) = source.reports
    assert report.bytes_downloaded == sum(
        f.stat().st_size for f in loaded.iterdir() if not f.name.startswith(".") and f.name != MANIFEST_NAME
    )
    assert not (tmp_path / "host-b").joinpath(BUCKET, "tiny", "v1", "model.safetensors").exists()


def test_a_prepared_object_whose_bytes_fail_their_hash_is_refused_and_the_checkpoint_loaded(
    pushed, tmp_path: Path
) -> None:
    first, _ = _start(_config(SOURCE, tmp_path / "host-a"))
    key = f"tiny/v1/prepared/{first.key}/{SHARD}"
    body = bytearray(pushed.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[-1] ^= 0xFF
    pushed.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    source, loaded = _start(_config(SOURCE, tmp_path / "host-b"))
    assert not source.hit and list(loaded.glob("model*.safetensors"))
    again, _ = _start(_config(SOURCE, tmp_path / "host-c"))  # the refusing host published it anew
    assert again.hit


def test_a_prepared_file_made_for_another_engine_is_refused_and_rebuilt(pushed, tmp_path: Path) -> None:
    first, _ = _start(_config(SOURCE, tmp_path / "host-a"))
    staged = tmp_path / "forged"
    staged.mkdir()
    original = first.staging
    assert original is not None
    spec = dataclasses.replace(layout.read_spec(original), device="cpu:x86_64:avx2:plain")
    checkpoint = tmp_path / "host-a" / BUCKET / "tiny" / "v1"
    layout.save_prepared(load_model(checkpoint), staged, spec)
    prefix = f"tiny/v1/prepared/{first.key}"
    manifest = json.loads(pushed.get_object(Bucket=BUCKET, Key=f"{prefix}/{MANIFEST_NAME}")["Body"].read())
    forged = {e.path: dataclasses.asdict(e) for e in build_manifest(staged, model=MODEL, version="v").files}
    manifest["files"] = [forged.get(f["path"], f) for f in manifest["files"]]
    for name in forged:  # the index and shards of the other engine, hashed as such: the fetch passes
        pushed.upload_file(str(staged / name), BUCKET, f"{prefix}/{name}")
    pushed.put_object(Bucket=BUCKET, Key=f"{prefix}/{MANIFEST_NAME}", Body=json.dumps(manifest).encode())
    source, loaded = _start(_config(SOURCE, tmp_path / "host-b"))
    assert source.hit and list(loaded.glob("model*.safetensors"))  # fetched, refused, checkpoint loaded
    again, loaded = _start(_config(SOURCE, tmp_path / "host-c"))
    assert again.hit and loaded == again.model_dir


def test_a_local_directory_is_prepared_on_the_first_start_and_mapped_on_the_next(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = _config(str(tiny_model), tmp_path / "cache")
    first, loaded = _start(config)
    assert not first.hit and loaded == tiny_model
    second, loaded = _start(config)
    assert second.hit and (loaded / layout.PREPARED_NAME).is_file()
    assert loaded == tmp_path / "cache" / cache.LOCAL_PREPARED_DIR / second.key


def test_with_s3_unreachable_a_host_restarts_from_its_verified_prepared_directory(
    pushed, tmp_path: Path
) -> None:
    _start(_config(SOURCE, tmp_path / "host-a"))
    hit, _ = _start(_config(SOURCE, tmp_path / "host-b"))  # host-b never fetched the checkpoint
    for listed in pushed.list_objects_v2(Bucket=BUCKET)["Contents"]:  # the bucket answers nothing now
        pushed.delete_object(Bucket=BUCKET, Key=listed["Key"])
    again, loaded = _start(_config(SOURCE, tmp_path / "host-b"))
    assert again.hit and again.key == hit.key and loaded == hit.model_dir
    assert again.reports[0].offline


def test_the_host_that_published_restarts_from_its_copy_without_hashing_it_again(
    pushed, tmp_path: Path
) -> None:
    config = _config(SOURCE, tmp_path / "host-a")
    _start(config)  # a miss: prepares, publishes, keeps its copy
    again, loaded = _start(config)
    assert again.hit and loaded == again.model_dir
    (report,) = again.reports
    assert report.files_rehashed == [] and report.bytes_downloaded == 0
    assert set(report.files_reused) == set(_prepared_keys(pushed)) - {MANIFEST_NAME}


def test_the_published_copy_is_one_of_the_hosts_prepared_entries_the_budget_counts(
    pushed, tmp_path: Path
) -> None:
    source, _ = _start(_config(SOURCE, tmp_path / "host-a"))
    assert [e.path for e in eviction.entries(tmp_path / "host-a")] == [source.staging]
