"""A real runtime on a real loopback socket for tests: config builder, an in-thread server, and a
scripted engine for the server's failure paths."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from frontier_runtime.config import RuntimeConfig, parse_config
from frontier_runtime.engine.api import EngineClient, EngineStats
from frontier_runtime.requests import RequestOutput, SamplingParams
from frontier_runtime.server.app import create_app
from frontier_runtime.server.serve import Loaded, RuntimeServer, new_state, uvicorn_config
from frontier_runtime.server.state import ServerState

MODEL = "tiny-test"
ENGINE_MAX_SEQ_LEN = 256
# Small enough to build fast and step in a few milliseconds on two cores; real weights, real torch.
TINY_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}


class ScriptedEngine:
    """An ``EngineClient`` without a model: every request gets ``tokens`` (one per output, then
    finish reason "length"), unless ``submit_error`` is raised at submit or ``stream_error``
    after ``fail_after`` outputs."""

    def __init__(
        self,
        tokens: tuple[int, ...] = (5, 6, 7),
        *,
        submit_error: Exception | None = None,
        stream_error: Exception | None = None,
        fail_after: int = 0,
    ) -> None:
        self.tokens = tokens
        self.submit_error = submit_error
        self.stream_error = stream_error
        self.fail_after = fail_after
        self.running = True
        self.submitted: list[str] = []
        self.aborted: list[str] = []

    @property
    def heartbeat(self) -> float:
        return time.monotonic()

    @property
    def is_running(self) -> bool:
        return self.running

    @property
    def replica_lost(self) -> str | None:
        return None

    def submit(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        if self.submit_error is not None:
            raise self.submit_error
        self.submitted.append(request_id)
        return self._stream(request_id, len(prompt_token_ids))

    async def _stream(self, request_id: str, prompt_tokens: int) -> AsyncIterator[RequestOutput]:
        for i, token in enumerate(self.tokens):
            if self.stream_error is not None and i == self.fail_after:
                raise self.stream_error
            last = i == len(self.tokens) - 1
            yield RequestOutput(
                request_id=request_id,
                new_token_ids=[token],
                new_text=f"<{token}>",
                finished=last,
                finish_reason="length" if last else None,
                prompt_tokens=prompt_tokens,
                completion_tokens=i + 1,
            )

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 1, 1, 0, 0, 0, 0, 0, 0)

    def warmup(self, timeout_s: float = 600.0) -> float:
        return 0.0

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self.running = False


def push_weights(s3: Any, model_dir: Path, bucket: str, prefix: str = "tiny", version: str = "v1") -> None:
    """``model_dir`` as ``fab weights.push`` leaves a version in S3: every file, then its manifest."""
    from frontier_runtime.storage.manifest import MANIFEST_NAME, build_manifest

    manifest = build_manifest(model_dir, model=MODEL, version=version)
    for entry in manifest.files:
        s3.upload_file(str(model_dir / entry.path), bucket, f"{prefix}/{version}/{entry.path}")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{version}/{MANIFEST_NAME}", Body=manifest.to_json().encode())


def weights_start_document(weights_uri: str, cache_dir: Path) -> dict[str, Any]:
    """A CPU runtime.yaml loading version v1 of ``weights_uri`` through the host cache ``cache_dir``."""
    return {
        "model": {"name": MODEL, "weights_uri": weights_uri, "version": "v1", "max_seq_len": 128},
        "weights_cache_dir": str(cache_dir),
        "cpu_kv_cache_bytes": 4 * 1024 * 1024,
        "device": "cpu",
    }


def runtime_config(model_dir: Path | str, **overrides: Any) -> RuntimeConfig:
    """A runtime.yaml for tests; ``overrides`` are paths with ``__`` between levels, e.g.
    ``max_concurrency=2`` or ``batch__max_batch_size=2``."""
    data: dict[str, Any] = {
        "model": {"name": MODEL, "weights_uri": str(model_dir), "max_seq_len": ENGINE_MAX_SEQ_LEN},
        "keepalive_s": 15.0,
        "max_concurrency": 8,
        "queue": {"max_length": 16, "timeout_ms": 30_000},
        "batch": {"window_ms": 0, "max_batch_size": 8, "max_num_batched_tokens": 512},
        "cpu_kv_cache_bytes": 16 * 1024 * 1024,
        "block_size": 16,
        "drain_timeout_s": 20,
        "device": "cpu",
    }
    for dotted, value in overrides.items():
        *sections, key = dotted.split("__")
        at = data
        for section in sections:
            at = at.setdefault(section, {})
        at[key] = value
    return parse_config(yaml.safe_dump(data))


@dataclass
class RunningServer:
    url: str
    state: ServerState
    server: RuntimeServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no request is in flight and the engine holds no sequence."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.state.engine.stats()
            quiet = self.state.in_flight == 0 and stats.running == 0 and stats.waiting == 0
            if quiet and stats.kv_blocks_free == stats.kv_blocks_total:
                return
            time.sleep(0.02)
        raise AssertionError(
            f"server not idle: in_flight={self.state.in_flight} stats={self.state.engine.stats()}"
        )


def start_server(config: RuntimeConfig, loader: Any) -> RunningServer:
    state = new_state(config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = RuntimeServer(
        uvicorn_config(create_app(state), "127.0.0.1", port), state, loader, owns_engine=False
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (state.health.warmed_up and server.started):
        if server.exit_code or not thread.is_alive():
            raise RuntimeError("test server failed to start")
        if time.monotonic() > deadline:
            raise TimeoutError("test server did not become ready")
        time.sleep(0.01)
    return RunningServer(f"http://127.0.0.1:{port}", state, server, thread)


@contextmanager
def servers(engine: EngineClient, codec: Any, tiny_model: Path) -> Iterator[Any]:
    """Start servers over one shared engine with ``start(api_keys=None, **overrides)``; stop them all on exit."""
    running: list[RunningServer] = []

    def _start(api_keys: Any = None, **overrides: Any) -> RunningServer:
        config = runtime_config(tiny_model, **overrides)
        srv = start_server(config, lambda: Loaded(engine=engine, codec=codec, api_keys=api_keys))
        running.append(srv)
        return srv

    try:
        yield _start
    finally:
        for srv in running:
            srv.stop()
            srv.wait_idle()


class HeldSlots:
    """Engine slots taken straight from the server's admission controller, on its own event loop,
    so a test can keep the server "full" for exactly as long as it needs, independent of how fast
    the engine happens to generate on this machine."""

    def __init__(self, srv: RunningServer, count: int) -> None:
        self.srv = srv
        self.count = count
        self.tickets: list[Any] = []

    def _run(self, fn: Any) -> Any:
        import asyncio

        async def on_loop() -> Any:
            return fn()

        loop = self.srv.server._loop
        return asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout=10)

    def __enter__(self) -> HeldSlots:
        self.tickets = self._run(lambda: [self.srv.state.admission.try_enter() for _ in range(self.count)])
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(lambda: [t.release() for t in self.tickets])
