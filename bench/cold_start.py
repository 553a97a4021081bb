"""Cold start to ready against the physical minimum of this machine: from S3 and from a local directory.

    .venv/bin/python bench/cold_start.py [--gb 1.05] [--shards 16] [--concurrency 8] [--keep DIR]

A Llama-shaped model of random float32 weights (``--gb``, several safetensors shards, written
locally by ``frontier_runtime.tiny``) is pushed with ``fab weights.push``'s code to moto's S3
server, run as its own process on loopback (a real HTTP round trip per GET, no cloud). Then the
runtime starts the way ``serve`` does (fetch + verify, tokenizer and engine load, warm-up forward),
each start from an empty host cache unless said otherwise:

* S3, serial: the checkpoint file after file (a download, then a hash pass), no prepared cache;
* S3, first host: the parallel fetch (one pool of ranged GETs, each file hashed as its parts land),
  the checkpoint loaded and packed; once ready, what the load computed (packed panels, fused
  projections) is published to S3 as the prepared cache of its key (not timed: after readiness);
* S3, next host: the prepared cache fetched instead of the checkpoint, verified the same way, and
  mapped by the loader (no packing, no copy);
* S3, restart on the warm host cache: every file verified before is reused (one ``stat`` each);
* local directory, first start: ``model.weights_uri`` a local directory, loaded and packed; the
  prepared directory is then kept on the host (``weights_cache_dir/local-prepared/<key>``);
* local directory, next start: that prepared directory mapped.

The physical minimum is measured on the same machine in the same run, each with nothing else
running: ``BW_net`` (a plain parallel GET of the same objects, read and dropped, at the same
concurrency), ``BW_sha`` (sha256 of the shards' bytes already in memory, one thread per core),
``BW_copy`` (reading the model's files from the page cache into one preallocated buffer),
``BW_disk`` (writing the same bytes to a file beside the cache and fsyncing it: the host cache
must hold the model for the next start to be warm) and ``T_fwd`` (the warm-up request again on
the loaded engine: what the forward itself costs). Each bandwidth is measured before and after
the starts and the better figure kept. With ``B`` the bytes of the model, every byte must cross
the network, be hashed, be written to the cache disk and be copied into memory; these can
overlap, so the slowest of them bounds the transfer, and the warm-up forward can only start once
the weights are in place::

    T_min = max(B / BW_net, B / BW_sha, B / BW_disk, B / BW_copy) + T_fwd

Per phase: fetch+verify ≥ max(B/BW_net, B/BW_sha, B/BW_disk), load ≥ B/BW_copy, warm-up ≥ T_fwd. The ratio
is measured / minimum (goal ≤ 1.5 for start-to-ready). A start from a local directory (or a warm
host cache) fetches nothing: its minimum is B/BW_copy + T_fwd, the model read from the page cache.
A load from the prepared cache maps the files and copies nothing (the warm-up forward is the first
to read the weights), so that one read is not needed there and the ratio may fall below 1.
Start-to-ready here is what ``serve`` does between opening its socket and readiness; the
interpreter and the torch import before it are not counted (nor in the minimum).

On this machine moto's server is a Python process sharing the same 2 cores as the runtime: every
byte it serves costs CPU that the fetcher's hashing and copying also need, so BW_net is moto's
serving rate, not a NIC's, and a parallel fetch contends with it for the cores. moto also reads
and copies a whole object under a per-object lock for every ranged GET, so ranges of one object
cost it that object's size each: the default 16 shards of ~65 MB are each one whole-object GET
(the fetcher cuts files into ranges only when there are fewer files than connections), and the
prepared cache is written in shards of 64 MiB for the same reason. The disk
is a shared virtual disk: BW_disk, like every figure here, moves with whatever else runs on the
machine: rerun and compare runs side by side, never across machines.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import boto3
import yaml
from botocore.config import Config
from frontier_runtime.config import parse_config
from frontier_runtime.server import warm_start
from frontier_runtime.server.serve import build_engine
from frontier_runtime.server.text import TextCodec
from frontier_runtime.storage.prepared import ModelSource
from frontier_runtime.storage.weights import STREAM_CHUNK, fetch_weights
from frontier_runtime.tiny import make_tiny_checkpoint

from frontier.release.weights import push

BUCKET = "bench-cold-start"
SOURCE = f"s3://{BUCKET}/model"
VERSION = "v1"
GB = 1e9


@dataclass(frozen=True)
class Start:
    """One start to ready, by phase (seconds)."""

    label: str
    concurrency: int
    fetch_verify: float
    hashing: float
    load: float
    warmup: float
    forward_again: float
    bytes_fetched: int
    prepared: bool  # loaded from the prepared cache (no packing)

    @property
    def total(self) -> float:
        return self.fetch_verify + self.load + self.warmup


@dataclass(frozen=True)
class Limits:
    """What this machine allows, each measured alone (bytes/s, seconds)."""

    bytes: int
    net_bps: float
    sha_bps: float
    disk_bps: float
    copy_bps: float

    @property
    def transfer(self) -> float:
        return max(self.fetch_verify, self.load)

    @property
    def fetch_verify(self) -> float:
        return max(self.bytes / self.net_bps, self.bytes / self.sha_bps, self.bytes / self.disk_bps)

    def best(self, other: Limits) -> Limits:
        """The better of two measurements of each bandwidth: the machine can do at least that."""
        return Limits(
            self.bytes,
            max(self.net_bps, other.net_bps),
            max(self.sha_bps, other.sha_bps),
            max(self.disk_bps, other.disk_bps),
            max(self.copy_bps, other.copy_bps),
        )

    @property
    def load(self) -> float:
        return self.bytes / self.copy_bps


def shape_for(gigabytes: float) -> dict:
    """A Llama shape of about ``gigabytes`` of float32 weights (hidden 1024, 15 M parameters a layer)."""
    hidden, inter, vocab = 1024, 4096, 4096
    kv = hidden // 2
    per_layer = 2 * hidden * hidden + 2 * kv * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((gigabytes * GB / 4 - 2 * vocab * hidden) / per_layer))
    return {
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": 16,
        "num_kv_heads": 8,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "dtype": "float32",
    }


def start_moto() -> tuple[subprocess.Popen, str]:
    """moto's S3 server as its own process, as a weights bucket is a separate service in the cloud."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            return server, endpoint
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("moto_server did not answer within 30 s")


