"""Admission over HTTP: fast 429s past the queue, 503 after the queue timeout, and clients that
leave (queued, streaming, or waiting for a whole answer) abort their sequence and free its blocks."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Callable

import httpx
from server_harness import HeldSlots, RunningServer

LONG = {"prompt": "the", "max_tokens": 200, "temperature": 0, "ignore_eos": True}


def _metric(srv: RunningServer, name: str, labels: str = "") -> float:
    text = httpx.get(f"{srv.url}/metrics").text
    pattern = re.escape(name + (f"{{{labels}}}" if labels else "")) + r"(?:\{[^}]*\})? ([0-9.e+-]+)"
    values = [float(v) for v in re.findall(pattern, text)]
    assert values, f"{name}{{{labels}}} not exported"
    return sum(values)


def _wait(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _open(srv: RunningServer, body: dict, path: str = "/v1/completions") -> socket.socket:
    """Send a request on a raw socket and leave the answer unread (so the test can hang up)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def _engine_busy(srv: RunningServer) -> bool:
    stats = srv.state.engine.stats()
    return stats.running > 0 and stats.kv_blocks_free < stats.kv_blocks_total


def test_past_slots_and_queue_exactly_the_excess_gets_immediate_429s(serve) -> None:
    C, Q, K = 2, 2, 3
    srv = serve(max_concurrency=C, batch__max_batch_size=C, queue__max_length=Q)

    async def fire() -> list[tuple[float, httpx.Response]]:
        limits = httpx.Limits(max_connections=C + Q + K)
        async with httpx.AsyncClient(base_url=srv.url, timeout=60, limits=limits) as client:
            start = time.monotonic()

            async def one() -> tuple[float, httpx.Response]:
                response = await client.post("/v1/completions", json=LONG)
                return time.monotonic() - start, response

            return await asyncio.gather(*(one() for _ in range(C + Q + K)))

    results = asyncio.run(fire())
    refused = [(t, r) for t, r in results if r.status_code == 429]
    served = [(t, r) for t, r in results if r.status_code == 200]
    assert len(refused) == K and len(served) == C + Q, [r.status_code for _, r in results]
    assert max(t for t, _ in refused) < min(t for t, _ in served), "a 429 must not wait for the work ahead"
    for _, r in refused:
        assert r.json()["error"]["code"] == "queue_full" and int(r.headers["retry-after"]) >= 1
    assert all(r.json()["usage"]["completion_tokens"] == LONG["max_tokens"] for _, r in served)
    assert _metric(srv, "frontier_request_failures_total", 'reason="queue_full"') == K
    assert _metric(srv, "frontier_http_requests_total", 'route="/v1/completions",status="429"') == K


def test_a_request_queued_past_the_timeout_gets_503_and_never_starts(serve) -> None:
    srv = serve(max_concurrency=1, batch__max_batch_size=1, queue__timeout_ms=300)
    with HeldSlots(srv, 1):
        started = time.monotonic()
        late = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "never", "max_tokens": 2}, timeout=60)
        waited = time.monotonic() - started
    error = late.json()["error"]
    assert late.status_code == 503 and error["code"] == "queue_timeout" and late.headers["retry-after"]
    assert waited >= 0.3
    assert _metric(srv, "frontier_request_failures_total", 'reason="queue_timeout"') == 1
    # Never admitted, never in the engine: no queue-time observation, no prompt tokens.
    assert _metric(srv, "vllm:request_queue_time_seconds_count") == 0
    assert _metric(srv, "vllm:prompt_tokens_total") == 0


