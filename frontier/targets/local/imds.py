"""An EC2 instance metadata service (IMDSv2) on loopback: what a local host slot asks for its notices.

IMDS cannot run here (169.254.169.254 is the hypervisor's), so the local stack and the tests run
this stand-in, one per host slot, on the slot's own loopback address, and the host agent takes its
URL (``frontier-agent.py interruptions --imds URL``). It answers as AWS documents IMDSv2:

* ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1-21600) → a token;
  every GET below needs it in ``X-aws-ec2-metadata-token`` (401 without a valid, unexpired one,
  400 for a PUT without a valid TTL).
* ``GET /latest/meta-data/instance-id``, ``.../placement/availability-zone``,
  ``.../placement/region``, ``.../instance-type``.
* ``GET /latest/meta-data/spot/instance-action`` → 404 until a spot notice is posted, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": "<UTC ISO, notice + 120 s>"}``.
* ``GET /latest/meta-data/events/recommendations/rebalance`` → 404 until posted, then
  ``{"noticeTime": "<UTC ISO>"}``.

Tests and the demo post notices to the control endpoint (not part of AWS's API, so no token):

* ``POST /control/spot`` ``{"action": "terminate", "in_s": 120}`` (``in_s`` 0-3600: when the
  instance goes, after now); ``POST /control/rebalance`` ``{}``; ``POST /control/clear``;
  ``GET /control/state``.

``python -m frontier.targets.local.imds --address 127.0.2.2 --port 0 --instance-id i-…`` runs
one and prints ``{"url": ...}`` once it listens.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
META = "/latest/meta-data/"
SPOT_ACTION = "spot/instance-action"
REBALANCE = "events/recommendations/rebalance"
MAX_TTL_S = 21600
SPOT_ACTIONS = ("terminate", "stop", "hibernate")
# AWS gives two minutes between a spot interruption notice and the instance's end.
SPOT_NOTICE_S = 120.0
MAX_NOTICE_IN_S = 3600.0


def iso(moment: datetime) -> str:
    """The time format IMDS uses in its notices: UTC, seconds, a ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Instance:
    """What the stand-in says about its one instance, and the notices posted to it."""

    instance_id: str = "i-0123456789abcdef0"
    instance_type: str = "p5.48xlarge"
    availability_zone: str = "us-east-1a"
    spot_action: dict[str, str] | None = None
    rebalance: dict[str, str] | None = None
    tokens: dict[str, float] = field(default_factory=dict)  # token -> monotonic expiry
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def region(self) -> str:
        return self.availability_zone.rstrip("abcdefghijklmnopqrstuvwxyz")

    def metadata(self, path: str) -> str | None:
        """The body IMDS answers for ``path`` under meta-data/, or None (404)."""
        with self.lock:
            answers: dict[str, str | None] = {
                "instance-id": self.instance_id,
                "instance-type": self.instance_type,
                "placement/availability-zone": self.availability_zone,
                "placement/region": self.region,
                SPOT_ACTION: json.dumps(self.spot_action) if self.spot_action else None,
                REBALANCE: json.dumps(self.rebalance) if self.rebalance else None,
            }
        return answers.get(path)

    def post_spot(self, action: str, in_s: float) -> dict[str, str]:
        if action not in SPOT_ACTIONS:
            raise ValueError(f"action is {action!r}; it must be one of {', '.join(SPOT_ACTIONS)}")
        if not 0 <= in_s <= MAX_NOTICE_IN_S:
            raise ValueError(f"in_s is {in_s}; it must be between 0 and {MAX_NOTICE_IN_S:g}")
        notice = {"action": action, "time": iso(datetime.now(UTC) + timedelta(seconds=in_s))}
        with self.lock:
            self.spot_action = notice
        return notice

    def post_rebalance(self) -> dict[str, str]:
        notice = {"noticeTime": iso(datetime.now(UTC))}
        with self.lock:
            self.rebalance = notice
        return notice

    def clear(self) -> None:
        with self.lock:
            self.spot_action = None
            self.rebalance = None

    def issue_token(self, ttl_s: int) -> str:
        token = secrets.token_urlsafe(32)
        with self.lock:
            self.tokens[token] = time.monotonic() + ttl_s
        return token

    def token_valid(self, token: str | None) -> bool:
        with self.lock:
            expiry = self.tokens.get(token or "")
        return expiry is not None and time.monotonic() < expiry


class _Handler(BaseHTTPRequestHandler):
    server: ImdsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: a poller asks every few seconds."""

    def _answer(self, status: int, body: str = "", content_type: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        data = json.loads(raw or b"{}")
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        self._body_discard()
        if self.path != TOKEN_PATH:
            self._answer(404, "Not Found")
            return
        ttl = self.headers.get(TTL_HEADER, "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL_S:
            self._answer(400, f"{TTL_HEADER} must be between 1 and {MAX_TTL_S}")
            return
        self._answer(200, self.server.instance.issue_token(int(ttl)))

    def _body_discard(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        instance = self.server.instance
        if self.path == "/control/state":
            with instance.lock:
                state = {"spot": instance.spot_action, "rebalance": instance.rebalance}
            self._answer(200, json.dumps(state), "application/json")
            return
        if not self.path.startswith(META):
            self._answer(404, "Not Found")
            return
        if not instance.token_valid(self.headers.get(TOKEN_HEADER)):
            self._answer(401, "Unauthorized")
            return
        body = instance.metadata(self.path[len(META) :])
        if body is None:
            self._answer(404, "Not Found")
        else:
            self._answer(200, body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        instance = self.server.instance
        try:
            body = self._body()
            if self.path == "/control/spot":
                notice = instance.post_spot(
                    str(body.get("action", "terminate")), float(body.get("in_s", SPOT_NOTICE_S))
                )
            elif self.path == "/control/rebalance":
                notice = instance.post_rebalance()
            elif self.path == "/control/clear":
                instance.clear()
                notice = {}
            else:
                self._answer(404, "Not Found")
                return
        except (ValueError, TypeError) as exc:
            self._answer(400, json.dumps({"error": str(exc)}), "application/json")
            return
        self._answer(200, json.dumps(notice), "application/json")


class ImdsServer(ThreadingHTTPServer):
    """The stand-in, serving one :class:`Instance` on ``address:port`` (0: any free port)."""

    daemon_threads = True

    def __init__(self, address: str = "127.0.0.1", port: int = 0, instance: Instance | None = None) -> None:
        super().__init__((address, port), _Handler)
        self.instance = instance or Instance()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ImdsServer:
        """Serve in a background thread (tests); :meth:`stop` ends it."""
        self._thread = threading.Thread(target=self.serve_forever, name="imds", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="imds", description=__doc__.split("\n")[0])
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--instance-id", default=Instance.instance_id)
    parser.add_argument("--instance-type", default=Instance.instance_type)
    parser.add_argument("--availability-zone", default=Instance.availability_zone)
    args = parser.parse_args(argv)
    instance = Instance(args.instance_id, args.instance_type, args.availability_zone)
    server = ImdsServer(args.address, args.port, instance)
    print(json.dumps({"url": server.url}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