def client(endpoint: str, concurrency: int):
    return boto3.client("s3", endpoint_url=endpoint, config=Config(max_pool_connections=concurrency + 2))


def start_to_ready(
    label: str, config_yaml: str, cache: Path, *, cold: bool = True, serial: bool = False
) -> Start:
    """What ``serve`` does before readiness (serve.load_runtime + the warm-up), phase by phase;
    from an empty host cache when ``cold``, else on the cache the previous start left. ``serial``:
    the checkpoint fetched file after file, without the prepared cache (the oldest path). What a
    start prepared is published after it is ready, as ``serve`` does, outside the timings."""
    if cold:
        shutil.rmtree(cache, ignore_errors=True)
    config = parse_config(config_yaml)
    started = time.monotonic()
    if serial:
        report = fetch_weights(SOURCE, VERSION, cache, concurrency=1)
        source = ModelSource(report.model_dir, False, "", reports=(report,))
    else:
        source = warm_start.model_source(config, lambda phase, seconds: None)
    fetch_verify = time.monotonic() - started
    started = time.monotonic()
    TextCodec.from_dir(source.model_dir)
    engine, after_ready = warm_start.build(config, source, build_engine)
    load = time.monotonic() - started
    try:
        warmup = engine.warmup()
        forward_again = engine.warmup()
        if after_ready is not None:
            after_ready()
    finally:
        engine.shutdown()
    return Start(
        label, 1 if serial else config.weights_fetch_concurrency, fetch_verify,
        sum(r.verify_seconds for r in source.reports), load, warmup, forward_again,
        sum(r.bytes_downloaded for r in source.reports), source.hit,
    )  # fmt: skip


