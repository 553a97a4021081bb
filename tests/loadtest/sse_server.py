"""A small real HTTP server that streams server-sent events like an OpenAI-compatible runtime.

The request's ``model`` picks the behaviour, so one server covers every client path:

* any other model name — ``tokens`` chunks, ``gap_s`` apart after ``first_s``, a usage chunk, ``[DONE]``;
  keep-alive comments are interleaved to prove the client ignores them.
* ``busy`` — 429 with an OpenAI error body.
* ``truncate`` — two chunks, then the connection closes without ``[DONE]``.
* ``error`` — one chunk, then an ``{"error": ...}`` event.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no chunked encoding
    server: SseServer

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body, self.headers.get("Authorization")))
        behaviour = body["model"] if body["model"] in ("busy", "truncate", "error") else "ok"
        if behaviour == "busy":
            payload = json.dumps(
                {"error": {"message": "queue full", "type": "overloaded", "code": 429}}
            ).encode()
            self.send_response(429)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chat = self.path.endswith("/chat/completions")
        tokens = self.server.tokens if behaviour == "ok" else 2
        time.sleep(self.server.first_s)
        for i in range(tokens):
            if i:
                time.sleep(self.server.gap_s)
            self._event(self._chunk(f"t{i} ", chat))
            if i == 0:
                self.wfile.write(b": keep-alive\n\n")
        if behaviour == "truncate":
            return
        if behaviour == "error":
            self._event({"error": {"message": "engine failed", "type": "server_error"}})
            return
        usage = {"prompt_tokens": 7, "completion_tokens": tokens, "total_tokens": 7 + tokens}
        self._event({"id": "x", "object": "text_completion", "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    @staticmethod
    def _chunk(text: str, chat: bool) -> dict:
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        return {"id": "x", "object": "chunk", "choices": [choice]}

    def _event(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()


class SseServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *, tokens: int = 5, first_s: float = 0.05, gap_s: float = 0.01) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tokens, self.first_s, self.gap_s = tokens, first_s, gap_s
        self.requests: list[tuple[str, dict, str | None]] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> SseServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
