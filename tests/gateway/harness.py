"""Real sockets for the gateway's tests: the gateway under uvicorn in a thread, small real HTTP
stand-ins for runtimes where a runtime is not the point, and real runtime processes where it is."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from frontier_gateway.app import Gateway
from frontier_gateway.config import GatewayConfig
from frontier_gateway.serve import build_gateway, listen, uvicorn_server


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenant(name: str, key: str, models: list[str], **quota: Any) -> dict[str, Any]:
    return {
        "name": name,
        "key_sha256": [digest(key)],
        "models": models,
        "requests_per_minute": quota.get("rpm", 1000),
        "tokens_per_minute": quota.get("tpm", 1_000_000),
        "max_concurrent_requests": quota.get("concurrency", 64),
        "priority": quota.get("priority", "interactive"),
    }


def gateway_config(
    models: dict[str, list[str]],
    tenants: list[dict],
    metering: Path,
    *,
    key_secrets: dict[str, str] | None = None,
    **extra: Any,
) -> GatewayConfig:
    """``key_secrets``: each model's runtimes' key secret, by model (none: they take no key)."""
    secrets = key_secrets or {}
    data = {
        "host": "127.0.0.1",
        "port": 0,
        "models": [
            {"name": name, "replicas": urls, "api_keys_secret": secrets.get(name, "")}
            for name, urls in models.items()
        ],
        "tenants": tenants,
        "metering": {"uri": str(metering), "flush_s": 0.2},
        "probe": {"interval_s": 0.2, "timeout_s": 0.5},
        **extra,
    }
    return GatewayConfig.model_validate(data)


@dataclass
class RunningGateway:
    url: str  # the public socket: what tenants reach
    admin_url: str  # the admin socket: /metrics
    gateway: Gateway
    thread: threading.Thread
    server: Any

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@contextmanager
def running_gateway(config: GatewayConfig, *, wait_ready: bool = True) -> Iterator[RunningGateway]:
    gateway = build_gateway(config)
    public, admin = listen("127.0.0.1", 0), listen("127.0.0.1", 0)
    server = uvicorn_server(gateway, admin_port=admin.getsockname()[1])
    thread = threading.Thread(target=server.run, kwargs={"sockets": [public, admin]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{public.getsockname()[1]}"
    admin_url = f"http://127.0.0.1:{admin.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while not server.started or (wait_ready and not gateway.pools.ready()):
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise TimeoutError(f"gateway not ready: {gateway.pools.summary()}")
        time.sleep(0.02)
    running = RunningGateway(url, admin_url, gateway, thread, server)
    try:
        yield running
    finally:
        running.stop()


# -- a stand-in runtime ------------------------------------------------------------------------


class _StandIn(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandIn

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        status = 200 if self.server.ready else 503
        self._json(status, {"ready": self.server.ready})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body, dict(self.headers)))
        self.server.peers.append(self.client_address)  # which connection carried it
        time.sleep(self.server.delay_s)
        if self.server.status != 200:
            self._json(
                self.server.status, {"error": {"message": "busy", "type": "overloaded", "code": "queue_full"}}
            )
            return
        completion = int(body.get("max_tokens") or 4)
        usage = {
            "prompt_tokens": self.server.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.server.prompt_tokens + completion,
        }
        if not body.get("stream"):
            self._json(
                200,
                {
                    "id": "x",
                    "object": "text_completion",
                    "model": body["model"],
                    "served_by": self.server.name,
                    "choices": [{"index": 0, "text": "ok"}],
                    "usage": usage,
                },
            )
            return
        # As the runtime streams under uvicorn: chunked, the connection kept for the next request.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(completion):
            chunk = {
                "id": "x",
                "object": "text_completion",
                "served_by": self.server.name,
                "choices": [{"index": 0, "text": f"t{i}"}],
                "usage": None,
            }
            self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            self._chunk(b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, obj: dict) -> None:
        payload = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class StandIn(ThreadingHTTPServer):
    """A small real HTTP server answering like a runtime: fixed usage, SSE when asked, records requests."""

    daemon_threads = True

    def __init__(self, name: str, *, prompt_tokens: int = 10, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _StandIn)
        self.name = name
        self.prompt_tokens = prompt_tokens
        self.ready = True
        self.status = 200
        self.delay_s = 0.0
        self.requests: list[tuple[str, dict, dict]] = []
        self.peers: list[tuple[str, int]] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


# -- real runtime processes ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RuntimeProcess:
    model: str
    url: str
    process: subprocess.Popen
    log: Path
    extra: dict = field(default_factory=dict)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def metric(self, name: str) -> float:
        """The sum of one metric family's samples on the runtime's /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


def runtime_yaml(model: str, model_dir: Path, max_seq_len: int = 512) -> dict[str, Any]:
    return {
        "model": {"name": model, "weights_uri": str(model_dir), "max_seq_len": max_seq_len},
        "max_concurrency": 8,
        "queue": {"max_length": 64, "timeout_ms": 30_000},
        "batch": {"window_ms": 0, "max_batch_size": 8, "max_num_batched_tokens": 512},
        "cpu_kv_cache_bytes": 16 * 1024 * 1024,
        "block_size": 16,
        "drain_timeout_s": 5,
        "log_level": "warning",
        "device": "cpu",
        "cpu_threads": 1,
    }


def start_runtime(
    model: str,
    model_dir: Path,
    workdir: Path,
    settings: dict[str, Any] | None = None,
    port: int | None = None,
) -> RuntimeProcess:
    """``settings``: runtime.yaml sections beside the harness's own (e.g. ``kv_transfer``); ``port``:
    where it listens (default: a free one), for a replica a gateway knows before it starts."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"{model}-{port}.yaml"
    config.write_text(yaml.safe_dump({**runtime_yaml(model, model_dir), **(settings or {})}))
    log = workdir / f"{model}-{port}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "frontier_runtime",
            "serve",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model-dir",
            str(model_dir),
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env=env,
    )
    return RuntimeProcess(model, f"http://127.0.0.1:{port}", process, log)


def wait_ready(runtimes: list[RuntimeProcess], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(runtimes)
    while pending:
        for rt in list(pending):
            if rt.process.poll() is not None:
                raise RuntimeError(f"runtime {rt.url} exited: {rt.log.read_text()[-2000:]}")
            try:
                if httpx.get(rt.url + "/health/ready", timeout=1).status_code == 200:
                    pending.remove(rt)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"runtimes not ready: {[rt.url for rt in pending]}")
        time.sleep(0.2)


@contextmanager
def redis_server(work: Path, password: str = "") -> Iterator[int]:
    """A real redis-server of its own on a free loopback port, nothing persisted; with ``password``
    it takes only clients presenting it. Yields its port once it answers."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
    command += ["--save", "", "--appendonly", "no", "--dir", str(work)]
    if password:
        command += ["--requirepass", password]
    ready = b"-NOAUTH" if password else b"+PONG"  # what PING gets once the server listens
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(ready):
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port} (exit {server.poll()})")
            time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)