def measure_net(endpoint: str, s3, concurrency: int) -> tuple[int, float]:
    """A plain parallel GET of every object of the version, read and dropped: (bytes, bytes/s)."""
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"model/{VERSION}/")["Contents"]]
    getter = client(endpoint, concurrency)

    def get(key: str) -> int:
        body, size = getter.get_object(Bucket=BUCKET, Key=key)["Body"], 0
        while chunk := body.read(STREAM_CHUNK):
            size += len(chunk)
        return size

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(get, keys))
    return total, total / (time.monotonic() - started)


def measure_sha(files: list[Path]) -> float:
    """sha256 of the shards' bytes already in memory, one thread per core (hashlib frees the GIL)."""
    blobs = [f.read_bytes() for f in files]
    started = time.monotonic()
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda b: hashlib.sha256(b).digest(), blobs))
    return sum(map(len, blobs)) / (time.monotonic() - started)


def measure_disk(files: list[Path], folder: Path) -> float:
    """Writing the shards' bytes to one file in ``folder`` and fsyncing it (bytes/s)."""
    blobs = [f.read_bytes() for f in files]
    target = folder / "disk-bandwidth.tmp"
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with target.open("wb", buffering=0) as fh:
        for blob in blobs:
            fh.write(blob)
        os.fsync(fh.fileno())
    seconds = time.monotonic() - started
    target.unlink()
    return sum(map(len, blobs)) / seconds


def measure_limits(endpoint: str, s3, concurrency: int, shards: list[Path], folder: Path) -> Limits:
    fetched, net_bps = measure_net(endpoint, s3, concurrency)
    return Limits(fetched, net_bps, measure_sha(shards), measure_disk(shards, folder), measure_copy(shards))


def measure_copy(files: list[Path]) -> float:
    """Reading files that are in the page cache into one preallocated buffer (bytes/s)."""
    buffer = bytearray(max(f.stat().st_size for f in files))
    view = memoryview(buffer)
    for f in files:  # bring them into the page cache first: the start reads them from there too
        with f.open("rb") as fh:
            fh.readinto(view)
    started = time.monotonic()
    total = 0
    for f in files:
        with f.open("rb", buffering=0) as fh:
            total += fh.readinto(view)
    return total / (time.monotonic() - started)


def row(name: str, measured: float, minimum: float) -> str:
    return f"  {name:<28} {measured:9.2f} s {minimum:9.2f} s {measured / minimum:8.2f}"


