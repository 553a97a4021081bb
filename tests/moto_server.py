"""moto's threaded server for the tests that reach AWS the way a host or a process does: over a real
socket, through the standard ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from moto.server import ThreadedMotoServer


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's server on a free loopback port, for the block: its endpoint URL."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def reset(endpoint: str) -> None:
    """An empty account again: moto's backends live in this process, shared by every server."""
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).read()
