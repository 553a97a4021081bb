"""What the verification tests share besides fixtures: the served model and a socket's state."""

from __future__ import annotations

import socket

MODEL = "tiny-verify"
# The context the runtime serves (tests/gateway/harness.runtime_yaml's max_seq_len).
CONTEXT = 512
SHAPE = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": CONTEXT,
}


def connected(sock: socket.socket) -> bool:
    """Whether anything connected to the listening ``sock`` (without waiting)."""
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def url_of(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}"
