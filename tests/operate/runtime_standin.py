"""A stand-in for ``frontier_runtime`` in the host agent's tests: a real process and HTTP server.

The agent starts ``python -m frontier_runtime serve --config X --host H --port P`` with the
release's ``site/`` first on PYTHONPATH; the tests put this file there as
``frontier_runtime/__main__.py``. It answers the readiness and liveness paths and ``/metrics``
like the runtime, and drains on SIGTERM. Its ``runtime.yaml`` (JSON, which YAML reads too) says
how to misbehave:

    mode          "serve" (default), "die" (exit 1 at start-up), "never-ready", "ignore-term"
    hang_file     while this file exists, liveness answers 503 (a hung runtime)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("verb")
    parser.add_argument("--config", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = json.loads(Path(args.config).read_text())
    mode = config.get("mode", "serve")
    print(f"stand-in runtime pid {os.getpid()} mode {mode}", flush=True)
    if mode == "die":
        print("stand-in runtime: cannot load the model", flush=True)
        sys.exit(1)
    draining = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path == config["readiness_path"]:
                ok = mode != "never-ready" and not draining.is_set()
            elif self.path == config["liveness_path"]:
                ok = not os.path.exists(config.get("hang_file", "/nonexistent"))
            elif self.path == "/metrics":
                ok = True
            else:
                self.send_error(404)
                return
            body = f"frontier_standin_pid {os.getpid()}\n".encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((args.host, args.port), Handler)

    def on_term(*_args: object) -> None:
        if mode == "ignore-term":
            return
        draining.set()
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, on_term)
    server.serve_forever()


if __name__ == "__main__":
    main()
