"""What the gateway adds to a request, beside LiteLLM's proxy, in one run on one machine.

    .venv/bin/python bench/gateway_overhead.py [--requests 300] [--step-s 3] [--p99-bound-ms 250]

The same load goes to six paths, each in front of one of two upstreams:

- a real runtime process (``frontier_runtime`` serving a tiny random checkpoint, one intra-op
  thread), and a stand-in that answers an OpenAI-shaped chat completion at once (a few lines of
  asyncio in its own process, started from this file), so the gateways' own cost is not hidden
  behind a model's;
- direct, through Frontier's gateway (``python -m frontier_gateway serve``: one process), and
  through LiteLLM's proxy (``litellm --config C --port P --num_workers 1``: one worker, in its own
  venv ``.frontier/litellm-venv``, made on first use with ``pip install 'litellm[proxy]==1.100.5'``).

Latency: ``--requests`` one-token chat completions per path, non-streamed and streamed, one at a
time; the paths take turns request by request so that each sees the same machine load. Added
p50/p99 is a path's percentile minus its direct path's.

Sustained rate (non-streamed): closed-loop steps of 1, 2, 4, … concurrent clients, each for
``--step-s`` seconds. The rule: the highest completed-requests-per-second of a step with no error
and p99 under ``--p99-bound-ms``; steps stop at the first one over the bound or with errors, or
once doubling the clients twice in a row gained under 5 %.

The load comes from a minimal HTTP/1.1 client on asyncio (keep-alive connections, requests
encoded once) so that on a small machine the client costs less than what it measures. All of it
shares the machine's cores: with other work running the figures move from run to run, so run it
at least twice and compare the added columns, not the absolute ones.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
KEY = "sk-bench-0123456789"
LITELLM_VENV = ROOT / ".frontier" / "litellm-venv"
LITELLM_VERSION = "1.100.5"
STEPS = (1, 2, 4, 8, 16, 32, 64)


# -- the stand-in upstream (run as ``gateway_overhead.py --standin PORT``) -------------------------

_USAGE = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
_ANSWER = json.dumps(
    {
        "id": "standin",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}
        ],
        "usage": _USAGE,
    }
).encode()
_CHUNK = json.dumps(
    {
        "id": "standin",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "length"}],
    }
).encode()
_USAGE_CHUNK = json.dumps(
    {"id": "standin", "object": "chat.completion.chunk", "choices": [], "usage": _USAGE}
).encode()


class _StandIn(asyncio.Protocol):
    """HTTP/1.1 keep-alive: GET answers ready, POST a one-token completion (SSE when asked)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            if head.startswith("GET"):
                self._send(b"application/json", b'{"ready":true}')
            elif json.loads(body).get("stream"):
                events = b"data: " + _CHUNK + b"\n\ndata: " + _USAGE_CHUNK + b"\n\ndata: [DONE]\n\n"
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    + b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events)
                )
            else:
                self._send(b"application/json", _ANSWER)

    def _send(self, content_type: bytes, payload: bytes) -> None:
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (content_type, len(payload), payload)
        )


async def _serve_standin(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_StandIn, "127.0.0.1", port)
    await server.serve_forever()


# -- processes ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def process(command: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        command, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"{url}: the process exited with {proc.returncode}; its log:\n{log.read_text()[-3000:]}"
            )
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 within {timeout_s:g} s; see {log}")


# The runtime the gateway benches serve: the tiny model on one CPU thread. A bench sets over these
# what it measures (its KV cache, block size, events, transfer role, threads).
RUNTIME_SETTINGS: dict[str, Any] = {
    "max_concurrency": 64,
    "queue": {"max_length": 1024, "timeout_ms": 60_000},
    "cpu_kv_cache_bytes": 64 * 1024 * 1024,
    "log_level": "warning",
    "device": "cpu",
    "cpu_threads": 1,
}