def test_a_stream_queued_beyond_the_keepalive_gets_comments_then_its_tokens(serve) -> None:
    srv = serve(
        max_concurrency=1,
        batch__max_batch_size=1,
        queue__timeout_ms=20_000,
        keepalive_s=0.1,
    )
    body = {"prompt": "x", "max_tokens": 3, "stream": True}
    held = HeldSlots(srv, 1).__enter__()
    with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=60) as response:
        chunks = response.iter_raw()
        first = next(chunks)  # headers and a keep-alive arrive while the slot is still held
        held.__exit__()
        raw = (first + b"".join(chunks)).decode()
    assert response.status_code == 200
    assert raw.startswith(": keep-alive\n\n")
    events = [line for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert sum(1 for e in events[:-1] if json.loads(e[6:])["choices"][0]["text"] is not None) >= 1


def test_a_stream_that_times_out_after_its_headers_ends_with_an_error_event(serve) -> None:
    srv = serve(
        max_concurrency=1,
        batch__max_batch_size=1,
        queue__timeout_ms=400,
        keepalive_s=0.1,
    )
    with (
        HeldSlots(srv, 1),
        httpx.stream(
            "POST", f"{srv.url}/v1/completions", json={"prompt": "x", "stream": True}, timeout=60
        ) as r,
    ):
        raw = b"".join(r.iter_raw()).decode()
    events = [e for e in raw.split("\n\n") if e.startswith("data: ")]
    assert r.status_code == 200 and ": keep-alive" in raw
    assert json.loads(events[0][6:])["error"]["code"] == "queue_timeout"
    assert events[-1] == "data: [DONE]"


def test_hanging_up_on_a_unary_request_aborts_it_and_frees_its_blocks(serve) -> None:
    srv = serve()
    sock = _open(srv, LONG)
    _wait(lambda: _engine_busy(srv), what="sequence running")
    sock.close()
    srv.wait_idle(timeout=5)
    assert _metric(srv, "frontier_request_failures_total", 'reason="client_disconnect"') == 1
    assert _metric(srv, "vllm:request_success_total") == 0
    assert _metric(srv, "vllm:generation_tokens_total") < LONG["max_tokens"]


def test_hanging_up_on_a_stream_aborts_it_and_frees_its_blocks(serve) -> None:
    srv = serve()
    sock = _open(srv, {**LONG, "stream": True})
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    assert _engine_busy(srv)
    sock.close()
    srv.wait_idle(timeout=5)
    assert _metric(srv, "frontier_request_failures_total", 'reason="client_disconnect"') == 1
    assert _metric(srv, "vllm:request_success_total") == 0


def test_hanging_up_while_queued_gives_the_place_back_and_never_runs(serve) -> None:
    srv = serve(max_concurrency=1, batch__max_batch_size=1)
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        first = _open(srv, {**LONG, "max_tokens": 60})
        _wait(lambda: srv.state.admission.running == 1, what="first admitted")
        queued = _open(srv, {"prompt": "queued", "max_tokens": 5, "stream": True})
        _wait(lambda: srv.state.admission.waiting == 1, what="second queued")
        queued.close()
        _wait(lambda: srv.state.admission.waiting == 0, timeout=5, what="queue place given back")
        first.close()
        srv.wait_idle(timeout=5)
        after = client.post("/v1/completions", json={"prompt": "next", "max_tokens": 2})
    assert after.status_code == 200
    assert _metric(srv, "frontier_request_failures_total", 'reason="client_disconnect"') == 2
    assert _metric(srv, "vllm:request_success_total") == 1  # only the request sent afterwards


def test_a_refused_request_is_never_tokenised(serve, monkeypatch) -> None:
    srv = serve(max_concurrency=1, batch__max_batch_size=1, queue__max_length=0)
    encoded: list[str] = []
    real_encode = srv.state.codec.encode
    monkeypatch.setattr(
        srv.state.codec, "encode", lambda text, **kw: encoded.append(text) or real_encode(text, **kw)
    )
    with HeldSlots(srv, 1):
        refused = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "refused prompt", "max_tokens": 1})
        chat = httpx.post(
            f"{srv.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "no"}]}
        )
    assert refused.status_code == chat.status_code == 429
    assert encoded == []
    assert (
        httpx.post(f"{srv.url}/v1/completions", json={"prompt": "served", "max_tokens": 1}).status_code == 200
    )
    assert encoded == ["served"]
