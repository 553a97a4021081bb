"""Run the runtime: listen at once, load in the background, drain on SIGTERM, exit 0.

The socket opens before the weights are fetched so that liveness answers (and readiness explains
what it is waiting for) during a long download or warm-up. Loading order: API keys (quick, and a
bad secret should stop the start at once) → weights (S3 + manifest, or a local directory) →
tokenizer → engine → warm-up forward → ready. Any failure there stops the process with exit code 1
and a message naming what failed.

API keys are read again every ``api_keys_reload_s`` and at once on SIGHUP (server/keys.py), so a
key is rotated or revoked by writing the secret, without a restart.

SIGTERM starts a drain instead of uvicorn's immediate close: readiness fails at once (the
balancer stops sending), new requests get 503 with ``Connection: close``, and the process exits
0 once the in-flight requests are done or ``drain.timeout_s`` has passed. A second SIGTERM or
SIGINT exits without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from frontier_hostside import names
from starlette.types import ASGIApp

from frontier_runtime.config import RuntimeConfig
from frontier_runtime.engine.api import EngineClient
from frontier_runtime.server.admission import Admission
from frontier_runtime.server.app import create_app
from frontier_runtime.server.auth import ApiKeys
from frontier_runtime.server.health import Health
from frontier_runtime.server.keys import KeyReloader
from frontier_runtime.server.probe import remove_probe_file, write_probe_file
from frontier_runtime.server.state import ServerState
from frontier_runtime.server.text import TextCodec

log = logging.getLogger("frontier_runtime.serve")

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_NODE_LOST = names.EXIT_NODE_LOST
REPLICA_LOST_GRACE_S = 1.0


@dataclass
class Loaded:
    engine: EngineClient
    codec: TextCodec
    api_keys: ApiKeys | None
    #: Run once the engine is ready, off the request path: publishes the prepared weights it made
    #: and the kernels it compiled.
    after_ready: Callable[[], None] | None = None


#: Told of each start phase as it ends: (phase, seconds); see metrics.START_PHASES.
PhaseSink = Callable[[str, float], None]


def _no_phases(phase: str, seconds: float) -> None:
    """The sink of a loader run without a server (tests, tools): phases are not recorded."""


def phase_recorder(state: ServerState) -> PhaseSink:
    """Each phase as one log line and as ``frontier_start_phase_seconds{phase}`` on /metrics."""

    def record(phase: str, seconds: float) -> None:
        state.metrics.start_phase(phase, seconds)
        log.info(
            f"start phase {phase}: {seconds:.3f} s",
            extra={"event": "start_phase", "phase": phase, "seconds": round(seconds, 3)},
        )

    return record


def new_state(config: RuntimeConfig) -> ServerState:
    return ServerState(
        config=config,
        health=Health(stuck_after_s=config.health.stuck_after_s),
        admission=Admission(
            config.max_concurrency,
            config.queue.max_length,
            config.queue.timeout_ms / 1000.0,
            batch_queue_max_length=config.queue.batch_max_length,
            batch_queue_timeout_s=None
            if config.queue.batch_timeout_ms is None
            else config.queue.batch_timeout_ms / 1000.0,
        ),
    )


def resolve_model_dir(config: RuntimeConfig, model_dir: Path | None, phase: PhaseSink = _no_phases) -> Path:
    """Where the weights lie locally: ``--model-dir``, a local ``model.source``, or the verified S3 cache."""
    if model_dir is not None:
        return model_dir
    from frontier_runtime.storage.weights import fetch_weights, is_s3_uri

    if not is_s3_uri(config.model.weights_uri):
        return Path(config.model.weights_uri)
    report = fetch_weights(
        config.model.weights_uri,
        config.model.version,
        Path(config.weights_cache_dir),
        concurrency=config.weights_fetch_concurrency,
    )
    phase("fetch", report.fetch_seconds)
    phase("verify", report.verify_seconds)
    return report.model_dir


def load_runtime(config: RuntimeConfig, model_dir: Path | None, phase: PhaseSink = _no_phases) -> Loaded:
    """Everything slow and fallible at start, in order; blocking (run it in a thread)."""
    api_keys = None
    if config.api_keys_secret:
        from frontier_runtime.storage.secrets import load_api_keys

        api_keys = ApiKeys(load_api_keys(config.api_keys_secret))
    from frontier_runtime.server import warm_start

    if model_dir is not None or config.ranks > 1:
        # An explicit directory is loaded as it is; ranks in other processes each load their own
        # slice, so a replica of several has no single prepared file to map.
        directory = resolve_model_dir(config, model_dir, phase)
        _check_tokenizer(directory)
        # Before any rank compiles (they inherit the directory); an explicit directory is a host's own.
        kernels = warm_start.kernels(config, remote=model_dir is None)
        started = time.monotonic()
        codec = TextCodec.from_dir(directory)
        engine = build_engine(config, directory)
        phase("load", time.monotonic() - started)
        return Loaded(engine=engine, codec=codec, api_keys=api_keys, after_ready=_after_ready(kernels.publish))
    source = warm_start.model_source(config, phase)
    _check_tokenizer(source.model_dir)
    kernels = warm_start.kernels(config)
    started = time.monotonic()
    codec = TextCodec.from_dir(source.model_dir)
    engine, publish_prepared = warm_start.build(config, source, build_engine)
    phase("load", time.monotonic() - started)
    return Loaded(
        engine=engine, codec=codec, api_keys=api_keys, after_ready=_after_ready(publish_prepared, kernels.publish)
    )


def _after_ready(*steps: Callable[[], object] | None) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            if step is not None:
                step()

    return run


def _check_tokenizer(directory: Path) -> None:
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(f"model directory {directory} has no tokenizer.json")


def build_engine(config: RuntimeConfig, model_dir: Path) -> EngineClient:
    from frontier_runtime.engine.loop import AsyncEngine

    return AsyncEngine.from_config(config, model_dir)


class RuntimeServer(uvicorn.Server):
    """uvicorn with a drain on SIGTERM and the runtime's own start-up sequence."""

    def __init__(
        self,
        config: uvicorn.Config,
        state: ServerState,
        loader: Callable[[], Loaded],
        *,
        owns_engine: bool = True,
    ) -> None:
        super().__init__(config)
        self.state = state
        self.loader = loader
        self.owns_engine = owns_engine
        self.exit_code = EXIT_OK
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._reload_keys = asyncio.Event()
        self._reloading: asyncio.Future[None] | None = None
        # The "ready" phase counts from here (uvicorn's own ``started`` says the sockets listen).
        self.created = time.monotonic()

    # uvicorn calls this from its signal handler (main thread).
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.state.health.draining or self.should_exit:
            log.warning(
                "second signal: exiting without waiting", extra={"event": "force_exit", "signal": sig}
            )
            self.should_exit = True
            self.force_exit = True
            return
        self.begin_drain(f"signal {signal.Signals(sig).name}")

    def begin_drain(self, why: str) -> None:
        self.state.health.draining = True  # readiness fails from this instant
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._spawn, self._drain(why))
        else:
            self.should_exit = True

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, why: str) -> None:
        state = self.state
        timeout = state.config.drain_timeout_s
        started = time.monotonic()
        log.info(
            "draining",
            extra={"event": "drain_start", "reason": why, "in_flight": state.in_flight, "timeout_s": timeout},
        )
        assert state.idle is not None
        if state.in_flight:
            try:
                await asyncio.wait_for(state.idle.wait(), timeout=timeout)
            except TimeoutError:
                log.warning(
                    "drain timeout: aborting what is left",
                    extra={"event": "drain_timeout", "in_flight": state.in_flight, "timeout_s": timeout},
                )
        log.info(
            "drained",
            extra={
                "event": "drain_done",
                "seconds": round(time.monotonic() - started, 3),
                "in_flight": state.in_flight,
            },
        )
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self.state.idle = asyncio.Event()
        self.state.idle.set()
        self._reload_keys = asyncio.Event()
        if threading.current_thread() is threading.main_thread():
            # SIGHUP's default action ends the process; here it means "read the keys again now".
            self._loop.add_signal_handler(signal.SIGHUP, self._reload_keys.set)
        await super().startup(sockets=sockets)
        health = self.state.config.health
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                log.info("listening", extra={"event": "listening", "host": host, "port": port})
                write_probe_file(host, port, health.liveness_path, health.readiness_path)
        self._spawn(self._load())

    async def _load(self) -> None:
        try:
            loaded = await asyncio.to_thread(self.loader)
            self.state.api_keys = loaded.api_keys
            self.state.api_keys_loaded_at = time.time() if loaded.api_keys is not None else None
            secret_id = self.state.config.api_keys_secret
            if secret_id and loaded.api_keys is not None:
                reloader = KeyReloader(self.state, secret_id)
                self._reloading = asyncio.ensure_future(
                    reloader.run_forever(self.state.config.api_keys_reload_s, self._reload_keys)
                )
            self.state.attach(loaded.engine, loaded.codec)
            if self.state.config.ranks > 1:  # one rank alone has no other to lose
                self._spawn(self._watch_replica(loaded.engine))
            started = time.monotonic()
            # The warm-up blocks until one real forward is done: keep it off the loop.
            await asyncio.to_thread(loaded.engine.warmup)
            self.state.health.warmed_up = True
            record = phase_recorder(self.state)
            record("warmup", time.monotonic() - started)
            record("ready", time.monotonic() - self.created)
            if loaded.after_ready is not None:
                self._spawn(asyncio.to_thread(loaded.after_ready))
            stats = loaded.engine.stats()
            log.info(
                f"ready: attention backend {stats.attention_backend}, kernels {stats.kernels}"
                + (f", interconnect {stats.interconnect_bus_gbps:.2f} GB/s" if stats.interconnect_bus_gbps else ""),
                extra={
                    "event": "ready",
                    "warmup_s": round(time.monotonic() - started, 3),
                    "model": self.state.config.model.name,
                    "attention_backend": stats.attention_backend,
                    "kernels": stats.kernels,
                },
            )
        except Exception as exc:
            log.error(f"start-up failed: {exc}", extra={"event": "startup_failed", "error": str(exc)})
            self.exit_code = EXIT_START_FAILED
            self.should_exit = True

    async def _watch_replica(self, engine: EngineClient) -> None:
        """Exit ``EXIT_NODE_LOST`` once the replica lost a rank: the engine already answers 503 and
        fails its probes; a restart (by this process's supervisor) waits for every node again."""
        while not self.should_exit:
            why = engine.replica_lost
            if why is not None:
                log.error(
                    f"the replica lost a rank: {why}; exiting for a restart",
                    extra={"event": "replica_lost", "reason": why},
                )
                self.state.health.draining = True
                await asyncio.sleep(REPLICA_LOST_GRACE_S)  # the 503s already on their way go out
                self.exit_code = EXIT_NODE_LOST
                self.should_exit = True
                return
            await asyncio.sleep(0.2)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.health.draining = True
        if self._reloading is not None:
            self._reloading.cancel()
        remove_probe_file()
        await super().shutdown(sockets=sockets)
        engine = self.state.engine
        if self.owns_engine and engine is not None:
            try:
                engine.shutdown()
            except Exception:
                log.exception("engine shutdown failed")
            from frontier_runtime.server import warm_start

            warm_start.let_go()  # the prepared entry it mapped is another start's to evict now


def uvicorn_config(app: ASGIApp, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        # The drain already waited for in-flight requests; this is only for the last bytes.
        timeout_graceful_shutdown=2,
        timeout_keep_alive=75,  # outlive a balancer's 60 s idle timeout, never the other way round
        server_header=False,
        h11_max_incomplete_event_size=64 * 1024,
    )


def serve(
    config: RuntimeConfig, *, host: str | None = None, port: int | None = None, model_dir: Path | None = None
) -> int:
    """Run until drained; return the process exit code."""
    state = new_state(config)
    app = create_app(state)
    server = RuntimeServer(
        uvicorn_config(app, host or config.host, config.port if port is None else port),
        state,
        loader=lambda: load_runtime(config, model_dir, phase_recorder(state)),
    )
    server.run()
    return server.exit_code
