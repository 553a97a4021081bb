"""What the app's routes share: the config, the engine once loaded, health, admission, metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from frontier_runtime.config import RuntimeConfig
from frontier_runtime.engine.api import EngineClient, EngineStats
from frontier_runtime.server.admission import Admission
from frontier_runtime.server.auth import ApiKeys
from frontier_runtime.server.health import Health
from frontier_runtime.server.metrics import ServerMetrics
from frontier_runtime.server.text import TextCodec

log = logging.getLogger("frontier_runtime.server")


@dataclass
class ServerState:
    config: RuntimeConfig
    health: Health
    admission: Admission
    metrics: ServerMetrics = field(init=False)
    engine: EngineClient | None = None
    codec: TextCodec | None = None
    # Replaced whole on every successful reload (never edited in place): see server/keys.py.
    api_keys: ApiKeys | None = None
    api_keys_loaded_at: float | None = None  # wall clock of the last successful load
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: int = 0
    idle: asyncio.Event | None = None

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(
            self.config.model.name,
            engine_stats=self.engine_stats,
            queue_state=lambda: (self.admission.running, self.admission.waiting),
            health_state=lambda: (self.health.ready()[0], self.health.draining),
            keys_state=lambda: (self.api_keys, self.api_keys_loaded_at),
        )

    def engine_stats(self) -> EngineStats | None:
        if self.engine is None:
            return None
        try:
            return self.engine.stats()
        except Exception:  # a scrape must never fail because the engine is busy or gone
            log.exception("engine.stats() failed")
            return None

    def attach(self, engine: EngineClient, codec: TextCodec) -> None:
        """Plug in the loaded engine; readiness still waits for ``health.warmed_up``."""
        self.engine = engine
        self.codec = codec
        self.health.weights_loaded = True
        self.health.heartbeat = lambda: engine.heartbeat
        self.health.engine_running = lambda: engine.is_running
