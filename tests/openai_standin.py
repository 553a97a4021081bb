"""What a runtime answers on its API port, where the tests simulate the hosts or pods it runs on.

The fake API server's pods (tests/kubernetes/fake_apiserver.py) and moto's EC2 instances have no
runtime behind them. This stands in for one on a real socket: it checks the runtime's bearer key and
answers chat and completion requests in OpenAI's shape with one fixed text (``answer``), or 500s
(``answer=None``), so a verification set can pass, fail, or tell two "releases" apart.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "pod-runtime-key"


@contextmanager
def openai_standin(answer: str | None) -> Iterator[tuple[str, int]]:
    """A server on a free loopback port for the block: its address."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                return self._send(401, {"error": {"message": "Missing or invalid API key"}})
            if answer is None:
                return self._send(500, {"error": {"message": "the engine failed"}})
            words = answer.split(" ")
            usage = {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)}
            tokens = [w if i == 0 else " " + w for i, w in enumerate(words)]
            if self.path.endswith("/chat/completions"):
                logprobs = {"content": [{"token": t, "logprob": 0.0} for t in tokens]}
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "logprobs": logprobs,
                }
            else:
                choice = {"index": 0, "text": answer, "logprobs": {"tokens": tokens}}
            choice["finish_reason"] = "length"
            body = {
                "id": "x",
                "object": "completion",
                "created": 0,
                "model": request.get("model"),
                "usage": usage,
            }
            return self._send(200, {**body, "choices": [choice]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
