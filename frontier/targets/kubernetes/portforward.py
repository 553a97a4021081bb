"""A local URL that reaches one pod's port through the API server, as ``kubectl port-forward`` does.

The canary's verification sends the runtime's own API key (``Authorization: Bearer``); the API
server's pod proxy cannot carry it (the server authenticates that header as its own and removes
it), so the verification set goes over port-forward streams instead: a listening socket on
127.0.0.1, and for each connection made to it one ``pods/portforward`` stream, bytes copied both
ways until either side closes.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.stream import portforward

CHUNK = 65536


@contextlib.contextmanager
def pod_tunnel(api: ApiClient, namespace: str, pod: str, port: int) -> Iterator[str]:
    """``http://127.0.0.1:<local port>`` reaching ``pod``'s ``port``, for the block."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)  # so the acceptor sees the block end
    core = CoreV1Api(api)
    done = threading.Event()

    def forward(client: socket.socket) -> None:
        with client:
            stream = portforward(core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port))
            try:
                _copy(client, stream.socket(port))
            finally:
                stream.close()

    def accept() -> None:
        while not done.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            threading.Thread(target=forward, args=(client,), daemon=True, name=f"forward {pod}").start()

    acceptor = threading.Thread(target=accept, daemon=True, name=f"port-forward {pod}:{port}")
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        listener.close()
        acceptor.join(timeout=5)


def _copy(a: Any, b: Any) -> None:
    """Bytes from each socket to the other until one side closes."""
    peers = {a: b, b: a}
    while True:
        readable, _, _ = select.select(list(peers), [], [], 60.0)
        if not readable:
            return
        for sock in readable:
            try:
                data = sock.recv(CHUNK)
            except OSError:
                return
            if not data:
                return
            peers[sock].sendall(data)
