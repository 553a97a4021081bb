"""The rendered HAProxy config, run for real: a host that is going away costs clients nothing."""

from __future__ import annotations

import http.client
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from frontier.targets import load_stack
from frontier.targets.local.balancer import render_haproxy


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
