"""The runtime as a process: ``python -m frontier_runtime serve`` fetches its weights from S3 and
its API keys from Secrets Manager (moto's server), serves, and on SIGTERM drains: readiness fails
at once, new requests get 503, every in-flight request completes, and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import httpx
import pytest
import yaml
from frontier_runtime.config import parse_config
from frontier_runtime.ops import cpu_kernel
from frontier_runtime.server.app import create_app
from frontier_runtime.server.serve import RuntimeServer, load_runtime, new_state, uvicorn_config
from frontier_runtime.storage.manifest import MANIFEST_NAME, build_manifest
from server_harness import MODEL

BUCKET = "frontier-test-weights"
SECRET = "frontier/test/api-keys"
KEY = "sk-drain-test-key"


@pytest.fixture
def pushed_model(aws_endpoint: str, tiny_model: Path) -> str:
    """The tiny model in moto's S3 with its manifest, as ``fab weights.push`` leaves it; the keys in Secrets Manager."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    manifest = build_manifest(tiny_model, model=MODEL, version="v1")
    for entry in manifest.files:
        s3.upload_file(str(tiny_model / entry.path), BUCKET, f"tiny/v1/{entry.path}")
    s3.put_object(Bucket=BUCKET, Key=f"tiny/v1/{MANIFEST_NAME}", Body=manifest.to_json().encode())
    boto3.client("secretsmanager").create_secret(Name=SECRET, SecretString=json.dumps({"keys": [KEY]}))
    return f"s3://{BUCKET}/tiny"


def _write_config(root: Path, source: str) -> Path:
    config = {
        "model": {"name": MODEL, "weights_uri": source, "version": "v1", "max_seq_len": 256},
        "api_keys_secret": SECRET,
        "max_concurrency": 4,
        "queue": {"max_length": 8, "timeout_ms": 30_000},
        "batch": {"window_ms": 0, "max_batch_size": 4, "max_num_batched_tokens": 512},
        "weights_cache_dir": "cache/weights",
        "cpu_kv_cache_bytes": 16 * 1024 * 1024,
        "drain_timeout_s": 30,
        "device": "cpu",
    }
    path = root / "runtime.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Process:
    """The runtime in a child process, its JSON log lines collected as they come."""

    def __init__(self, root: Path, endpoint: str) -> None:
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "frontier_runtime",
                "serve",
                "--config",
                "runtime.yaml",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_event(self, event: str, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        for entry in self.seen:
            if entry.get("event") == event:
                return entry
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                entry = {"raw": line}
            self.seen.append(entry)
            if entry.get("event") == event:
                return entry
        raise AssertionError(f"no {event!r} event; log so far: {self.seen[-10:]}")

    def log_text(self) -> str:
        while not self.lines.empty():
            self.seen.append({"raw": self.lines.get()})
        return json.dumps(self.seen)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def runtime_process(tmp_path: Path, pushed_model: str, aws_endpoint: str):
    _write_config(tmp_path, pushed_model)
    process = Process(tmp_path, aws_endpoint)
    yield process
    process.kill()


def test_sigterm_drains_in_flight_requests_then_exits_zero(runtime_process: Process, tmp_path: Path) -> None:
    port = runtime_process.wait_event("listening")["port"]
    runtime_process.wait_event("ready")
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {KEY}"}
    # Weights were fetched into the cache under the working directory (relative path in the config).
    assert (tmp_path / "cache/weights" / BUCKET / "tiny/v1/model.safetensors").is_file()
    body = {"model": MODEL, "prompt": "the", "max_tokens": 160, "temperature": 0, "ignore_eos": True}

    async def scenario() -> tuple[list[httpx.Response], list[str], httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=120) as client:

            async def unary() -> httpx.Response:
                return await client.post("/v1/completions", json=body)

            async def streamed() -> str:
                async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    return "".join([chunk async for chunk in r.aiter_text()])

            tasks = [asyncio.create_task(unary()) for _ in range(2)] + [
                asyncio.create_task(streamed()) for _ in range(2)
            ]
            all_admitted = f'frontier_admitted_requests{{model_name="{MODEL}"}} 4.0'
            while all_admitted not in (await client.get("/metrics")).text:
                await asyncio.sleep(0.01)
            runtime_process.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.05)
            async with httpx.AsyncClient(base_url=url, headers=auth, timeout=10) as fresh:
                ready = await fresh.get("/health/ready")
                refused = await fresh.post("/v1/completions", json={**body, "max_tokens": 1})
            results = await asyncio.gather(*tasks)
            return list(results[:2]), list(results[2:]), ready, refused

    unary, streams, ready, refused = asyncio.run(scenario())
    assert ready.status_code == 503 and "draining" in ready.json()["reasons"]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    for response in unary:
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 160
    for text in streams:
        assert text.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in text
    assert runtime_process.proc.wait(timeout=30) == 0
    drained = runtime_process.wait_event("drain_done")
    assert drained["in_flight"] == 0
    assert KEY not in runtime_process.log_text()


def test_the_ready_line_names_the_attention_backend_and_kernels(runtime_process: Process) -> None:
    ready = runtime_process.wait_event("ready")
    assert ready["attention_backend"] in ("cpu-kernel", "sdpa-gather")
    variants = "|".join(cpu_kernel.VARIANTS)
    assert re.fullmatch(rf"native-({variants})(\+panel-gemm)?|torch", ready["kernels"])
    assert f"attention backend {ready['attention_backend']}, kernels {ready['kernels']}" in ready["msg"]


def test_weights_that_fail_their_checksum_stop_startup_with_a_clear_error(
    tmp_path: Path, pushed_model: str, caplog: pytest.LogCaptureFixture
) -> None:
    boto3.client("s3").put_object(Bucket=BUCKET, Key="tiny/v1/config.json", Body=b'{"tampered": true}')
    config = parse_config(_write_config(tmp_path, pushed_model).read_text())
    config = config.model_copy(update={"weights_cache_dir": str(tmp_path / "cache")})
    state = new_state(config)
    server = RuntimeServer(
        uvicorn_config(create_app(state), "127.0.0.1", 0), state, lambda: load_runtime(config, None)
    )
    caplog.set_level(logging.ERROR, logger="frontier_runtime.serve")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and server.exit_code == 1
    (failure,) = [r for r in caplog.records if getattr(r, "event", None) == "startup_failed"]
    assert "'config.json'" in failure.error and "failed verification after 2 download(s)" in failure.error
    assert not state.health.ready()[0]
