"""Weights start-up cost: cold fetch (download + verify) vs a restart on the verified cache.

    .venv/bin/python bench/weights_cache_restart.py [--mb 256] [--files 4]

Runs against moto's S3 server on loopback (a real HTTP round trip per object, no cloud), with
random weights pushed under a manifest exactly as ``fab weights.push`` writes them. Prints the
seconds of each scenario and its ratio to the cold fetch.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import boto3
from frontier_runtime.storage.manifest import MANIFEST_NAME, build_manifest
from frontier_runtime.storage.weights import MARKER_NAME, fetch_weights
from moto.server import ThreadedMotoServer


def _push(s3, src: Path) -> None:
    manifest = build_manifest(src, model="bench", version="v1")
    for entry in manifest.files:
        s3.upload_file(str(src / entry.path), "bench", f"m/v1/{entry.path}")
    s3.put_object(Bucket="bench", Key=f"m/v1/{MANIFEST_NAME}", Body=manifest.to_json().encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256, help="total weight bytes, in MiB")
    parser.add_argument("--files", type=int, default=4)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
    s3.create_bucket(Bucket="bench")
    per_file = args.mb * 1024 * 1024 // args.files
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for i in range(args.files):
            (src / f"model-{i:05d}.safetensors").write_bytes(os.urandom(per_file))
        _push(s3, src)
        cache = Path(tmp) / "cache"

        def timed(label: str) -> float:
            started = time.perf_counter()
            report = fetch_weights("s3://bench/m", "v1", cache, s3_client=s3)
            seconds = time.perf_counter() - started
            print(
                f"{label:<44} {seconds:8.3f} s  downloaded {report.bytes_downloaded / 2**20:7.1f} MiB  "
                f"rehashed {len(report.files_rehashed)}  reused {len(report.files_reused)}"
            )
            return seconds

        print(f"{args.mb} MiB in {args.files} files, moto S3 server on loopback")
        cold = timed("cold: download + verify")
        warm = timed("restart on the verified cache")
        (report_dir := next(cache.rglob(MARKER_NAME)).parent / MARKER_NAME).unlink()
        rehash = timed("restart without the marker (re-hash all)")
        victim = next(report_dir.parent.glob("model-00000.safetensors"))
        with victim.open("r+b") as fh:
            fh.seek(12345)
            fh.write(b"\x00\xff")
        corrupt = timed("restart with one corrupted file")
        print(
            f"ratios to cold: restart {warm / cold:.4f} ({cold / warm:.0f}x faster), "
            f"re-hash {rehash / cold:.2f}, one corrupt file {corrupt / cold:.2f}"
        )
    server.stop()


if __name__ == "__main__":
    main()
