"""Fixtures: stand-in runtimes, real runtime processes of two tiny models of different shapes, and a
real redis-server for the shared quota store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.harness import RuntimeProcess, StandIn, redis_server, start_runtime, wait_ready

# Two different shapes, so routing to the wrong pool would show (different vocab use, speed).
SHAPE_A = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}
SHAPE_B = {
    "hidden_size": 96,
    "num_layers": 3,
    "num_heads": 6,
    "num_kv_heads": 3,
    "intermediate_size": 192,
    "max_position_embeddings": 512,
}


@pytest.fixture
def standins() -> Iterator[dict[str, StandIn]]:
    servers = {name: StandIn(name) for name in ("a1", "a2", "b1")}
    yield servers
    for server in servers.values():
        server.close()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from frontier_runtime.tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("gateway-models")
    return {
        "tiny-a": make_tiny_checkpoint(root / "tiny-a", seed=1, **SHAPE_A),
        "tiny-b": make_tiny_checkpoint(root / "tiny-b", seed=2, **SHAPE_B),
    }


@pytest.fixture(scope="module")
def runtimes(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[RuntimeProcess]]:
    """Three real runtime processes: tiny-a twice, tiny-b once."""
    work = tmp_path_factory.mktemp("gateway-runtimes")
    procs = [
        start_runtime("tiny-a", tiny_models["tiny-a"], work),
        start_runtime("tiny-a", tiny_models["tiny-a"], work),
        start_runtime("tiny-b", tiny_models["tiny-b"], work),
    ]
    try:
        wait_ready(procs)
        yield procs
    finally:
        for proc in procs:
            proc.kill()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server of its own on a free loopback port, nothing persisted."""
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"
