"""What keeps the gateway's hop cheap: kept-alive upstream connections, TCP_NODELAY on every socket,
and per-request work that does not grow with the traffic already served.

Real sockets throughout: the gateway under uvicorn, stand-in runtimes, and small raw TCP servers
where a replica has to misbehave in a way the stand-in cannot."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from frontier_gateway.breaker import Breaker, State
from frontier_gateway.config import BreakerConfig
from frontier_gateway.serve import listen
from frontier_gateway.upstream import Upstream, UpstreamError
from frontier_hostside import names

from tests.gateway.harness import StandIn, gateway_config, running_gateway, tenant

KEY = "sk-acme-0123456789"
ANSWER = b'{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'


def _complete(url: str, *, stream: bool = False) -> httpx.Response:
    return httpx.post(
        url + names.COMPLETIONS_PATH,
        json={"model": "m", "prompt": "hi", "max_tokens": 1, "stream": stream},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )


@pytest.mark.e2e
def test_upstream_connections_are_reused_across_requests(tmp_path: Path) -> None:
    standin = StandIn("a")
    config = gateway_config({"m": [standin.url]}, [tenant("acme", KEY, ["m"])], tmp_path / "m.jsonl")
    try:
        with running_gateway(config) as gw:
            for _ in range(5):
                assert _complete(gw.url).status_code == 200
    finally:
        standin.close()
    assert len(standin.peers) == 5
    assert len(set(standin.peers)) == 1  # all five came over one connection


def test_the_gateways_listening_socket_sets_tcp_nodelay_on_accepted_connections() -> None:
    server = listen("127.0.0.1", 0)
    server.listen()
    with server, socket.create_connection(server.getsockname()):
        accepted, _ = server.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert accepted.proto == socket.IPPROTO_TCP  # what asyncio's loop checks before it sets it


def test_asyncio_open_connection_sets_tcp_nodelay() -> None:
    """The upstream client relies on asyncio to set TCP_NODELAY on its connections."""
    server = listen("127.0.0.1", 0)
    server.listen()

    async def connect() -> int:
        _, writer = await asyncio.open_connection(*server.getsockname())
        nodelay = writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()
        return nodelay

    with server:
        assert asyncio.run(connect()) == 1


@contextmanager
def _one_answer_per_connection() -> Iterator[tuple[str, list[int]]]:
    """A replica that answers one request per connection and then closes it without saying so
    (no ``connection: close``): what a replica whose keep-alive ran out looks like."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(1)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        server.close()


def test_a_kept_alive_connection_the_replica_closed_meanwhile_costs_no_failed_request() -> None:
    async def two_requests(url: str) -> list[bytes]:
        async with Upstream(connect_timeout_s=2, read_timeout_s=5) as upstream:
            bodies = []
            for _ in range(2):
                answer = await upstream.post(url + "/v1/completions", {"host": "replica"}, b"{}")
                bodies.append(await answer.read())
            return bodies

    with _one_answer_per_connection() as (url, accepted):
        assert asyncio.run(two_requests(url)) == [ANSWER, ANSWER]
    assert len(accepted) == 2


def test_a_replica_that_breaks_off_its_answer_raises_upstream_error() -> None:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"id":')

    threading.Thread(target=serve, daemon=True).start()

    async def request() -> bytes:
        async with Upstream(connect_timeout_s=2, read_timeout_s=5) as upstream:
            url = f"http://127.0.0.1:{server.getsockname()[1]}/v1/completions"
            answer = await upstream.post(url, {"host": "replica"}, b"{}")
            return await answer.read()

    with server, pytest.raises(UpstreamError, match="short of its answer"):
        asyncio.run(request())


def test_a_failure_that_left_the_window_no_longer_counts_toward_the_error_rate() -> None:
    now = [1000.0]
    config = BreakerConfig(window_s=10, error_rate=0.5, min_requests=4, cool_off_s=5)
    breaker = Breaker(config, "r1", lambda: now[0])
    for status in (500, 500, 500):  # three failures: fewer than min_requests answers
        breaker.record(status)
    now[0] += 11  # they leave the window
    for status in (200, 200, 500, 200):  # one failure in four: under the error rate
        breaker.record(status)
    assert breaker.state is State.CLOSED
