"""A cold start: shards fetched by a bounded pool of ranged GETs from moto's S3 server, each file
hashed as its parts land (no second pass), a warm cache reused, a corrupt shard refused by name,
and every start's phases (fetch, verify, load, warm-up, ready) logged and exported on /metrics."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from pathlib import Path

import boto3
import httpx
import pytest
import yaml
from frontier_hostside.names import START_PHASE_METRIC
from frontier_runtime.config import parse_config
from frontier_runtime.server.app import create_app
from frontier_runtime.server.metrics import START_PHASES
from frontier_runtime.server.serve import (
    RuntimeServer,
    load_runtime,
    new_state,
    phase_recorder,
    resolve_model_dir,
    uvicorn_config,
)
from frontier_runtime.storage import weights as weights_module
from frontier_runtime.storage.manifest import MANIFEST_NAME, ManifestEntry, build_manifest
from frontier_runtime.storage.weights import (
    WeightsError,
    _Incoming,
    cache_dir_for,
    fetch_weights,
)
from server_harness import MODEL

BUCKET = "frontier-cold-start"
MiB = 1024 * 1024


def _push(s3, src: Path, prefix: str) -> None:
    manifest = build_manifest(src, model=MODEL, version="v1")
    for entry in manifest.files:
        s3.upload_file(str(src / entry.path), BUCKET, f"{prefix}/v1/{entry.path}")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/v1/{MANIFEST_NAME}", Body=manifest.to_json().encode())


class GetCounter:
    """Counts the GETs a real boto3 client sends (by botocore's own events), and how many overlap."""

    def __init__(self, client) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.ranges: list[tuple[str, str]] = []
        client.meta.events.register("before-call.s3.GetObject", self._before)
        client.meta.events.register("after-call.s3.GetObject", self._after)

    def _before(self, params, **_kwargs) -> None:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.ranges.append((params["url_path"].rsplit("/", 1)[-1], params["headers"].get("Range", "")))

    def _after(self, **_kwargs) -> None:
        with self.lock:
            self.in_flight -= 1

    def gets_of(self, name: str) -> list[str]:
        return [r for key, r in self.ranges if key == name]


@pytest.fixture
def sharded(aws_endpoint: str, tmp_path: Path) -> str:
    """Three random shards of 3.5 MiB and a small config, pushed as ``fab weights.push`` leaves them."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"model-{i:05d}-of-00003.safetensors").write_bytes(os.urandom(3 * MiB + MiB // 2))
    (src / "config.json").write_text('{"hidden_size": 8}')
    _push(s3, src, "sharded")
    return f"s3://{BUCKET}/sharded"


def test_shards_are_fetched_by_several_gets_at_once_never_more_than_the_bound(
    sharded: str, tmp_path: Path
) -> None:
    s3 = boto3.client("s3")
    counter = GetCounter(s3)
    report = fetch_weights(sharded, "v1", tmp_path / "cache", s3_client=s3, concurrency=4, part_size=MiB)
    assert len(report.files_downloaded) == 4
    assert 1 < counter.most_in_flight <= 4


def test_a_large_file_is_fetched_as_ranged_gets_of_one_part_each(sharded: str, tmp_path: Path) -> None:
    s3 = boto3.client("s3")
    counter = GetCounter(s3)
    fetch_weights(sharded, "v1", tmp_path / "cache", s3_client=s3, concurrency=4, part_size=MiB)
    assert sorted(counter.gets_of("model-00000-of-00003.safetensors")) == [
        "bytes=0-1048575",
        "bytes=1048576-2097151",
        "bytes=2097152-3145727",
        "bytes=3145728-3670015",
    ]
    assert counter.gets_of("config.json") == [""], "a file of one part is one whole-object GET"


def test_parts_are_no_smaller_than_it_takes_to_keep_every_connection_busy(
    sharded: str, tmp_path: Path
) -> None:
    s3 = boto3.client("s3")
    counter = GetCounter(s3)
    fetch_weights(sharded, "v1", tmp_path / "cache", s3_client=s3, concurrency=4)
    assert sorted(counter.ranges) == sorted((key, "") for key, _ in counter.ranges), (
        "four files for four connections: one whole-object GET each"
    )
    assert len(counter.ranges) == 5  # the manifest and the four files


def test_fetched_shards_are_byte_for_byte_the_pushed_ones(sharded: str, tmp_path: Path) -> None:
    report = fetch_weights(sharded, "v1", tmp_path / "cache", concurrency=4, part_size=MiB)
    for name in report.files_downloaded:
        pushed = (tmp_path / "src" / name).read_bytes()
        assert (report.model_dir / name).read_bytes() == pushed


def test_a_file_is_hashed_from_the_bytes_as_they_land_not_read_back(tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 17)
    entry = ManifestEntry("shard.safetensors", len(data), hashlib.sha256(data).hexdigest())
    incoming = _Incoming(entry, tmp_path / entry.path, part_size=MiB)
    for index in (3, 0, 5, 1, 4, 2):  # parts land in any order
        first, last = incoming.byte_range(index)
        incoming.land(first, data[first : last + 1])
    incoming.partial.unlink()  # nothing left to read back: the digest must already be known
    assert incoming.finish() == (len(data), entry.sha256)


def test_a_warm_cache_is_not_fetched_again(sharded: str, tmp_path: Path) -> None:
    fetch_weights(sharded, "v1", tmp_path / "cache", concurrency=4, part_size=MiB)
    s3 = boto3.client("s3")
    counter = GetCounter(s3)
    again = fetch_weights(sharded, "v1", tmp_path / "cache", s3_client=s3, concurrency=4, part_size=MiB)
    assert again.files_downloaded == [] and again.bytes_downloaded == 0 and len(again.files_reused) == 4
    assert [key for key, _ in counter.ranges] == [MANIFEST_NAME]


def test_a_corrupt_shard_is_refused_naming_it(sharded: str, tmp_path: Path) -> None:
    victim = "model-00001-of-00003.safetensors"
    size = (tmp_path / "src" / victim).stat().st_size
    boto3.client("s3").put_object(Bucket=BUCKET, Key=f"sharded/v1/{victim}", Body=os.urandom(size))
    with pytest.raises(WeightsError) as err:
        fetch_weights(sharded, "v1", tmp_path / "cache", concurrency=4, part_size=MiB)
    assert f"{victim!r}" in str(err.value) and "failed verification after 2 download(s)" in str(err.value)
    model_dir = cache_dir_for(sharded, "v1", tmp_path / "cache")
    assert not (model_dir / victim).exists()
    assert not list(model_dir.rglob("*.partial-*"))


def test_a_shard_missing_from_the_bucket_stops_the_fetch_naming_it_and_leaves_no_partial(
    sharded: str, tmp_path: Path
) -> None:
    victim = "model-00002-of-00003.safetensors"
    boto3.client("s3").delete_object(Bucket=BUCKET, Key=f"sharded/v1/{victim}")
    with pytest.raises(WeightsError, match=rf"cannot download s3://{BUCKET}/sharded/v1/{victim}"):
        fetch_weights(sharded, "v1", tmp_path / "cache", concurrency=4, part_size=MiB)
    assert not list(cache_dir_for(sharded, "v1", tmp_path / "cache").rglob("*.partial-*"))


def test_a_fetch_concurrency_out_of_range_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"concurrency = 0: must be 1\.\.64"):
        fetch_weights("s3://b/m", "v1", tmp_path / "cache", concurrency=0)


def test_the_serial_fetch_still_downloads_file_after_file(sharded: str, tmp_path: Path) -> None:
    s3 = boto3.client("s3")
    counter = GetCounter(s3)
    report = fetch_weights(sharded, "v1", tmp_path / "cache", s3_client=s3, concurrency=1)
    assert len(report.files_downloaded) == 4 and report.concurrency == 1
    assert counter.most_in_flight == 1


def test_the_runtime_setting_bounds_the_gets_a_start_sends_at_once(
    sharded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[GetCounter] = []
    real_client = weights_module.default_client

    def counting_client(concurrency: int):
        client = real_client(concurrency)
        counted.append(GetCounter(client))
        return client

    monkeypatch.setattr(weights_module, "default_client", counting_client)
    config = parse_config(
        yaml.safe_dump(
            {
                "model": {"name": MODEL, "weights_uri": sharded, "version": "v1", "max_seq_len": 256},
                "weights_cache_dir": str(tmp_path / "cache"),
                "weights_fetch_concurrency": 1,
            }
        )
    )
    model_dir = resolve_model_dir(config, None)
    assert sorted(p.name for p in model_dir.glob("*.safetensors")) == [
        f"model-{i:05d}-of-00003.safetensors" for i in range(3)
    ]
    assert counted[0].most_in_flight == 1 and len(counted[0].ranges) == 5


@pytest.mark.slow
def test_a_start_logs_and_exports_each_phase(
    aws_endpoint: str, tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    _push(s3, tiny_model, "tiny")
    config = parse_config(
        yaml.safe_dump(
            {
                "model": {
                    "name": MODEL,
                    "weights_uri": f"s3://{BUCKET}/tiny",
                    "version": "v1",
                    "max_seq_len": 256,
                },
                "max_concurrency": 2,
                "batch": {"window_ms": 0, "max_batch_size": 2, "max_num_batched_tokens": 256},
                "weights_cache_dir": str(tmp_path / "cache"),
                "cpu_kv_cache_bytes": 8 * MiB,
                "device": "cpu",
            }
        )
    )
    state = new_state(config)
    server = RuntimeServer(
        uvicorn_config(create_app(state), "127.0.0.1", 0),
        state,
        lambda: load_runtime(config, None, phase_recorder(state)),
    )
    caplog.set_level(logging.INFO, logger="frontier_runtime.serve")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not state.health.ready()[0] and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.05)
        assert state.health.ready()[0], "the runtime never became ready"
        port = server.servers[0].sockets[0].getsockname()[1]
        scrape = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.begin_drain("test over")
        thread.join(timeout=30)
    exported = {
        line.split('phase="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in scrape.splitlines()
        if line.startswith(START_PHASE_METRIC + "{")
    }
    assert set(exported) == set(START_PHASES)
    assert exported["ready"] >= exported["fetch"] + exported["load"] + exported["warmup"]
    logged = [r.phase for r in caplog.records if getattr(r, "event", None) == "start_phase"]
    assert logged == list(START_PHASES)
