"""The rendered HAProxy config, run for real: a host that is going away costs clients nothing."""

from __future__ import annotations

import http.client
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from frontier.hosts.inventory import HostSpec
from frontier.targets import load_stack
from frontier.targets.local.balancer import HAProxyBalancer, render_haproxy


class _Backend(ThreadingHTTPServer):
    """Ready to health checks; answers POSTs 200, or 503 like a runtime that is draining."""

    daemon_threads = True

    def __init__(self, draining: bool) -> None:
        self.draining = draining
        self.posts = 0
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request, client_address) -> None:
        pass  # HAProxy hangs up on a 503 it retries elsewhere; that is expected


class _Handler(BaseHTTPRequestHandler):
    server: _Backend

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(200, b"ready")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts += 1
        self._answer(503 if self.server.draining else 200, b"draining" if self.server.draining else b"done")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def backends():
    servers = [_Backend(draining=True), _Backend(draining=False)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _wait_for_port(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"haproxy did not listen on {port}")


def test_requests_refused_by_a_draining_or_dead_host_are_retried_elsewhere(tmp_path, backends):
    draining, healthy = backends
    dead_port = _free_port()  # nothing listens: connection refused, as from a host that just stopped
    bind_port = _free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        render_haproxy(
            load_stack("local"),
            [
                ("draining", "127.0.0.1", draining.server_address[1]),
                ("healthy", "127.0.0.1", healthy.server_address[1]),
                ("dead", "127.0.0.1", dead_port),
            ],
            bind_port=bind_port,
            stats_socket=str(tmp_path / "admin.sock"),
        )
    )
    proc = subprocess.Popen(
        ["haproxy", "-db", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _wait_for_port(bind_port, proc)
        statuses = []
        for _ in range(12):
            conn = http.client.HTTPConnection("127.0.0.1", bind_port, timeout=10)
            conn.request("POST", "/v1/completions", body=b'{"prompt": "hi"}')
            statuses.append(conn.getresponse().status)
            conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert statuses == [200] * 12
    assert draining.posts > 0  # the draining host was tried and its 503s were retried
    assert healthy.posts == 12


def _post(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/completions", body=b'{"prompt": "hi"}')
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_weighted_split_sends_each_release_its_share_and_even_weights_restore_the_pool(tmp_path):
    # Two ready hosts behind the config a stack rolling by traffic share renders (weighted round
    # robin); the rollout's split goes through HAProxy's admin socket as during a rollout.
    servers = [_Backend(draining=False), _Backend(draining=False)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = load_stack("local")
    settings = settings.model_copy(
        update={"rollout": settings.rollout.model_copy(update={"traffic_steps": (25, 50, 100)})}
    )
    bind_port, socket_path = _free_port(), str(tmp_path / "admin.sock")
    config = tmp_path / "haproxy.cfg"
    names = [("new", servers[0]), ("old", servers[1])]
    config.write_text(
        render_haproxy(
            settings,
            [(name, "127.0.0.1", server.server_address[1]) for name, server in names],
            bind_port=bind_port,
            stats_socket=socket_path,
        )
    )
    new, old = (HostSpec(name, "127.0.0.1", 22, "/", "cpu") for name, _ in names)
    proc = subprocess.Popen(
        ["haproxy", "-db", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _wait_for_port(bind_port, proc)
        balancer = HAProxyBalancer(socket_path)
        deadline = time.monotonic() + 10
        while balancer.routable([new, old]) != ["new", "old"] and time.monotonic() < deadline:
            time.sleep(0.05)
        balancer.split([new], [old], 25)
        assert [_post(bind_port) for _ in range(40)] == [200] * 40
        at_25 = (servers[0].posts, servers[1].posts)
        balancer.split([new], [old], 100)
        routable_at_100 = balancer.routable([new, old])
        assert [_post(bind_port) for _ in range(10)] == [200] * 10
        at_100 = (servers[0].posts - at_25[0], servers[1].posts - at_25[1])
        balancer.even([new, old])
        routable_even = balancer.routable([new, old])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for server in servers:
            server.shutdown()
            server.server_close()
    assert at_25 == (10, 30)
    assert (routable_at_100, at_100) == (["new"], (10, 0))
    assert routable_even == ["new", "old"]
