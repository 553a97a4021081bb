"""Fixtures for the serving shell's tests: moto's threaded server, a tiny real model and engine, and
the runtime served by uvicorn on a real loopback socket (port 0)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from frontier_runtime.server.serve import build_engine
from frontier_runtime.server.text import TextCodec
from server_harness import TINY_SHAPE, RunningServer, runtime_config, servers

from tests.moto_server import moto_server, reset


@pytest.fixture(scope="session")
def moto_endpoint() -> str:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def aws_endpoint(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point every default boto3 client at moto's server through the standard environment."""
    reset(moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


# -- a real runtime on a real socket -------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from frontier_runtime.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"), seed=0, **TINY_SHAPE)


@pytest.fixture(scope="session")
def engine(tiny_model: Path) -> Iterator[Any]:
    """One engine for the whole session (loading it is the slow part); servers come and go around it."""
    eng = build_engine(runtime_config(tiny_model), tiny_model)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def codec(tiny_model: Path) -> TextCodec:
    return TextCodec.from_dir(tiny_model)


@pytest.fixture
def serve(engine: Any, codec: TextCodec, tiny_model: Path) -> Iterator[Any]:
    """``serve(api_keys=None, **config_overrides) -> RunningServer`` over the shared engine; stopped after the test."""
    with servers(engine, codec, tiny_model) as start:
        yield start


@pytest.fixture(scope="module")
def shared_server(engine: Any, codec: TextCodec, tiny_model: Path) -> Iterator[RunningServer]:
    """One default server for a module's tests that leave no state behind."""
    with servers(engine, codec, tiny_model) as start:
        yield start()