def print_start(start: Start, limits: Limits) -> None:
    """A start's phases against their minimums; a start that fetched nothing (warm cache) has no
    transfer to bound, so its minimum is the load and the forward alone."""
    how = "prepared cache" if start.prepared else "checkpoint"
    print(
        f"\n{start.label} (concurrency {start.concurrency}, {start.bytes_fetched / GB:.2f} GB fetched, "
        f"loaded from the {how})"
    )
    print(f"  {'phase':<28} {'measured':>11} {'minimum':>11} {'ratio':>8}")
    if start.bytes_fetched:
        print(row("fetch + verify", start.fetch_verify, limits.fetch_verify))
        hashing = limits.bytes / limits.sha_bps
        print(f"  {'  of which hashing (overlap)':<28} {start.hashing:9.2f} s {hashing:9.2f} s")
    else:
        print(f"  {'cache check (stat per file)':<28} {start.fetch_verify:9.2f} s")
    print(row("load (tokenizer + engine)", start.load, limits.load))
    print(row("warm-up", start.warmup, start.forward_again))
    transfer = limits.transfer if start.bytes_fetched else limits.load
    print(row("start-to-ready", start.total, transfer + start.forward_again))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.05, help="model size in GB (1e9 bytes); at least 1")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8, help="GETs in flight on the parallel path")
    parser.add_argument("--keep", type=Path, help="keep the generated model here and reuse it next time")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    shape = shape_for(args.gb)
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        src = args.keep or Path(tmp) / "model"
        if not (src / "config.json").is_file():
            started = time.monotonic()
            make_tiny_checkpoint(src, seed=0, shards=args.shards, **shape)
            print(f"wrote the model in {time.monotonic() - started:.1f} s")
        shards = sorted(src.glob("*.safetensors"))
        model_bytes = sum(f.stat().st_size for f in src.iterdir() if f.is_file())
        server, endpoint = start_moto()
        try:
            s3 = client(endpoint, args.concurrency)
            push(s3, src, SOURCE, "bench", VERSION, create_bucket=True)
            config_yaml = yaml.safe_dump(
                {
                    "model": {"name": "bench", "weights_uri": SOURCE, "version": VERSION, "max_seq_len": 256},
                    "max_concurrency": 1,
                    "batch": {"window_ms": 0, "max_batch_size": 1, "max_num_batched_tokens": 256},
                    "weights_cache_dir": str(Path(tmp) / "cache"),
                    "cpu_kv_cache_bytes": 16 * 1024 * 1024,
                    "device": "cpu",
                }
            )
            local_yaml = config_yaml.replace(SOURCE, str(src))
            scratch = Path(tmp) / "scratch"
            cache = Path(tmp) / "cache"
            os.environ["AWS_ENDPOINT_URL"] = endpoint  # the runtime's client finds moto as it finds S3
            first = measure_limits(endpoint, s3, args.concurrency, shards, scratch)
            starts = [
                start_to_ready("S3, serial fetch, no prepared cache", config_yaml, cache, serial=True),
                start_to_ready("S3, first host: parallel fetch, packs, publishes", config_yaml, cache),
                start_to_ready("S3, next host: prepared cache from S3", config_yaml, cache),
                start_to_ready("S3, restart on the warm host cache", config_yaml, cache, cold=False),
                start_to_ready("local directory, first start: packs, keeps it", local_yaml, cache),
                start_to_ready(
                    "local directory, next start: prepared on the host", local_yaml, cache, cold=False
                ),
            ]
            limits = first.best(measure_limits(endpoint, s3, args.concurrency, shards, scratch))
        finally:
            server.terminate()
            server.wait(10)
    print(
        f"\nmodel: {model_bytes / GB:.2f} GB in {len(shards)} shards ({shape['num_layers']} layers, hidden "
        f"{shape['hidden_size']}, float32), moto's S3 server on loopback, {os.cpu_count()} cores"
    )
    print(
        f"measured alone (best of 2): network (moto, {args.concurrency} GETs) {limits.net_bps / GB:.2f} GB/s, "
        f"sha256 {limits.sha_bps / GB:.2f} GB/s, disk write+fsync {limits.disk_bps / GB:.2f} GB/s, "
        f"page-cache read {limits.copy_bps / GB:.2f} GB/s"
    )
    print("T_min = max(B/BW_net, B/BW_sha, B/BW_disk, B/BW_copy) + T_fwd")
    for start in starts:
        print_start(start, limits)
    s3_hit, local_hit = starts[2], starts[5]
    print(
        f"\nstart-to-ready over the bound: S3 {s3_hit.total / (limits.transfer + s3_hit.forward_again):.2f}x "
        f"({s3_hit.total:.2f} s, prepared cache hit on a cold host), local directory "
        f"{local_hit.total / (limits.load + local_hit.forward_again):.2f}x ({local_hit.total:.2f} s); without the "
        f"prepared cache: S3 {starts[1].total / (limits.transfer + starts[1].forward_again):.2f}x, local "
        f"{starts[4].total / (limits.load + starts[4].forward_again):.2f}x"
    )


if __name__ == "__main__":
    main()