def runtime_command(
    model_dir: Path, work: Path, port: int, *, max_seq_len: int = 512, **settings: Any
) -> list[str]:
    """The runtime serving ``model_dir`` on ``port``: :data:`RUNTIME_SETTINGS` with ``settings`` over
    them, written to ``work/runtime-<port>.yaml``."""
    config = work / f"runtime-{port}.yaml"
    model = {"name": MODEL, "weights_uri": str(model_dir), "max_seq_len": max_seq_len}
    config.write_text(yaml.safe_dump({"model": model, **RUNTIME_SETTINGS, **settings}))
    return [sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config)] + [
        "--host", "127.0.0.1", "--port", str(port), "--model-dir", str(model_dir),
    ]  # fmt: skip


def gateway_command(upstream: str, work: Path, name: str, port: int) -> list[str]:
    return gateway_serving([{"name": MODEL, "replicas": [upstream]}], work, name, port)


def gateway_serving(
    models: list[dict[str, object]], work: Path, name: str, port: int, **settings: object
) -> list[str]:
    """The gateway's command line over ``models`` (its pools as gateway.yaml writes them), with one
    tenant the benches' requests never hit a limit of; ``settings`` are further gateway.yaml keys."""
    config = work / f"gateway-{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "host": "127.0.0.1",
                "port": port,
                "admin_port": free_port(),
                "models": models,
                **settings,
                "tenants": [
                    {
                        "name": "bench",
                        "key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()],
                        "models": [MODEL],
                        "requests_per_minute": 10_000_000,
                        "tokens_per_minute": 10_000_000_000,
                        "max_concurrent_requests": 1024,
                        "priority": "interactive",
                    }
                ],
                "metering": {"uri": str(work / f"metering-{name}.jsonl")},
            }
        )
    )
    return [sys.executable, "-m", "frontier_gateway", "serve", "--config", str(config)]


def litellm_venv() -> Path:
    litellm = LITELLM_VENV / "bin" / "litellm"
    if not litellm.exists():
        print(
            f"making {LITELLM_VENV} with litellm[proxy]=={LITELLM_VERSION} (a few minutes, once)", flush=True
        )
        subprocess.run(["python3.11", "-m", "venv", str(LITELLM_VENV)], check=True)
        pip = [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"]
        subprocess.run(pip, check=True)
    return litellm


def litellm_command(litellm: Path, upstream: str, work: Path, name: str, port: int) -> list[str]:
    config = work / f"litellm-{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": f"openai/{MODEL}",
                            "api_base": upstream + "/v1",
                            "api_key": "sk-upstream",
                        },
                    }
                ],
                "general_settings": {"master_key": KEY},
                "litellm_settings": {"telemetry": False},
            }
        )
    )
    return [str(litellm), "--config", str(config), "--port", str(port), "--num_workers", "1"]


# -- the load ----------------------------------------------------------------------------------------


