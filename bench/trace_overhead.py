"""What request tracing costs: one-token completions through gateway and runtime, traced and not.

    .venv/bin/python bench/trace_overhead.py [--requests 200]

Two identical paths side by side on loopback, each a gateway (in this process, on its own socket)
in front of its own runtime process serving the same tiny model with one intra-op thread: one path
with tracing off (no endpoint: no SDK loaded), the other exporting every span (sample ratio 1) over
OTLP/HTTP to the local stack's receiver. Requests alternate between the paths one at a time, so
both see the same machine load; each is a non-streamed completion of one token. It prints p50 and
p90 of each path, and one parseable line with the p50 difference in milliseconds and percent.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import yaml
from frontier_gateway.config import GatewayConfig
from frontier_gateway.serve import build_gateway, listen, uvicorn_server
from frontier_hostside import names
from frontier_runtime.tiny import make_tiny_checkpoint

from frontier.targets.local.traces import TraceReceiver

MODEL = "tiny"
KEY = "sk-bench-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_runtime(model_dir: Path, work: Path, endpoint: str | None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    config = work / f"runtime-{port}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"name": MODEL, "weights_uri": str(model_dir), "max_seq_len": 512},
                "cpu_kv_cache_bytes": 16 * 1024 * 1024,
                "log_level": "warning",
                "device": "cpu",
                "cpu_threads": 1,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}
    if endpoint:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    command = [sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--model-dir", str(model_dir)]
    log = (work / f"runtime-{port}.log").open("w")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**env, "OMP_NUM_THREADS": "1"}
    )
    return process, f"http://127.0.0.1:{port}"


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"runtime {url} exited with {process.returncode}")
        try:
            if httpx.get(url + names.READINESS_PATH, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"runtime {url} not ready after {timeout_s:g} s")


def start_gateway(runtime_url: str, work: Path, tracing: dict) -> tuple[str, object]:
    config = GatewayConfig.model_validate(
        {
            "host": "127.0.0.1",
            "port": 0,
            "models": [{"name": MODEL, "replicas": [runtime_url]}],
            "tenants": [
                {
                    "name": "bench",
                    "key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()],
                    "models": [MODEL],
                    "requests_per_minute": 1_000_000,
                    "tokens_per_minute": 1_000_000_000,
                    "max_concurrent_requests": 64,
                    "priority": "interactive",
                }
            ],
            "metering": {"uri": str(work / f"metering-{len(tracing)}.jsonl")},
            "tracing": tracing,
        }
    )
    gateway = build_gateway(config)
    public, admin = listen("127.0.0.1", 0), listen("127.0.0.1", 0)
    server = uvicorn_server(gateway, admin_port=admin.getsockname()[1])
    threading.Thread(target=server.run, kwargs={"sockets": [public, admin]}, daemon=True).start()
    deadline = time.monotonic() + 30
    while not (server.started and gateway.pools.ready()):
        if time.monotonic() > deadline:
            raise SystemExit("gateway not ready")
        time.sleep(0.05)
    return f"http://127.0.0.1:{public.getsockname()[1]}", server


def one_token(client: httpx.Client, url: str) -> float:
    started = time.perf_counter()
    answer = client.post(
        url + names.COMPLETIONS_PATH,
        json={"model": MODEL, "prompt": "hello", "max_tokens": 1},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    took = time.perf_counter() - started
    if answer.status_code != 200:
        raise SystemExit(f"request failed: {answer.status_code} {answer.text[:200]}")
    return took * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200, help="per path, 1..100000 (default 200)")
    args = parser.parse_args()
    if not 1 <= args.requests <= 100_000:
        parser.error(f"--requests {args.requests}: must be within 1..100000")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = make_tiny_checkpoint(work / "model", seed=0)
        receiver = TraceReceiver().start()
        plain, plain_url = start_runtime(model_dir, work, None)
        traced, traced_url = start_runtime(model_dir, work, receiver.url)
        try:
            wait_ready(plain_url, plain)
            wait_ready(traced_url, traced)
            off_url, _ = start_gateway(plain_url, work, {})
            on_url, _ = start_gateway(traced_url, work, {"endpoint": receiver.url, "sample_ratio": 1.0})
            off, on = [], []
            with httpx.Client(timeout=60) as client:
                for _ in range(10):  # warm both paths (connections, first-request costs)
                    one_token(client, off_url)
                    one_token(client, on_url)
                for _ in range(args.requests):
                    off.append(one_token(client, off_url))
                    on.append(one_token(client, on_url))
            time.sleep(2)  # the last batches of spans
        finally:
            for process in (plain, traced):
                process.terminate()
                process.wait(timeout=30)
            receiver.close()
    p50_off, p50_on = float(np.percentile(off, 50)), float(np.percentile(on, 50))
    print(f"{'path':<12}{'p50 ms':>10}{'p90 ms':>10}")
    for name, samples in (("tracing off", off), ("tracing on", on)):
        print(f"{name:<12}{np.percentile(samples, 50):>10.2f}{np.percentile(samples, 90):>10.2f}")
    print(f"spans received: {len(receiver.spans)} ({receiver.exports} exports)")
    delta = p50_on - p50_off
    print(
        f"TRACE_OVERHEAD p50_off_ms={p50_off:.2f} p50_on_ms={p50_on:.2f} delta_ms={delta:.2f} delta_pct={100 * delta / p50_off:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
