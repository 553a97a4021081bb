"""The server drives its engine only through ``EngineClient``: the real ``AsyncEngine`` is one, and
a scripted one reaches the failure paths a healthy model never takes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from frontier_runtime.engine.api import EngineClient, EngineDeadError
from frontier_runtime.server.text import TextCodec
from server_harness import ScriptedEngine, servers


def test_the_async_engine_is_an_engine_client(engine: Any) -> None:
    assert isinstance(engine, EngineClient)
    assert isinstance(ScriptedEngine(), EngineClient)


@pytest.fixture
def scripted(codec: TextCodec, tiny_model: Path) -> Iterator[Any]:
    """``scripted(engine) -> RunningServer`` serving a ``ScriptedEngine``; stopped after the test."""
    with ExitStack() as stack:
        yield lambda engine: stack.enter_context(servers(engine, codec, tiny_model))()


def _failures(url: str, reason: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'frontier_request_failures_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no failure series for {reason}")


def test_outputs_of_the_engine_become_the_response(scripted) -> None:
    engine = ScriptedEngine(tokens=(5, 6, 7))
    srv = scripted(engine)
    body = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}).json()
    assert body["choices"][0]["text"] == "<5><6><7>" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    assert len(engine.submitted) == 1 and engine.aborted == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_failure_mid_request_is_a_500_and_counted(scripted, stream: bool) -> None:
    srv = scripted(ScriptedEngine(stream_error=RuntimeError("boom"), fail_after=1))
    response = httpx.post(
        f"{srv.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream},
    )
    if stream:  # the 200 headers are out: the error travels as the last event
        assert response.status_code == 200 and '"code":"engine_error"' in response.text.replace(" ", "")
    else:
        assert response.status_code == 500 and response.json()["error"]["code"] == "engine_error"
    assert _failures(srv.url, "engine_error") == 1
    srv.wait_idle()
    assert srv.state.admission.running == 0


def test_a_dead_engine_is_a_503_and_fails_liveness(scripted) -> None:
    engine = ScriptedEngine(submit_error=EngineDeadError("the engine is shut down"))
    srv = scripted(engine)
    response = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert response.status_code == 503 and response.json()["error"]["code"] == "engine_unavailable"
    engine.running = False
    assert httpx.get(f"{srv.url}/health/live").status_code == 503
    assert "engine loop stuck" in httpx.get(f"{srv.url}/health/ready").json()["reasons"]


def test_an_engine_refusal_is_a_400(scripted) -> None:
    srv = scripted(ScriptedEngine(submit_error=ValueError("prompt token id 9 is outside the vocabulary")))
    response = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert response.status_code == 400 and "outside the vocabulary" in response.json()["error"]["message"]
