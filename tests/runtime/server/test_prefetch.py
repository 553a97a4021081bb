"""``frontier_runtime prefetch``: the host cache warmed with exactly what a start of the same config
reads, so that start downloads nothing: the prepared weights of its key where S3 holds them, else
the checkpoint. S3 is moto in process (the fetcher's boto3 calls are the real ones)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import yaml
from frontier_runtime.__main__ import main
from frontier_runtime.config import RuntimeConfig, parse_config
from frontier_runtime.server import warm_start
from frontier_runtime.server.serve import build_engine
from frontier_runtime.storage import prepared as cache
from moto import mock_aws
from server_harness import push_weights, weights_start_document

BUCKET = "frontier-prefetch"
SOURCE = f"s3://{BUCKET}/tiny"


def _config(weights_uri: str, cache_dir: Path) -> RuntimeConfig:
    return parse_config(yaml.safe_dump(_document(weights_uri, cache_dir)))


def _document(weights_uri: str, cache_dir: Path) -> dict:
    return {**weights_start_document(weights_uri, cache_dir), "json_logs": False}


@pytest.fixture
def pushed(tiny_model: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        push_weights(s3, tiny_model, BUCKET)
        yield s3


def _start(config: RuntimeConfig) -> cache.ModelSource:
    """One start as serve makes it, through the publish it runs once ready, to its shutdown."""
    source = warm_start.model_source(config, lambda phase, seconds: None)
    engine, after_ready = warm_start.build(config, source, build_engine)
    try:
        engine.warmup()
        if after_ready is not None:
            after_ready()
    finally:
        engine.shutdown()
        warm_start.let_go()
    return source


def test_with_prepared_weights_in_s3_the_prefetch_fetches_them_and_the_start_downloads_nothing(
    pushed, tmp_path: Path
) -> None:
    _start(_config(SOURCE, tmp_path / "first-host"))  # publishes the prepared weights once ready
    replacement = _config(SOURCE, tmp_path / "replacement")
    warmed = warm_start.prefetch(replacement)
    assert warmed["prepared"] is True and warmed["bytes_downloaded"] > 0
    started = _start(replacement)
    assert started.hit and started.key == warmed["key"]
    (report,) = started.reports
    assert (report.files_downloaded, report.bytes_downloaded) == ([], 0)
    assert str(report.model_dir) == warmed["model_dir"]


def test_without_prepared_weights_the_prefetch_fetches_the_checkpoint_the_start_then_loads(
    pushed, tmp_path: Path
) -> None:
    config = _config(SOURCE, tmp_path / "host")
    warmed = warm_start.prefetch(config)
    assert warmed["prepared"] is False and warmed["files_downloaded"] > 0
    started = _start(config)
    assert not started.hit
    assert all(r.bytes_downloaded == 0 for r in started.reports)


def test_a_local_weights_directory_has_nothing_to_prefetch(tiny_model: Path, tmp_path: Path) -> None:
    warmed = warm_start.prefetch(_config(str(tiny_model), tmp_path / "cache"))
    assert warmed["fetched"] is False
    assert not (tmp_path / "cache").exists()


def test_the_command_prints_one_json_line_of_what_it_fetched(
    pushed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "runtime.yaml"
    config_file.write_text(yaml.safe_dump(_document(SOURCE, tmp_path / "cache")))
    assert main(["prefetch", "--config", str(config_file)]) == 0
    answer = json.loads(capsys.readouterr().out.strip())
    assert answer["ok"] is True and answer["bytes_downloaded"] > 0 and answer["version"] == "v1"


def test_the_command_says_why_when_the_weights_cannot_be_fetched(
    pushed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "runtime.yaml"
    config_file.write_text(yaml.safe_dump(_document(f"s3://{BUCKET}/absent", tmp_path / "cache")))
    assert main(["prefetch", "--config", str(config_file)]) == 2
    answer = json.loads(capsys.readouterr().out.strip())
    assert answer["ok"] is False and "absent" in answer["error"]