def encode_request(url: str, stream: bool) -> tuple[str, int, bytes]:
    host_port = url.removeprefix("http://")
    host, _, port = host_port.partition(":")
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host_port}\r\nauthorization: Bearer {KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    return host, int(port), head.encode() + payload


class Connection:
    """One keep-alive HTTP/1.1 connection sending one encoded request at a time."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self.host, self.port, self.request = host, port, request
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self) -> tuple[int, float]:
        """(status, seconds) of one exchange; the whole answer is read."""
        started = time.perf_counter()
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(self.request)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        status = int(head.split(" ", 2)[1])
        if "transfer-encoding: chunked" in head:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            await self.reader.readexactly(length)
        took = time.perf_counter() - started
        if "connection: close" in head:
            await self.close()
        return status, took

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None


@dataclass
class Route:
    name: str  # e.g. "frontier → runtime"
    upstream: str  # "runtime" or "stand-in"
    via: str  # "direct", "frontier", "litellm"
    url: str
    latency: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    rate: float = 0.0
    rate_clients: int = 0


async def measure_latency(paths: list[Route], requests: int, stream: bool) -> None:
    connections = [Connection(*encode_request(p.url, stream)) for p in paths]
    for _ in range(10):  # warm: connections, first-request costs
        for connection in connections:
            await connection.call()
    for i in range(requests):
        for path, connection in zip(paths, connections, strict=True):
            status, took = await connection.call()
            if status != 200:
                raise SystemExit(f"{path.name}: answered {status}")
            path.latency[stream].append(took * 1000)
        if (i + 1) % max(1, requests // 4) == 0:
            print(f"  latency {'stream' if stream else 'plain '}: {i + 1}/{requests}", flush=True)
    for connection in connections:
        await connection.close()


async def one_step(url: str, clients: int, seconds: float) -> tuple[float, float, int]:
    """(requests per second, p99 ms, errors) of ``clients`` closed-loop clients for ``seconds``."""
    host, port, request = encode_request(url, stream=False)
    took: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        connection = Connection(host, port, request)
        try:
            while time.perf_counter() < deadline:
                try:
                    status, seconds_ = await connection.call()
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    errors += 1
                    await connection.close()
                    continue
                if status == 200:
                    took.append(seconds_ * 1000)
                else:
                    errors += 1
        finally:
            await connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    p99 = float(np.percentile(took, 99)) if took else float("inf")
    return len(took) / elapsed, p99, errors


async def measure_rate(path: Route, seconds: float, p99_bound_ms: float) -> None:
    flat = 0  # steps in a row that gained under 5 % on the best so far
    for clients in STEPS:
        rate, p99, errors = await one_step(path.url, clients, seconds)
        fits = errors == 0 and p99 <= p99_bound_ms
        print(
            f"  rate {path.name:<22} {clients:>3} clients: {rate:8.1f} req/s  p99 {p99:7.1f} ms  "
            f"errors {errors}{'' if fits else '  (over the rule)'}",
            flush=True,
        )
        if not fits:
            break
        flat = flat + 1 if rate < path.rate * 1.05 else 0
        if rate > path.rate:
            path.rate, path.rate_clients = rate, clients
        if flat == 2:
            break


# -- the run -------------------------------------------------------------------------------------------


def table(paths: list[Route]) -> str:
    direct = {p.upstream: p for p in paths if p.via == "direct"}
    lines = [
        f"{'path':<24}{'mode':<8}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}{'sustained req/s':>17}",
    ]
    for path in paths:
        for stream in (False, True):
            samples = path.latency[stream]
            base = direct[path.upstream].latency[stream]
            p50, p99 = np.percentile(samples, 50), np.percentile(samples, 99)
            added = (
                ""
                if path.via == "direct"
                else f"{p50 - np.percentile(base, 50):>9.2f}{p99 - np.percentile(base, 99):>9.2f}"
            )
            rate = f"{path.rate:>10.0f} (c={path.rate_clients})" if not stream else ""
            lines.append(
                f"{path.name:<24}{'stream' if stream else 'plain':<8}{p50:>9.2f}{p99:>9.2f}{added or ' ' * 18}{rate:>17}"
            )
    return "\n".join(lines)


def verdict(paths: list[Route]) -> str:
    by = {(p.upstream, p.via): p for p in paths}
    out = []
    for upstream in ("runtime", "stand-in"):
        d, f, lite = by[(upstream, "direct")], by[(upstream, "frontier")], by[(upstream, "litellm")]
        for stream in (False, True):
            base = np.percentile(d.latency[stream], 50)
            fa, la = (
                np.percentile(f.latency[stream], 50) - base,
                np.percentile(lite.latency[stream], 50) - base,
            )
            out.append(
                f"GATEWAY_OVERHEAD upstream={upstream} mode={'stream' if stream else 'plain'} "
                f"frontier_added_p50_ms={fa:.2f} litellm_added_p50_ms={la:.2f}"
            )
        out.append(
            f"GATEWAY_RATE upstream={upstream} direct={d.rate:.0f} frontier={f.rate:.0f} litellm={lite.rate:.0f}"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=300, help="per path and mode, 20..100000 (default 300)"
    )
    parser.add_argument(
        "--step-s", type=float, default=3.0, help="seconds per rate step, 0.5..60 (default 3)"
    )
    parser.add_argument("--p99-bound-ms", type=float, default=250.0, help="1..10000 (default 250)")
    parser.add_argument("--standin", type=int, help=argparse.SUPPRESS)  # the stand-in's own process
    args = parser.parse_args()
    if args.standin is not None:
        asyncio.run(_serve_standin(args.standin))
        return 0
    for name, value, low, high in (
        ("--requests", args.requests, 20, 100_000),
        ("--step-s", args.step_s, 0.5, 60),
        ("--p99-bound-ms", args.p99_bound_ms, 1, 10_000),
    ):
        if not low <= value <= high:
            parser.error(f"{name} {value}: must be within {low}..{high}")
    from frontier_runtime.tiny import make_tiny_checkpoint

    litellm = litellm_venv()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        print("starting: runtime, stand-in, two Frontier gateways, two LiteLLM proxies", flush=True)
        model_dir = make_tiny_checkpoint(work / "model", seed=0)
        ports = {name: free_port() for name in ("runtime", "stand-in", "fr-rt", "fr-si", "ll-rt", "ll-si")}
        upstreams = {
            "runtime": f"http://127.0.0.1:{ports['runtime']}",
            "stand-in": f"http://127.0.0.1:{ports['stand-in']}",
        }
        procs: dict[str, tuple[subprocess.Popen, Path]] = {}

        def start(name: str, command: list[str], env: dict[str, str] | None = None) -> None:
            log = work / f"{name}.log"
            procs[name] = stack.enter_context(process(command, log, env)), log

        start("runtime", runtime_command(model_dir, work, ports["runtime"]), {"OMP_NUM_THREADS": "1"})
        start("stand-in", [sys.executable, __file__, "--standin", str(ports["stand-in"])])
        for name, upstream in (("fr-rt", "runtime"), ("fr-si", "stand-in")):
            start(name, gateway_command(upstreams[upstream], work, name, ports[name]))
        for name, upstream in (("ll-rt", "runtime"), ("ll-si", "stand-in")):
            command = litellm_command(litellm, upstreams[upstream], work, name, ports[name])
            start(name, command, {"LITELLM_LOG": "ERROR"})
        # A Frontier gateway is ready once its probe found its upstream ready.
        ready = {
            "runtime": "/health/ready",
            "stand-in": "/",
            "fr-rt": "/health/ready",
            "fr-si": "/health/ready",
        }
        for name, (proc, log) in procs.items():
            wait_http(f"http://127.0.0.1:{ports[name]}{ready.get(name, '/health/liveliness')}", proc, log)
        paths = [
            Route(f"{via} → {upstream}", upstream, via, f"http://127.0.0.1:{ports[port]}")
            for upstream, short in (("runtime", "rt"), ("stand-in", "si"))
            for via, port in (("direct", upstream), ("frontier", f"fr-{short}"), ("litellm", f"ll-{short}"))
        ]
        print(
            f"latency: {args.requests} one-token chat completions per path and mode, paths in turn",
            flush=True,
        )
        asyncio.run(measure_latency(paths, args.requests, stream=False))
        asyncio.run(measure_latency(paths, args.requests, stream=True))
        print(
            f"sustained rate: closed-loop steps of {args.step_s:g} s (rule: no error, p99 ≤ {args.p99_bound_ms:g} ms)",
            flush=True,
        )
        for path in paths:
            asyncio.run(measure_rate(path, args.step_s, args.p99_bound_ms))
    print()
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end (others' work included)"
    )
    print(table(paths))
    print(verdict(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
